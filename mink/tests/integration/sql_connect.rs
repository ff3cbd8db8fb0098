//! `mink sql --connect ADDRESS` against the real `mink server`: the Flight SQL endpoint
//! and the node's own endpoint both answer, told apart by one probe; a scheme or a login
//! skips the probe; an address where nothing (or nothing mink) answers fails promptly,
//! naming the address.

use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use crate::process::ServerProcess;

/// Longer than any answer `mink sql` may take here (its probe gives up after 10 s): a
/// command still running then has hung.
const HANG: Duration = Duration::from_secs(60);

/// Runs `mink sql ARGS` with extra environment variables: `(success, stdout, stderr)`.
/// Panics if it has not ended within [`HANG`].
fn mink_sql(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mink"));
    command
        .arg("sql")
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("MINK_SQL_PASSWORD")
        .envs(env.iter().copied());
    let (sender, receiver) = mpsc::channel::<std::io::Result<Output>>();
    std::thread::spawn(move || sender.send(command.output()));
    let output = receiver
        .recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("mink sql {args:?} still running after {HANG:?}"))
        .expect("run mink sql");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `-e` for each statement, after `args`, CSV out.
fn with_statements<'a>(args: &[&'a str], statements: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend(["--format", "csv"]);
    for statement in statements {
        all.extend(["-e", statement]);
    }
    all
}

#[test]
fn the_sql_port_is_spoken_to_in_flight_sql_and_the_node_port_natively() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = tempfile::tempdir().expect("output dir");
    let server = ServerProcess::start(dir.path());
    let over = |address: &str, statements: &[&str]| {
        mink_sql(&with_statements(&["--connect", address], statements), &[])
    };

    // DDL, INSERT and SELECT through the Flight SQL endpoint.
    let (ok, stdout, stderr) = over(
        &server.sql_addr,
        &[
            "CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR)",
            "INSERT INTO t VALUES (1, 'one'), (2, 'two')",
            "SELECT id, name FROM t ORDER BY id",
        ],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "count\n2\nid,name\n1,one\n2,two\n");

    // It went over Flight SQL: the server refuses what would touch its files, and a
    // lake warehouse (which only a client-side session reads) is a usage error.
    let copied = out.path().join("flight_sql.csv");
    let copy = format!("COPY (SELECT id FROM t) TO '{}'", copied.display());
    let (ok, _, stderr) = over(&server.sql_addr, &[&copy]);
    assert!(!ok);
    assert!(stderr.contains("not served over Flight SQL"), "{stderr}");
    assert!(!copied.exists());
    let (ok, stdout, stderr) = mink_sql(
        &[
            "--connect",
            &server.sql_addr,
            "--lake-warehouse",
            "s3://bucket/warehouse",
            "-e",
            "SELECT 1",
        ],
        &[],
    );
    assert!(!ok && stdout.is_empty());
    assert!(
        stderr.contains("--lake-warehouse")
            && stderr.contains(&server.sql_addr)
            && stderr.contains("Flight SQL endpoint")
            && stderr.contains("reads its own lake"),
        "{stderr}"
    );

    // The node's address is still spoken to natively: the session plans in this process,
    // so it writes a local file with COPY, and it takes a lake warehouse.
    let copied = out.path().join("native.csv");
    let copy = format!(
        "COPY (SELECT id FROM t ORDER BY id) TO '{}'",
        copied.display()
    );
    let (ok, stdout, stderr) = over(
        &server.addr,
        &[
            "INSERT INTO t VALUES (3, 'three')",
            &copy,
            "SELECT count(*) AS n FROM t",
        ],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "count\n1\ncount\n3\nn\n3\n");
    assert_eq!(
        std::fs::read_to_string(&copied).expect("copied file"),
        "id\n1\n2\n3\n"
    );
    let (ok, stdout, stderr) = mink_sql(
        &with_statements(
            &[
                "--connect",
                &server.addr,
                "--lake-warehouse",
                "s3://bucket/warehouse",
            ],
            &["SELECT name FROM t WHERE id = 3"],
        ),
        &[("AWS_REGION", "us-east-1")],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "name\nthree\n");

    // A grpc:// address is Flight SQL without a probe, and sees the native write.
    let grpc = format!("grpc://{}", server.sql_addr);
    let (ok, stdout, stderr) = over(&grpc, &["SELECT name FROM t ORDER BY id"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "name\none\ntwo\nthree\n");
    let (ok, _, stderr) = over(&grpc, &["SELECT * FROM missing"]);
    assert!(!ok);
    assert!(
        stderr.contains("table 'mink.default.missing' not found"),
        "{stderr}"
    );

    // --flight-sql stays, as an alias that never probes.
    let (ok, stdout, stderr) = mink_sql(
        &with_statements(
            &["--flight-sql", &server.sql_addr],
            &["SELECT max(id) AS m FROM t"],
        ),
        &[],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "m\n3\n");
}

#[test]
fn an_address_that_does_not_answer_fails_promptly_naming_it() {
    // Nothing listens: the connection is refused.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").to_string()
    };
    let (ok, stdout, stderr) = mink_sql(&["--connect", &closed, "-e", "SELECT 1"], &[]);
    assert!(!ok && stdout.is_empty());
    assert!(
        stderr.contains(&format!("error: {closed}: cannot connect")),
        "{stderr}"
    );
    assert!(stderr.contains("refused"), "{stderr}");

    // Something accepts connections and never answers: the probe gives up.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = silent.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            held.push(stream);
        }
    });
    let (ok, _, stderr) = mink_sql(&["--connect", &address, "-e", "SELECT 1"], &[]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("error: {address}: no answer within 10 s")),
        "{stderr}"
    );

    // --user and --tls-ca go with an address.
    let (ok, _, stderr) = mink_sql(&["--user", "analyst", "-e", "SELECT 1"], &[]);
    assert!(!ok);
    assert!(stderr.contains("--connect"), "{stderr}");
}

#[test]
fn a_server_with_a_login_asks_for_user() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with_env(
        dir.path(),
        &[
            ("MINK_SQL_USER", "analyst"),
            ("MINK_SQL_PASSWORD", "s3cret"),
        ],
    );

    let (ok, stdout, stderr) = mink_sql(&["--connect", &server.sql_addr, "-e", "SELECT 1"], &[]);
    assert!(!ok && stdout.is_empty());
    assert!(
        stderr.contains(&server.sql_addr)
            && stderr.contains("requires a login")
            && stderr.contains("pass --user"),
        "{stderr}"
    );

    let login = ["--connect", server.sql_addr.as_str(), "--user", "analyst"];
    let (ok, stdout, stderr) = mink_sql(
        &with_statements(
            &login,
            &[
                "CREATE TABLE kv (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id))",
                "INSERT INTO kv VALUES (1, 'a'), (2, 'b')",
                "UPDATE kv SET v = 'B' WHERE id = 2",
                "SELECT id, v FROM kv ORDER BY id",
            ],
        ),
        &[("MINK_SQL_PASSWORD", "s3cret")],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.ends_with("id,v\n1,a\n2,B\n"), "{stdout}");

    let (ok, _, stderr) = mink_sql(
        &with_statements(&login, &["SELECT 1"]),
        &[("MINK_SQL_PASSWORD", "wrong")],
    );
    assert!(!ok);
    assert!(stderr.contains("wrong user or password"), "{stderr}");
    let (ok, _, stderr) = mink_sql(&with_statements(&login, &["SELECT 1"]), &[]);
    assert!(!ok);
    assert!(stderr.contains("MINK_SQL_PASSWORD"), "{stderr}");

    // The node's own address takes the same login (one login for every port).
    let (ok, stdout, stderr) = mink_sql(
        &with_statements(
            &["--connect", &server.addr, "--user", "analyst"],
            &["SELECT count(*) AS n FROM kv"],
        ),
        &[("MINK_SQL_PASSWORD", "s3cret")],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "n\n2\n");
    let (ok, _, stderr) = mink_sql(
        &with_statements(&["--connect", &server.addr], &["SELECT 1"]),
        &[],
    );
    assert!(!ok);
    assert!(stderr.contains("requires a login"), "{stderr}");
}
