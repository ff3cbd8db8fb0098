//! Hostile SQL against the real `mink server`: statements that would read or write the
//! server's files are refused under every wrapper, over Flight SQL with the ADBC Python
//! driver and over `mink sql --connect`, and nothing is written; a statement over
//! `--sql-memory-limit` fails alone with RESOURCE_EXHAUSTED while a concurrent one
//! answers. After each, the server still answers `SELECT 1`.

use std::process::Command;

use crate::hostile_statements::over_adbc;
use crate::process::ServerProcess;
use crate::python::python;

#[test]
fn sql_never_reaches_the_server_s_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = tempfile::tempdir().expect("output dir");
    let server = ServerProcess::start(dir.path());
    let target = |name: &str| out.path().join(name);
    let csv = out.path().join("readable.csv");
    std::fs::write(&csv, "a\nsecret\n").expect("csv");
    let statements: Vec<(String, &str)> = vec![
        (
            format!(
                "EXPLAIN ANALYZE COPY (SELECT 'x' AS a) TO '{}' STORED AS CSV",
                target("analyze.csv").display()
            ),
            "COPY",
        ),
        (
            format!(
                "EXPLAIN COPY (SELECT 'x' AS a) TO '{}' STORED AS CSV",
                target("explain.csv").display()
            ),
            "COPY",
        ),
        (
            format!(
                "COPY (WITH x AS (SELECT 'x' AS a) SELECT * FROM x) TO '{}' STORED AS CSV",
                target("cte.csv").display()
            ),
            "COPY",
        ),
        (
            format!(
                "PREPARE:COPY (SELECT 'x' AS a) TO '{}' STORED AS CSV",
                target("prepared.csv").display()
            ),
            "COPY",
        ),
        (
            "CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '/etc'".into(),
            "CREATE EXTERNAL TABLE",
        ),
        (
            format!(
                "CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '{}'",
                csv.display()
            ),
            "CREATE EXTERNAL TABLE",
        ),
        (
            format!(
                "SET datafusion.runtime.temp_directory = '{}'",
                out.path().display()
            ),
            "SET datafusion.runtime",
        ),
        ("SELECT * FROM '/etc/passwd'".into(), "not found"),
        (format!("SELECT * FROM '{}'", csv.display()), "not found"),
        (
            "SELECT 1 WHERE EXISTS (SELECT * FROM '/etc/passwd')".into(),
            "not found",
        ),
    ];
    let sql: Vec<String> = statements.iter().map(|(sql, _)| sql.clone()).collect();
    for (outcome, (sql, names)) in over_adbc(&server, &sql).iter().zip(&statements) {
        let (refused, message) = (outcome.refused, &outcome.message);
        assert!(refused, "ADBC ran {sql}");
        assert!(message.contains(names), "{sql}: {message}");
        assert!(
            !message.contains("root:") && !message.contains("secret"),
            "{message}"
        );
        if *names != "not found" {
            assert!(
                message.contains("INVALID_ARGUMENT") || message.contains("InvalidArgument"),
                "{sql}: {message}"
            );
            assert!(message.contains("files on the server"), "{sql}: {message}");
        }
    }

    // The same through `mink sql --connect` (Flight SQL, the server plans).
    for (sql, names) in &statements {
        let sql = sql.strip_prefix("PREPARE:").unwrap_or(sql);
        let (ok, _, stderr) = crate::process::run_sql(&server.sql_addr, sql);
        assert!(!ok, "mink sql ran {sql}");
        assert!(stderr.contains(names), "{sql}: {stderr}");
    }
    let (ok, stdout, stderr) = crate::process::run_sql(&server.sql_addr, "SELECT 1 AS one");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "one\n1\n");

    for name in ["analyze.csv", "explain.csv", "cte.csv", "prepared.csv"] {
        assert!(!target(name).exists(), "{name} was written");
    }
    let written: Vec<_> = std::fs::read_dir(out.path())
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(written, vec!["readable.csv"], "files written: {written:?}");
}

/// On two connections at once: a statement over the memory limit, and small ones until
/// it has failed; then prints `big <TAB> message` and `small <TAB> answers`.
const MEMORY: &str = r#"
import sys, threading
import adbc_driver_manager
import adbc_driver_flightsql.dbapi as flight_sql

uri, big_sql = sys.argv[1], sys.argv[2]
done = threading.Event()
result = {}

def big():
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cursor:
        try:
            cursor.execute(big_sql)
            result["big"] = "ok " + str(cursor.fetchall())
        except adbc_driver_manager.Error as error:
            result["big"] = str(error).replace("\n", " ")
        finally:
            done.set()

thread = threading.Thread(target=big)
thread.start()
answers = 0
with flight_sql.connect(uri, autocommit=True) as conn:
    while True:
        finished = done.is_set()
        with conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM generate_series(1, 1000) t(i)")
            assert cursor.fetchall()[0][0] == 1000
            answers += 1
        if finished:
            break
thread.join()
print(f"big\t{result['big']}")
print(f"small\t{answers}")
"#;

#[test]
fn a_statement_over_the_memory_limit_fails_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with(dir.path(), &["--sql-memory-limit", "16MiB"], &[]);
    let big = "SELECT array_length(array_agg(i)) FROM generate_series(1, 20000000) t(i)";
    let output = Command::new(python())
        .args(["-c", MEMORY, &server.sql_uri(), big])
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}\t")))
            .unwrap_or_else(|| panic!("no {name} line: {stdout}"))
            .to_string()
    };
    let big_outcome = field("big");
    assert!(
        big_outcome.contains("RESOURCE_EXHAUSTED") || big_outcome.contains("ResourceExhausted"),
        "{big_outcome}"
    );
    assert!(big_outcome.contains("Resources exhausted"), "{big_outcome}");
    let answers: u32 = field("small").parse().expect("a count");
    assert!(answers >= 1, "{stdout}");

    // Over `mink sql --connect` too, and the server goes on.
    let (ok, _, stderr) = crate::process::run_sql(&server.sql_addr, big);
    assert!(!ok);
    assert!(stderr.contains("Resources exhausted"), "{stderr}");
    let (ok, stdout, stderr) = crate::process::run_sql(&server.sql_addr, "SELECT 1 AS one");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "one\n1\n");

    // A bad size is a usage error naming it.
    let (ok, _, stderr) = crate::process::run_mink(&[
        "server",
        "--sql-memory-limit",
        "lots",
        "--data-dir",
        &dir.path().join("unused").display().to_string(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("'lots' is not a size"), "{stderr}");
}

/// Any filter a union read is given is also handed to the lake's Parquet scan for pruning:
/// `IN`, `LIKE`, `OR`, subqueries, volatile functions and an expression that fails on
/// every row each get the right answer or a clear error, and the server answers after.
#[test]
fn odd_filters_on_a_union_read_prune_or_fail_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let run = |sql: &str| crate::process::run_sql(&server.sql_addr, sql);
    for setup in [
        "CREATE TABLE t (id BIGINT NOT NULL, v VARCHAR, n INT, PRIMARY KEY (id)) \
         WITH ('bucket.num' = '2', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
        "INSERT INTO t VALUES (1, 'apple', 5), (2, 'banana', 60), (3, 'avocado', 7)",
        "CALL system.tier('t')",
        "INSERT INTO t VALUES (2, 'apricot', 61), (4, 'cherry', 8)",
    ] {
        let (ok, _, stderr) = run(setup);
        assert!(ok, "{setup}: {stderr}");
    }
    for (sql, expected) in [
        (
            "SELECT count(*) AS c FROM t WHERE v LIKE 'a%' OR id IN (4, 9)",
            "c\n4\n",
        ),
        (
            "SELECT count(*) AS c FROM t WHERE id IN (SELECT id FROM t WHERE n > 6)",
            "c\n3\n",
        ),
        ("SELECT count(*) AS c FROM t WHERE random() < 2.0", "c\n4\n"),
        (
            "SELECT count(*) AS c FROM t WHERE CAST(n AS VARCHAR) = '61'",
            "c\n1\n",
        ),
    ] {
        let (ok, stdout, stderr) = run(sql);
        assert!(ok, "{sql}: {stderr}");
        assert_eq!(stdout, expected, "{sql}");
    }
    let (ok, _, stderr) = run("SELECT count(*) FROM t WHERE 10 / (n - n) > 0");
    assert!(!ok, "a filter failing on every row is an error");
    assert!(stderr.to_lowercase().contains("divide by zero"), "{stderr}");
    let (ok, stdout, stderr) = run("SELECT 1 AS one");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "one\n1\n");
}
