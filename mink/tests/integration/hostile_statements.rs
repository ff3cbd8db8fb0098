//! One SQL statement must not stop the server: against the real `mink server` over
//! Flight SQL (the ADBC Python driver), statements whose functions ask for results of
//! gigabytes or terabytes (`repeat`, `array_repeat`, `range`, `regexp_replace`, ...) are
//! refused with RESOURCE_EXHAUSTED, their `EXPLAIN` answered, and the server's memory does
//! not grow; operator chains deeper than mink's bound are refused with INVALID_ARGUMENT, while a
//! 1 000-term `OR` list and a 100 000-literal `IN` list are answered. After each
//! statement the server answers `SELECT 1`, and it is running at the end.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::process::ServerProcess;
use crate::python::python;

/// What a statement got: refused or not, and the first value of its answer or the
/// error's message.
pub(crate) struct Outcome {
    pub(crate) refused: bool,
    pub(crate) message: String,
}

/// Runs `statements` over ADBC (`tests/python/hostile_statements.py`; `PREPARE:<sql>` as a
/// prepared statement), having checked that the server answered `SELECT 1` after each.
pub(crate) fn over_adbc(server: &ServerProcess, statements: &[String]) -> Vec<Outcome> {
    let mut child = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/hostile_statements.py"
        ))
        .arg(server.sql_uri())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    let mut stdin = child.stdin.take().expect("stdin");
    for sql in statements {
        writeln!(stdin, "{sql}").expect("write a statement");
    }
    drop(stdin);
    let output = child.wait_with_output().expect("python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), statements.len(), "{stdout}");
    lines
        .iter()
        .map(|line| {
            let mut fields = line.splitn(3, '\t');
            let refused = fields.next() == Some("error");
            assert_eq!(fields.next(), Some("1"), "SELECT 1 after: {line}");
            let message = fields.next().unwrap_or_default().to_string();
            Outcome { refused, message }
        })
        .collect()
}

/// Statements that aborted DataFusion 53 with one allocation of gigabytes or terabytes,
/// and the function each names.
const SIZED_BY_AN_ARGUMENT: [(&str, &str); 9] = [
    ("SELECT array_repeat(1, 100000000000)", "array_repeat"),
    ("SELECT range(100000000000)", "range"),
    ("SELECT generate_series(1, 100000000000)", "generate_series"),
    (
        "SELECT length(repeat(arrow_cast('x', 'LargeUtf8'), 1099511627776))",
        "repeat",
    ),
    (
        "SELECT max(length(repeat(v, 2000000000))) FROM (VALUES ('a'), ('b'), ('c'), ('d')) t(v)",
        "repeat",
    ),
    (
        "SELECT array_resize(make_array(1), 100000000000)",
        "array_resize",
    ),
    ("SELECT length(lpad('x', 2147483647))", "lpad"),
    (
        "SELECT length(replace(repeat('x', 9000), 'x', repeat('y', 9000)))",
        "replace",
    ),
    (
        "SELECT length(regexp_replace(repeat('x', 300000), '', repeat('y', 300000), 'g'))",
        "regexp_replace",
    ),
];

#[test]
fn results_sized_by_an_argument_are_refused_and_the_server_lives() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = ServerProcess::start(dir.path());
    let warm = over_adbc(&server, &["SELECT repeat('ab', 3)".to_string()]);
    assert_eq!(warm[0].message, "ababab");
    let before = server.rss_kib();
    let statements: Vec<String> = SIZED_BY_AN_ARGUMENT
        .iter()
        .flat_map(|(sql, _)| [sql.to_string(), format!("EXPLAIN {sql}")])
        .collect();
    let outcomes = over_adbc(&server, &statements);
    for (pair, (sql, function)) in outcomes.chunks(2).zip(SIZED_BY_AN_ARGUMENT) {
        let (run, explained) = (&pair[0], &pair[1]);
        assert!(run.refused, "{sql} answered {}", run.message);
        assert!(
            run.message.contains("RESOURCE_EXHAUSTED") || run.message.contains("ResourceExhausted"),
            "{sql}: {}",
            run.message
        );
        assert!(
            run.message.contains(&format!("{function}() would produce")),
            "{sql}: {}",
            run.message
        );
        // Explained, the call is left unfolded: nothing runs.
        assert!(!explained.refused, "EXPLAIN {sql}: {}", explained.message);
    }
    assert!(server.is_running());
    let grown = server.rss_kib().saturating_sub(before);
    assert!(grown < 128 << 10, "RSS grew by {grown} KiB");
    let after = over_adbc(
        &server,
        &["SELECT length(repeat('x', 1000000))".to_string()],
    );
    assert_eq!(after[0].message, "1000000");
}

/// `term` `n` times, joined by `joint`.
fn chain(n: usize, term: impl Fn(usize) -> String, joint: &str) -> String {
    (0..n).map(term).collect::<Vec<_>>().join(joint)
}

#[test]
fn deep_chains_are_refused_and_long_lists_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = ServerProcess::start(dir.path());
    let rows = "FROM (VALUES (1), (999), (5000), (100001)) t(c)";
    let statements = [
        format!("SELECT {}", chain(10_000, |_| "1".into(), "+")),
        format!("SELECT {}", chain(100_000, |_| "1".into(), "+")),
        format!(
            "SELECT count(*) {rows} WHERE {}",
            chain(10_000, |i| format!("c = {i}"), " OR ")
        ),
        format!(
            "SELECT count(*) {rows} WHERE {}",
            chain(1_000, |i| format!("c = {i}"), " OR ")
        ),
        format!(
            "SELECT count(*) {rows} WHERE c IN ({})",
            chain(100_000, |i| i.to_string(), ", ")
        ),
    ];
    let outcomes = over_adbc(&server, &statements);
    for (outcome, sql) in outcomes[..3].iter().zip(&statements) {
        let head = &sql[..60];
        assert!(outcome.refused, "{head}... answered");
        assert!(
            outcome.message.contains("INVALID_ARGUMENT")
                || outcome.message.contains("InvalidArgument"),
            "{head}: {}",
            outcome.message
        );
        assert!(
            outcome.message.contains("2048 operators deep"),
            "{head}: {}",
            outcome.message
        );
    }
    assert_eq!(outcomes[3].message, "2", "the 1 000-term OR list");
    assert_eq!(outcomes[4].message, "3", "the 100 000-literal IN list");
    assert!(server.is_running());
}
