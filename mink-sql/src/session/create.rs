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

use std::collections::BTreeMap;

use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

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
        match token {
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            _ => {}
        }
        standard.push_str(&token.to_string());
        i += 1;
    }
    Ok(CreateTable {
        standard: standard.trim().trim_end_matches(';').trim().to_string(),
        partitioned_by,
        options,
    })
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
