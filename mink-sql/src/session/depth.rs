//! How deep a statement's expressions are, measured on its tokens before anything parses
//! it ([`check_statement`]).
//!
//! A parser builds `1+1+1` as `(1+1)+1`: a chain of operators becomes a tree as deep as
//! the chain is long, and every later step that walks the tree recursively (planning,
//! optimizing, dropping it) needs stack in proportion. The tokenizer is a loop, so
//! counting on tokens needs no stack at all, and a statement too deep to plan is refused
//! before a tree of it exists.
//!
//! The count is an upper bound of the tree's depth. Brackets (`(`, `[`, `{`) open a
//! group; commas split a group into items. The depth of an item is the number of
//! operators in it plus the depth of its deepest group; the depth of a group is that of
//! its deepest item, plus one for its brackets. Operators are every token that is not
//! a name, a literal or punctuation, the keywords that join two operands (`AND`, `OR`,
//! `LIKE`, `UNION`, `JOIN`, ...), and field accesses and indexes (`a.b`, `a[1]`: a chain
//! of them is as deep as one of operators). Operators of different precedence are counted
//! alike (`c = 0 OR c = 1` counts three where the tree is two deep), and an item runs
//! across clauses (`... WHERE a = 1 GROUP BY b`), so the bound is generous for what
//! clients write by hand or by tool.

use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use super::limits::{MAX_EXPRESSION_DEPTH, MAX_STATEMENT_BYTES};

/// Keywords that join two operands into one expression (or two queries, or two tables).
const OPERATOR_KEYWORDS: [Keyword; 15] = [
    Keyword::AND,
    Keyword::OR,
    Keyword::XOR,
    Keyword::NOT,
    Keyword::IS,
    Keyword::LIKE,
    Keyword::ILIKE,
    Keyword::SIMILAR,
    Keyword::BETWEEN,
    Keyword::AT,
    Keyword::COLLATE,
    Keyword::UNION,
    Keyword::INTERSECT,
    Keyword::EXCEPT,
    Keyword::JOIN,
];

/// Refuses `sql` when its text is longer than [`MAX_STATEMENT_BYTES`] or its
/// expressions are deeper than [`MAX_EXPRESSION_DEPTH`] (see the module docs). SQL that
/// does not tokenize passes: the parser reports it.
///
/// # Errors
/// A plan error saying which bound the statement passes, and by how much.
pub fn check_statement(sql: &str) -> Result<()> {
    if sql.len() > MAX_STATEMENT_BYTES {
        return Err(DataFusionError::Plan(format!(
            "the statement is {} bytes long, over mink's bound of {MAX_STATEMENT_BYTES} \
             bytes of SQL text (load large data with a bulk ingest, not literals)",
            sql.len()
        )));
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(());
    };
    match expression_depth(&tokens) {
        Depth::Within(_) => Ok(()),
        Depth::Over => Err(DataFusionError::Plan(format!(
            "the statement's expressions are nested or chained more than \
             {MAX_EXPRESSION_DEPTH} operators deep (mink's bound, counted on its tokens): \
             write a long list of alternatives as `c IN (v1, v2, ...)` rather than \
             `c = v1 OR c = v2 OR ...`, or split the statement"
        ))),
    }
}

/// The depth of a statement's expressions, or that it is over [`MAX_EXPRESSION_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    Within(usize),
    Over,
}

/// One open group (the statement itself, or a bracketed part of it).
#[derive(Debug, Default)]
struct Group {
    /// Operators in the current item.
    operators: usize,
    /// The depth of the deepest group closed in the current item.
    inner: usize,
    /// The depth of the deepest item finished (at a comma).
    deepest: usize,
}

impl Group {
    fn item_depth(&self) -> usize {
        self.operators + self.inner
    }

    fn next_item(&mut self) {
        self.deepest = self.deepest.max(self.item_depth());
        self.operators = 0;
        self.inner = 0;
    }

    fn depth(&self) -> usize {
        self.deepest.max(self.item_depth())
    }
}

/// Counts the depth of `tokens` with a stack of open groups (see the module docs),
/// stopping as soon as it is over [`MAX_EXPRESSION_DEPTH`].
fn expression_depth(tokens: &[Token]) -> Depth {
    let mut open = vec![Group::default()];
    for token in tokens {
        match token {
            // An index (`a[1]`) applies to the operand before it, as an operator does: a
            // chain of them (`a[1][1][1]`) is a tree as deep as it is long.
            Token::LBracket => {
                open.last_mut()
                    .into_iter()
                    .for_each(|group| group.operators += 1);
                open.push(Group::default());
            }
            Token::LParen | Token::LBrace => open.push(Group::default()),
            Token::RParen | Token::RBracket | Token::RBrace if open.len() > 1 => {
                let closed = open.pop().map_or(0, |group| group.depth() + 1);
                if let Some(group) = open.last_mut() {
                    group.inner = group.inner.max(closed);
                }
            }
            Token::Comma => open.last_mut().into_iter().for_each(Group::next_item),
            token if is_operator(token) => {
                open.last_mut()
                    .into_iter()
                    .for_each(|group| group.operators += 1);
            }
            _ => {}
        }
        let current = open.last().map_or(0, Group::item_depth);
        if open.len() - 1 + current > MAX_EXPRESSION_DEPTH {
            return Depth::Over;
        }
    }
    Depth::Within(open.first().map_or(0, Group::depth))
}

/// Whether `token` joins two operands: not a name, keyword, literal or punctuation, or
/// one of the [`OPERATOR_KEYWORDS`]. A token the list does not know counts as an
/// operator.
fn is_operator(token: &Token) -> bool {
    match token {
        Token::Word(word) => OPERATOR_KEYWORDS.contains(&word.keyword),
        Token::EOF
        | Token::Number(..)
        | Token::Char(_)
        | Token::Placeholder(_)
        | Token::Whitespace(_)
        | Token::Comma
        | Token::Colon
        | Token::SemiColon
        | Token::LParen
        | Token::RParen
        | Token::LBracket
        | Token::RBracket
        | Token::LBrace
        | Token::RBrace => false,
        token => !is_literal(token),
    }
}

fn is_literal(token: &Token) -> bool {
    matches!(
        token,
        Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::QuoteDelimitedStringLiteral(_)
            | Token::NationalQuoteDelimitedStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::limits::STATEMENT_STACK_BYTES;
    use datafusion::prelude::SessionContext;

    fn depth(sql: &str) -> Depth {
        let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize().unwrap();
        expression_depth(&tokens)
    }

    /// `term` repeated `n` times, joined by `joint`.
    fn chain(term: &str, joint: &str, n: usize) -> String {
        vec![term; n].join(joint)
    }

    #[test]
    fn operators_of_a_chain_add_up() {
        assert_eq!(depth("SELECT 1"), Depth::Within(0));
        assert_eq!(depth("SELECT 1 + 2 * 3"), Depth::Within(2));
        assert_eq!(
            depth("SELECT a FROM t WHERE c = 0 OR c = 1"),
            Depth::Within(3)
        );
        assert_eq!(
            depth("SELECT * FROM a JOIN b ON a.x = b.x UNION SELECT 1"),
            Depth::Within(6)
        );
        assert_eq!(depth("SELECT 'a + b', \"x-y\", $1"), Depth::Within(0));
        assert_eq!(depth("SELECT x::int::text"), Depth::Within(2));
    }

    #[test]
    fn commas_split_a_group_and_brackets_nest() {
        assert_eq!(depth("SELECT 1 + 1, 2 + 2 + 2"), Depth::Within(2));
        assert_eq!(depth("SELECT f(1 + 1, 2) + 3"), Depth::Within(3));
        assert_eq!(depth("SELECT ((1 + 1) + 1) + 1"), Depth::Within(5));
        // An index or an array's brackets apply to what they follow: one more each.
        assert_eq!(depth("SELECT [1, [2 + 2]]"), Depth::Within(5));
        // A closing bracket too many is the parser's to report.
        assert_eq!(depth("SELECT 1)) + 1"), Depth::Within(1));
    }

    #[test]
    fn long_lists_are_flat_and_long_chains_deep() {
        let list = format!("SELECT 1 WHERE c IN ({})", chain("7", ", ", 100_000));
        assert_eq!(depth(&list), Depth::Within(1));
        let ors = format!("SELECT 1 WHERE {}", chain("c = 1", " OR ", 1_000));
        assert_eq!(depth(&ors), Depth::Within(1_999));
        let at_bound = format!("SELECT {}", chain("1", "+", MAX_EXPRESSION_DEPTH + 1));
        assert_eq!(depth(&at_bound), Depth::Within(MAX_EXPRESSION_DEPTH));
        let over = format!("SELECT {}", chain("1", "+", MAX_EXPRESSION_DEPTH + 2));
        assert_eq!(depth(&over), Depth::Over);
        let nested = format!(
            "SELECT {}1{}",
            "(".repeat(MAX_EXPRESSION_DEPTH + 1),
            ")".repeat(MAX_EXPRESSION_DEPTH + 1)
        );
        assert_eq!(depth(&nested), Depth::Over);
        // Depth across nesting levels adds up: 64 groups of 64 operators each.
        let mut stacked = String::from("1");
        for _ in 0..64 {
            stacked = format!("({stacked}{})", "+1".repeat(64));
        }
        assert_eq!(depth(&format!("SELECT {stacked}")), Depth::Over);
        // Indexes and field accesses chain as deep as operators do.
        let indexes = format!("SELECT make_array(1){}", "[1]".repeat(10_000));
        assert_eq!(depth(&indexes), Depth::Over);
        let fields = format!("SELECT s{}", ".f".repeat(10_000));
        assert_eq!(depth(&fields), Depth::Over);
    }

    #[test]
    fn statements_over_a_bound_are_refused_with_the_reason() {
        let deep = format!("SELECT {}", chain("1", "+", 10_000));
        let error = check_statement(&deep).unwrap_err().to_string();
        assert!(error.contains("2048 operators deep"), "{error}");
        assert!(error.contains("IN ("), "{error}");
        let long = format!("SELECT '{}'", "x".repeat(MAX_STATEMENT_BYTES));
        let error = check_statement(&long).unwrap_err().to_string();
        assert!(error.contains("bytes of SQL text"), "{error}");
        check_statement("SELECT 1").unwrap();
        check_statement("SELECT 'unterminated").unwrap();
    }

    /// Plans and runs `sql` on a thread of `stack` bytes; its one value.
    fn run_on_stack(sql: String, stack: usize) -> String {
        let run = move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async {
                let batches = SessionContext::new()
                    .sql(&sql)
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let column = batches[0].column(0);
                arrow::util::display::array_value_to_string(column, 0).unwrap()
            })
        };
        let thread = std::thread::Builder::new().stack_size(stack).spawn(run);
        thread.unwrap().join().unwrap()
    }

    /// Statements at the bound plan and run on an eighth of the stack a statement has.
    #[test]
    fn chains_at_the_bound_run_on_an_eighth_of_the_statement_stack() {
        let stack = STATEMENT_STACK_BYTES / 8;
        let sum = format!("SELECT {}", chain("1", "+", MAX_EXPRESSION_DEPTH + 1));
        check_statement(&sum).unwrap();
        assert_eq!(
            run_on_stack(sum, stack),
            (MAX_EXPRESSION_DEPTH + 1).to_string()
        );
        // `count(*)` counts two.
        let alternatives: Vec<String> = (0..MAX_EXPRESSION_DEPTH / 2 - 1)
            .map(|i| format!("c = {i}"))
            .collect();
        let ors = format!(
            "SELECT count(*) FROM (VALUES (1), (2), (5000)) t(c) WHERE {}",
            alternatives.join(" OR ")
        );
        check_statement(&ors).unwrap();
        assert_eq!(run_on_stack(ors, stack), "2");
    }
}
