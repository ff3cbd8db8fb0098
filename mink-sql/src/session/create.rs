//! `CREATE TABLE` with mink's clauses.
//!
//! ```sql
//! CREATE TABLE [IF NOT EXISTS] [db.]t (col TYPE [NOT NULL], ..., PRIMARY KEY (c, ...))
//!   [PARTITIONED BY (c, ...)]
//!   WITH ('bucket.num' = '4', 'lake.enabled' = 'true', ...)
//! ```
//!
//! `PARTITIONED BY` (column names only) and `WITH` (table options) are mink's; the rest is
//! plain SQL that DataFusion plans, so column types map exactly as in queries. The
//! statement is split at the token level (quotes and comments are respected): the two
//! clauses are taken out and the remaining text goes to DataFusion's planner.
//!
//! Column names are taken as users type them: `key` and `index`, where a column definition
//! starts, are column names (see [`column_name`]), as `value` and `timestamp` are:
//!
//! ```sql
//! CREATE TABLE events (key VARCHAR, value VARCHAR, timestamp TIMESTAMP)
//! ```

use std::collections::BTreeMap;

use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Word};

/// A `CREATE TABLE` statement split into what DataFusion plans and mink's clauses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CreateTable {
    /// The statement without mink's clauses.
    pub(crate) standard: String,
    /// `PARTITIONED BY` columns.
    pub(crate) partitioned_by: Vec<String>,
    /// `WITH` options.
    pub(crate) options: BTreeMap<String, String>,
}

/// Whether `sql` is a `CREATE TABLE` statement (it must be split before it can be
/// parsed: standard SQL has no `PARTITIONED BY (name)`).
pub fn is_create_table(sql: &str) -> bool {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return false;
    };
    let mut words = tokens.iter().filter(|t| !is_whitespace(t));
    matches!(
        (words.next(), words.next()),
        (Some(create), Some(table)) if is_keyword(create, Keyword::CREATE) && is_keyword(table, Keyword::TABLE)
    )
}

/// Splits a `CREATE TABLE` statement.
///
/// # Errors
/// A clause that is not `PARTITIONED BY (name, ...)` or `WITH ('key' = 'value', ...)`.
pub(crate) fn split_create_table(sql: &str) -> Result<CreateTable> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| DataFusionError::SQL(Box::new(e.into()), None))?;
    let mut standard = String::new();
    let mut partitioned_by = Vec::new();
    let mut options = BTreeMap::new();
    let mut depth = 0usize;
    let mut columns = ColumnList::Before;
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        if depth == 0 && is_keyword(token, Keyword::PARTITIONED) {
            let by = next_significant(&tokens, i + 1);
            if !by.is_some_and(|b| is_keyword(&tokens[b], Keyword::BY)) {
                return Err(clause_error(
                    "PARTITIONED must be followed by BY (column, ...)",
                ));
            }
            let (items, end) = parenthesized(&tokens, by.unwrap_or(i) + 1)?;
            for item in items {
                match item.as_slice() {
                    [Token::Word(word)] => partitioned_by.push(word.value.clone()),
                    _ => {
                        return Err(clause_error(
                            "PARTITIONED BY takes column names: PARTITIONED BY (c, ...)",
                        ));
                    }
                }
            }
            i = end;
            continue;
        }
        if depth == 0 && is_keyword(token, Keyword::WITH) {
            let (items, end) = parenthesized(&tokens, i + 1)?;
            for item in items {
                let pair = match item.as_slice() {
                    [key, Token::Eq, value] => text_of(key).zip(text_of(value)),
                    _ => None,
                };
                let (key, value) = pair.ok_or_else(|| {
                    clause_error("WITH takes options: WITH ('key' = 'value', ...)")
                })?;
                options.insert(key, value);
            }
            i = end;
            continue;
        }
        let text = match columns {
            ColumnList::ItemStart if !is_whitespace(token) => {
                columns = ColumnList::InItem;
                column_name(token, &tokens[i + 1..])
            }
            _ => token.to_string(),
        };
        match token {
            Token::LParen => {
                if depth == 0 && columns == ColumnList::Before {
                    columns = ColumnList::ItemStart;
                }
                depth += 1;
            }
            Token::RParen => {
                depth = depth.saturating_sub(1);
                if depth == 0 && columns != ColumnList::Before {
                    columns = ColumnList::After;
                }
            }
            Token::Comma if depth == 1 && columns == ColumnList::InItem => {
                columns = ColumnList::ItemStart;
            }
            _ => {}
        }
        standard.push_str(&text);
        i += 1;
    }
    Ok(CreateTable {
        standard: standard.trim().trim_end_matches(';').trim().to_string(),
        partitioned_by,
        options,
    })
}

/// Where [`split_create_table`] is with respect to the column list (the statement's first
/// parenthesized group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnList {
    Before,
    /// Before the first token of a column definition or table constraint.
    ItemStart,
    InItem,
    After,
}

/// The text of `token`, the first of a column definition or table constraint (`rest`
/// follows it).
///
/// sqlparser's generic dialect reads an unquoted `KEY` or `INDEX` there as the start of a
/// MySQL index definition (`KEY [name] (c, ...)`), which mink never takes (DataFusion
/// refuses indexes), so `key VARCHAR` failed with "Expected: a list of columns in
/// parentheses". Followed by a word (a type name, not `USING`) the keyword is the column's
/// name and is written as a quoted identifier, lowercase as DataFusion normalizes an
/// unquoted one. `PRIMARY KEY (c)`, `UNIQUE KEY (c)` and `c BIGINT PRIMARY KEY` do not start
/// with it, and `KEY (c)` stays an index definition, refused by DataFusion as before.
fn column_name(token: &Token, rest: &[Token]) -> String {
    let next = rest.iter().find(|t| !is_whitespace(t));
    match token {
        Token::Word(word)
            if word.quote_style.is_none()
                && matches!(word.keyword, Keyword::KEY | Keyword::INDEX)
                && matches!(next, Some(Token::Word(next)) if next.keyword != Keyword::USING) =>
        {
            Token::Word(Word {
                value: word.value.to_lowercase(),
                quote_style: Some('"'),
                keyword: Keyword::NoKeyword,
            })
            .to_string()
        }
        token => token.to_string(),
    }
}

fn clause_error(message: &str) -> DataFusionError {
    DataFusionError::Plan(format!("CREATE TABLE: {message}"))
}

fn is_keyword(token: &Token, keyword: Keyword) -> bool {
    matches!(token, Token::Word(word) if word.keyword == keyword && word.quote_style.is_none())
}

fn is_whitespace(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

/// The index of the first token from `from` that is not whitespace.
fn next_significant(tokens: &[Token], from: usize) -> Option<usize> {
    (from..tokens.len()).find(|&i| !is_whitespace(&tokens[i]))
}

/// The comma-separated items (whitespace dropped) of the parenthesized list starting at
/// the first significant token from `from`, and the index after its `)`.
fn parenthesized(tokens: &[Token], from: usize) -> Result<(Vec<Vec<Token>>, usize)> {
    let open = next_significant(tokens, from)
        .filter(|&i| tokens[i] == Token::LParen)
        .ok_or_else(|| clause_error("expected '(' after PARTITIONED BY or WITH"))?;
    let mut items = vec![Vec::new()];
    for (i, token) in tokens.iter().enumerate().skip(open + 1) {
        match token {
            Token::RParen => {
                items.retain(|item| !item.is_empty());
                return Ok((items, i + 1));
            }
            Token::Comma => items.push(Vec::new()),
            Token::LParen => return Err(clause_error("nested parentheses in a mink clause")),
            token if is_whitespace(token) => {}
            token => items
                .last_mut()
                .expect("one item at least")
                .push(token.clone()),
        }
    }
    Err(clause_error("unclosed '(' in PARTITIONED BY or WITH"))
}

/// An option key or value: a quoted string, a number or a word.
fn text_of(token: &Token) -> Option<String> {
    match token {
        Token::SingleQuotedString(text) | Token::DoubleQuotedString(text) => Some(text.clone()),
        Token::Number(number, _) => Some(number.clone()),
        Token::Word(word) => Some(word.value.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mink_clauses_are_taken_out() {
        let split = split_create_table(
            "CREATE TABLE IF NOT EXISTS db.t (dt VARCHAR NOT NULL, id BIGINT NOT NULL, v VARCHAR, \
             PRIMARY KEY (dt, id)) PARTITIONED BY (dt) \
             WITH ('bucket.num' = '4', 'lake.enabled' = 'true', \"log.ttl\" = '7d');",
        )
        .unwrap();
        assert_eq!(
            split.standard,
            "CREATE TABLE IF NOT EXISTS db.t (dt VARCHAR NOT NULL, id BIGINT NOT NULL, v VARCHAR, \
             PRIMARY KEY (dt, id))"
        );
        assert_eq!(split.partitioned_by, vec!["dt"]);
        assert_eq!(
            split.options,
            BTreeMap::from([
                ("bucket.num".into(), "4".into()),
                ("lake.enabled".into(), "true".into()),
                ("log.ttl".into(), "7d".into()),
            ])
        );
    }

    #[test]
    fn plain_statements_pass_through() {
        let split =
            split_create_table("create table t (a int, b varchar default 'with (x)')").unwrap();
        assert_eq!(
            split.standard,
            "create table t (a int, b varchar default 'with (x)')"
        );
        assert!(split.partitioned_by.is_empty() && split.options.is_empty());
        let numbers = split_create_table("CREATE TABLE t (a INT) WITH (bucket_num = 3)").unwrap();
        assert_eq!(numbers.options["bucket_num"], "3");
    }

    #[test]
    fn create_table_statements_are_recognized() {
        assert!(is_create_table(
            "  create TABLE t (a INT) PARTITIONED BY (a)"
        ));
        assert!(is_create_table("CREATE\nTABLE t (a INT)"));
        assert!(!is_create_table("CREATE VIEW v AS SELECT 1"));
        assert!(!is_create_table("SELECT 'CREATE TABLE'"));
        assert!(
            !is_create_table("-- CREATE TABLE\nSELECT 1")
                || is_create_table("CREATE TABLE t (a INT)")
        );
    }

    #[test]
    fn key_and_index_are_column_names() {
        for (sql, standard) in [
            (
                "CREATE TABLE events (key VARCHAR, value VARCHAR, timestamp TIMESTAMP)",
                r#"CREATE TABLE events ("key" VARCHAR, value VARCHAR, timestamp TIMESTAMP)"#,
            ),
            (
                "CREATE TABLE t (id BIGINT, KEY VARCHAR(10) NOT NULL, Index INT)",
                r#"CREATE TABLE t (id BIGINT, "key" VARCHAR(10) NOT NULL, "index" INT)"#,
            ),
            (
                "CREATE TABLE t (\n  -- the record key\n  key VARCHAR,\n  id BIGINT PRIMARY KEY)",
                "CREATE TABLE t (\n  -- the record key\n  \"key\" VARCHAR,\n  id BIGINT PRIMARY KEY)",
            ),
        ] {
            assert_eq!(split_create_table(sql).unwrap().standard, standard, "{sql}");
        }
    }

    #[test]
    fn key_elsewhere_is_left_alone() {
        for sql in [
            // Constraints, quoted names, strings, defaults and mink's clauses.
            "CREATE TABLE t (key VARCHAR NOT NULL, PRIMARY KEY (key))",
            "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR UNIQUE KEY)",
            r#"CREATE TABLE t ("key" VARCHAR, "KEY" VARCHAR)"#,
            "CREATE TABLE t (a VARCHAR DEFAULT 'key', b DECIMAL(10, 2))",
            "CREATE TABLE t (a INT, KEY (a))",
            "CREATE TABLE t (a INT, INDEX USING BTREE (a))",
            "CREATE TABLE key_log (a INT)",
        ] {
            let split = split_create_table(sql).unwrap().standard;
            let expected = sql.replacen("CREATE TABLE t (key", r#"CREATE TABLE t ("key""#, 1);
            assert_eq!(split, expected, "{sql}");
        }
        let split = split_create_table(
            "CREATE TABLE t (key VARCHAR) PARTITIONED BY (key) WITH ('bucket.key' = 'key')",
        )
        .unwrap();
        assert_eq!(split.standard, r#"CREATE TABLE t ("key" VARCHAR)"#);
        assert_eq!(split.partitioned_by, vec!["key"]);
        assert_eq!(split.options["bucket.key"], "key");
    }

    /// What DataFusion plans from the split statement: the columns, named as typed.
    #[tokio::test]
    async fn datafusion_plans_key_columns() {
        use datafusion::logical_expr::{DdlStatement, LogicalPlan};
        use datafusion::prelude::SessionContext;

        let context = SessionContext::new();
        // What the split is for (sqlparser 0.61's generic dialect).
        let unsplit = "CREATE TABLE t (key VARCHAR, value VARCHAR)";
        let refused = context.state().create_logical_plan(unsplit).await;
        assert!(refused.is_err(), "{refused:?}");
        for (sql, names) in [
            (
                "CREATE TABLE t (key VARCHAR, value VARCHAR, timestamp TIMESTAMP)",
                vec!["key", "value", "timestamp"],
            ),
            (
                "CREATE TABLE t (KEY BIGINT PRIMARY KEY, index VARCHAR)",
                vec!["key", "index"],
            ),
            (
                "CREATE TABLE t (key VARCHAR NOT NULL, v INT, PRIMARY KEY (key))",
                vec!["key", "v"],
            ),
        ] {
            let standard = split_create_table(sql).unwrap().standard;
            let plan = context.state().create_logical_plan(&standard).await;
            let Ok(LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create))) = plan else {
                panic!("{sql}: {plan:?}");
            };
            let schema = create.input.schema();
            let planned: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            assert_eq!(planned, names, "{sql}");
            assert_eq!(
                create.constraints.is_empty(),
                !sql.contains("PRIMARY"),
                "{sql}"
            );
        }
    }

    #[test]
    fn malformed_clauses_are_errors() {
        for sql in [
            "CREATE TABLE t (a INT) PARTITIONED (a)",
            "CREATE TABLE t (a INT) PARTITIONED BY (a INT)",
            "CREATE TABLE t (a INT) PARTITIONED BY a",
            "CREATE TABLE t (a INT) WITH ('k')",
            "CREATE TABLE t (a INT) WITH ('k' = 'v'",
            "CREATE TABLE t (a INT) WITH ('k' = ('v'))",
        ] {
            let error = split_create_table(sql).expect_err(sql).to_string();
            assert!(error.contains("CREATE TABLE"), "{sql}: {error}");
        }
    }
}
