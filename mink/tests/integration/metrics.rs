//! The metrics port (`--metrics-listen`) of the real `mink server`, scraped by a real
//! Prometheus (Debian's `prometheus`, started here on a free loopback port), checked by
//! Prometheus' own parser (`promtool check metrics`), its status page loaded in headless
//! Chromium (`tests/python/status_page.py`, selenium and Debian's chromium), and the logs
//! of `--log-format json`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::process::{ServerProcess, WorkerProcess, run_sql};
use crate::python::python;

const USER: &str = "watcher";
const PASSWORD: &str = "metr1cs-pw";

/// A Prometheus server scraping one target every second, on a free loopback port.
struct Prometheus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn scraping(target: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: mink\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let address = free_loopback_address();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus (Debian's prometheus package; scripts/test.sh installs it)");
        let prometheus = Self {
            child,
            address,
            _dir: dir,
        };
        eventually("Prometheus to be ready", || {
            http_get(&format!("http://{}/-/ready", prometheus.address), None)
                .is_some_and(|(status, _)| status == 200)
        });
        prometheus
    }

    /// The value of the instant query `query`'s first series, if it has one.
    fn value(&self, query: &str) -> Option<f64> {
        let url = format!("http://{}/api/v1/query", self.address);
        let answer = reqwest::blocking::Client::new()
            .get(url)
            .query(&[("query", query)])
            .send()
            .ok()?
            .json::<Value>()
            .ok()?;
        let value = answer["data"]["result"].get(0)?["value"][1].as_str()?;
        value.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_loopback_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// `(status, body)` of a GET, with basic credentials when given; `None` when the server
/// cannot be reached.
fn http_get(url: &str, login: Option<(&str, &str)>) -> Option<(u16, String)> {
    let mut request = reqwest::blocking::Client::new().get(url);
    if let Some((user, password)) = login {
        request = request.basic_auth(user, Some(password));
    }
    let response = request.send().ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().ok()?))
}

/// Waits up to 60 s for `done`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn sql(server: &ServerProcess, statement: &str) -> String {
    let (ok, stdout, stderr) = run_sql(&server.addr, statement);
    assert!(ok, "{statement}: {stderr}");
    stdout
}

#[test]
fn prometheus_sees_writes_and_lake_lag_move_with_writes_and_tiering_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"], &[]);
    let metrics = server.metrics_addr.clone().expect("the metrics port");
    let prometheus = Prometheus::scraping(&metrics);
    // Rounds only when asked: the lag stays until the test tiers.
    sql(
        &server,
        "CREATE TABLE ops.events (id BIGINT, v VARCHAR) \
         WITH ('bucket.num' = '2', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
    );
    // Through the server's Flight SQL endpoint: its statements are counted there.
    let flight_sql = server.sql_uri();
    for insert in [
        "INSERT INTO ops.events VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        "INSERT INTO ops.events VALUES (4, 'd'), (5, 'e')",
    ] {
        let (ok, _, stderr) = run_sql(&flight_sql, insert);
        assert!(ok, "{insert}: {stderr}");
    }

    let written = || prometheus.value("mink_write_rows_total{table=\"ops.events\"}");
    eventually("Prometheus to see 5 rows written", || {
        written() == Some(5.0)
    });
    let lag = || prometheus.value("sum(mink_bucket_lake_lag_offsets{table=\"ops.events\"})");
    eventually("a lake lag of 5 rows", || lag() == Some(5.0));
    let lag_seconds = prometheus
        .value("max(mink_bucket_lake_lag_seconds{table=\"ops.events\"})")
        .expect("lag in seconds");
    assert!(
        lag_seconds > 0.0,
        "the oldest untiered row has an age: {lag_seconds}"
    );
    let freshness = sql(
        &server,
        "SELECT sum(lag_offsets), max(lag_seconds) > 0 FROM system.freshness \
         WHERE table_name = 'ops.events'",
    );
    assert!(
        freshness.contains("5,true"),
        "system.freshness: {freshness}"
    );

    sql(&server, "CALL system.tier('ops.events')");
    eventually("the lake lag to go to 0 after a round", || {
        lag() == Some(0.0)
    });
    let tiered = || prometheus.value("mink_tiering_rounds_total{outcome=\"tiered\"}");
    eventually("a tiered round counted", || tiered() >= Some(1.0));
    let rows = prometheus.value("mink_tiered_rows_total{table=\"ops.events\"}");
    assert_eq!(rows, Some(5.0), "rows tiered");
    assert_eq!(
        prometheus.value("max(mink_bucket_lake_lag_seconds{table=\"ops.events\"})"),
        Some(0.0)
    );
    let inserts =
        || prometheus.value("sum(mink_sql_statements_total{kind=\"update\",outcome=\"ok\"})");
    eventually("the two INSERTs counted", || inserts() == Some(2.0));

    // What Prometheus scraped also passes its own linter.
    let (status, text) = http_get(&format!("http://{metrics}/metrics"), None).expect("scrape");
    assert_eq!(status, 200);
    promtool_check(&text);
}

/// `promtool check metrics` accepts `text` (its parser and its lint of names, units
/// and help).
fn promtool_check(text: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    (promtool.stdin.take().expect("stdin"))
        .write_all(text.as_bytes())
        .expect("write metrics");
    let output = promtool.wait_with_output().expect("promtool");
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The value of the series `series` (name and labels, as the text writes them) in a
/// scrape's text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

#[test]
fn a_log_store_s_wal_puts_and_uploads_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = crate::support::file_store_url(&dir.path().join("store"));
    let data_dir = dir.path().join("data");
    let server = ServerProcess::start_with(
        &data_dir,
        &["--log-store", &store, "--metrics-listen", "127.0.0.1:0"],
        &[],
    );
    sql(&server, "CREATE TABLE ops.stored (id BIGINT)");
    sql(&server, "INSERT INTO ops.stored VALUES (1), (2), (3)");
    let url = format!(
        "http://{}/metrics",
        server.metrics_addr.as_ref().expect("port")
    );
    let (_, text) = http_get(&url, None).expect("scrape");
    let puts = sample(&text, "mink_log_store_wal_puts_total{outcome=\"ok\"}");
    assert!(puts >= Some(1.0), "WAL PUTs: {puts:?}\n{text}");
    let bytes = sample(&text, "mink_log_store_wal_put_bytes_total");
    assert!(bytes > Some(0.0), "WAL bytes: {bytes:?}");
    assert!(
        text.contains("mink_log_store_wal_put_seconds_count"),
        "{text}"
    );
}

/// A server over `data_dir` with a login and a metrics port.
fn server_with_login(data_dir: &Path) -> ServerProcess {
    ServerProcess::start_with(
        data_dir,
        &["--sql-user", USER, "--metrics-listen", "127.0.0.1:0"],
        &[("MINK_SQL_PASSWORD", PASSWORD)],
    )
}

#[test]
fn with_a_login_an_unauthenticated_scrape_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = server_with_login(dir.path());
    let port = server.metrics_addr.as_ref().expect("port");
    // Every path of the port wants the login: the metrics, the status page, its figures.
    for path in ["metrics", "", "status.json"] {
        let url = format!("http://{port}/{path}");
        for wrong in [None, Some((USER, "guess")), Some(("root", PASSWORD))] {
            let (status, _) = http_get(&url, wrong).expect("an answer");
            assert_eq!(status, 401, "/{path} with {wrong:?}");
        }
        let (status, _) = http_get(&url, Some((USER, PASSWORD))).expect("an answer");
        assert_eq!(status, 200, "/{path} with the login");
    }
    let (_, text) =
        http_get(&format!("http://{port}/metrics"), Some((USER, PASSWORD))).expect("scrape");
    // The refused requests were served on connections of their own; each wrong password
    // (a request without a login is none) is a refused login.
    let connections = sample(&text, "mink_connections_total{port=\"metrics\"}");
    assert!(connections >= Some(13.0), "connections: {connections:?}");
    let refused = sample(&text, "mink_logins_refused_total");
    assert_eq!(refused, Some(6.0), "refused logins");
}

#[test]
fn hostile_requests_to_the_metrics_port_get_clear_refusals_and_it_still_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = server_with_login(dir.path());
    let port = server.metrics_addr.as_ref().expect("port");
    let client = reqwest::blocking::Client::new();
    let status_of = |path: &str, authorization: &str| {
        let response = client
            .get(format!("http://{port}{path}"))
            .header("authorization", authorization)
            .send();
        response.map(|r| r.status().as_u16()).ok()
    };
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{USER}:{PASSWORD}")
        )
    );
    // A `since` that is no integer, or past i64: refused, not a panic.
    for query in ["?since=abc", "?since=99999999999999999999999", "?since="] {
        let status = status_of(&format!("/status.json{query}"), &basic);
        assert_eq!(status, Some(400), "{query}");
    }
    // Credentials that are not base64, another scheme, a user without a password.
    for authorization in ["Basic !!!", "Bearer token", "Basic d2F0Y2hlcg=="] {
        assert_eq!(
            status_of("/metrics", authorization),
            Some(401),
            "{authorization}"
        );
    }
    assert_eq!(status_of("/nowhere", &basic), Some(404));
    // Headers past hyper's bound: the request is refused (431) or the connection closed.
    let huge = format!("Basic {}", "A".repeat(1 << 20));
    let status = status_of("/metrics", &huge);
    assert!(matches!(status, None | Some(431)), "{status:?}");
    assert_eq!(
        status_of("/metrics", &basic),
        Some(200),
        "the port still answers"
    );
}

#[test]
fn a_worker_serves_its_metrics_and_no_status_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(dir.path());
    let data_dir = dir.path().display().to_string();
    let worker = WorkerProcess::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--node",
            &server.addr,
            "--data-dir",
            &data_dir,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let metrics = worker
        .metrics_addr
        .as_ref()
        .expect("the worker's metrics port");
    let (status, text) = http_get(&format!("http://{metrics}/metrics"), None).expect("scrape");
    assert_eq!(status, 200);
    assert!(text.contains("process_resident_memory_bytes"), "{text}");
    promtool_check(&text);
    let (status, _) = http_get(&format!("http://{metrics}/"), None).expect("an answer");
    assert_eq!(status, 404, "a worker has no status page");
}

#[test]
fn the_status_page_shows_the_tables_and_a_lag_chart_and_updates_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"], &[]);
    sql(
        &server,
        "CREATE TABLE ops.page (id BIGINT) WITH ('lake.enabled' = 'true', 'lake.freshness' = '1h')",
    );
    sql(&server, "INSERT INTO ops.page VALUES (1), (2), (3)");
    let url = format!("http://{}/", server.metrics_addr.as_ref().expect("port"));
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let output = Command::new(python())
        .arg(format!(
            "{}/tests/python/status_page.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(&url)
        .arg(&screenshot)
        .output()
        .expect("run status_page.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "status_page.py: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(seen["tables"], serde_json::json!(["ops.page"]), "{seen}");
    assert!(seen["polylines"].as_u64() >= Some(1), "{seen}");
    assert_eq!(seen["updated_changed"], true, "{seen}");
    assert_eq!(seen["console"], serde_json::json!([]), "{seen}");
    assert!(
        screenshot.exists(),
        "a screenshot at {}",
        screenshot.display()
    );
    // The page asks only for the samples after the last it has.
    let status = |query: &str| -> Value {
        let (_, body) = http_get(&format!("{url}status.json{query}"), None).expect("status");
        serde_json::from_str(&body).expect("JSON")
    };
    let history = status("")["history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let last = history.last().expect("a sample")["at"]
        .as_i64()
        .expect("its time");
    let newer = status(&format!("?since={last}"));
    assert_eq!(
        newer["history"],
        serde_json::json!([]),
        "none after the last"
    );
    assert_eq!(newer["tables"][0]["name"], "ops.page", "{newer}");
}

#[test]
fn json_logs_are_one_object_a_line_and_dependencies_keep_their_routine_quiet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mink"))
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--sql-listen",
            "127.0.0.1:0",
        ])
        .args(["--log-format", "json", "--data-dir"])
        .arg(dir.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mink server");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("first line");
    let address = line
        .trim()
        .strip_prefix("mink node listening on ")
        .expect(&line);
    let (ok, _, stderr) = run_sql(
        address,
        "CREATE TABLE ops.logged (id BIGINT) WITH ('bucket.num' = '2')",
    );
    assert!(ok, "{stderr}");
    let _ = child.kill();
    let output = child.wait_with_output().expect("wait");
    let logs = String::from_utf8_lossy(&output.stderr);
    let events: Vec<Value> = (logs.lines())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["message"] == "created table" && e["table"] == "ops.logged"),
        "{logs}"
    );
    for event in &events {
        assert!(
            event["level"].is_string() && event["timestamp"].is_string(),
            "{event}"
        );
        let target = event["target"].as_str().unwrap_or("");
        assert!(
            !target.starts_with("lsm_tree"),
            "a dependency's routine at INFO: {event}"
        );
    }
}
