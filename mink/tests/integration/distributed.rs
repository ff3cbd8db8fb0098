//! `mink server --sql-workers` with real `mink worker` processes, all with a login:
//! statements run on the workers once they answer (started after the server), agree with
//! a model of the rows written, go on without a worker killed, and a worker's port
//! demands the login and survives bad plans; workers serving TLS. In process: a worker lost under a statement
//! fails it with `UNAVAILABLE` naming the worker, and the next runs on the rest.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use http::uri::PathAndQuery;
use prost::Message;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

use datafusion::physical_plan::{collect, displayable};
use mink_sql::distributed::is_worker_unavailable;
use mink_tpch::sorted_rows;

use crate::pk_support::{Cells, Key, lake_rows, pk_lake_table};
use crate::process::{ServerProcess, WorkerProcess, run_mink_with};
use crate::sql_reads::query;
use crate::support::TestNode;
use crate::workers::TestWorkers;

const USER: &str = "analyst";
const PASSWORD: &str = "s3cret";

/// Keys written; every seventh is updated after the tiering round, every eleventh
/// deleted, and as many new keys again written.
const KEYS: i64 = 600;

/// `mink sql --flight-sql` with the login: the CSV it printed.
fn sql(server: &ServerProcess, statement: &str) -> String {
    let address = server.sql_uri();
    let (ok, stdout, stderr) = run_mink_with(
        &[
            "sql",
            "--flight-sql",
            &address,
            "--user",
            USER,
            "--format",
            "csv",
            "-e",
            statement,
        ],
        &[("MINK_PASSWORD", PASSWORD)],
    );
    assert!(ok, "{statement}: {stderr}");
    stdout
}

/// A free loopback port, for a worker the server is told of before it starts.
pub(crate) fn free_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// Writes a primary-key table of 4 buckets, tiers it, then changes it: answers the
/// model of its rows (id -> v).
fn write_history(server: &ServerProcess) -> BTreeMap<i64, i64> {
    sql(
        server,
        "CREATE TABLE t (id BIGINT NOT NULL, g BIGINT, v BIGINT, PRIMARY KEY (id)) \
         WITH ('bucket.num' = '4', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
    );
    let mut model = BTreeMap::new();
    let values = |keys: std::ops::Range<i64>, model: &mut BTreeMap<i64, i64>| {
        let rows: Vec<String> = keys
            .map(|id| {
                model.insert(id, id * 3);
                format!("({id}, {}, {})", id % 5, id * 3)
            })
            .collect();
        format!("INSERT INTO t VALUES {}", rows.join(", "))
    };
    sql(server, &values(0..KEYS, &mut model));
    sql(server, "CALL system.tier('t')");
    sql(server, "UPDATE t SET v = v + 1 WHERE id % 7 = 0");
    for (id, v) in model.iter_mut() {
        if id % 7 == 0 {
            *v += 1;
        }
    }
    sql(server, "DELETE FROM t WHERE id % 11 = 0");
    model.retain(|id, _| id % 11 != 0);
    sql(server, &values(KEYS..2 * KEYS, &mut model));
    model
}

/// What `SELECT g, count(*), sum(v) ... GROUP BY g ORDER BY g` answers over `model`.
fn groups(model: &BTreeMap<i64, i64>) -> String {
    let mut groups: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (id, v) in model {
        let group = groups.entry(id % 5).or_default();
        group.0 += 1;
        group.1 += v;
    }
    let mut csv = String::from("g,count(*),sum(t.v)\n");
    for (g, (count, sum)) in groups {
        csv.push_str(&format!("{g},{count},{sum}\n"));
    }
    csv
}

const GROUPS: &str = "SELECT g, count(*), sum(v) FROM t GROUP BY g ORDER BY g";
/// A join, so rows cross workers in a shuffle.
const JOIN: &str = "SELECT count(*) AS pairs FROM t a JOIN t b ON a.id = b.id + 1";

fn pairs(model: &BTreeMap<i64, i64>) -> String {
    let pairs = model
        .keys()
        .filter(|id| model.contains_key(&(*id - 1)))
        .count();
    format!("pairs\n{pairs}\n")
}

/// A `mink worker` on `listen` for `server` (whose data directory is `data_dir`), with
/// the login.
fn logged_in_worker(server: &ServerProcess, data_dir: &Path, listen: &str) -> WorkerProcess {
    let data_dir = data_dir.display().to_string();
    WorkerProcess::start(
        &[
            "--listen",
            listen,
            "--node",
            &server.addr,
            "--data-dir",
            &data_dir,
            "--user",
            USER,
        ],
        &[("MINK_PASSWORD", PASSWORD)],
    )
}

/// Whether the server plans `statement` over workers.
fn runs_distributed(server: &ServerProcess, statement: &str) -> bool {
    sql(server, &format!("EXPLAIN {statement}")).contains("DistributedExec")
}

#[test]
fn statements_run_on_workers_started_later_and_go_on_without_a_killed_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ports = [free_port(), free_port()];
    let workers_flag = ports.join(",");
    let server = ServerProcess::start_with(
        dir.path(),
        &["--sql-workers", &workers_flag, "--sql-task-rows", "1"],
        &[("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)],
    );
    let model = write_history(&server);
    // No worker is up: the server runs every statement itself.
    assert!(!runs_distributed(&server, GROUPS));
    assert_eq!(sql(&server, GROUPS), groups(&model));

    let first = logged_in_worker(&server, dir.path(), &ports[0]);
    let second = logged_in_worker(&server, dir.path(), &ports[1]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runs_distributed(&server, GROUPS) {
        assert!(Instant::now() < deadline, "the workers never joined");
        std::thread::sleep(Duration::from_millis(200));
    }
    let plan = sql(&server, &format!("EXPLAIN {GROUPS}"));
    assert!(
        plan.contains("UnionTasksExec: table=default.t, tasks=[t0:"),
        "{plan}"
    );
    assert_eq!(sql(&server, GROUPS), groups(&model));
    assert!(runs_distributed(&server, JOIN));
    assert_eq!(sql(&server, JOIN), pairs(&model));

    // Point queries stay on the server.
    assert!(!runs_distributed(&server, "SELECT v FROM t WHERE id = 7"));

    first.kill();
    // Within a probe or two the dead worker is left out; statements go on.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sql(&server, GROUPS), groups(&model));
    assert_eq!(sql(&server, JOIN), pairs(&model));
    drop(second);
    std::thread::sleep(Duration::from_secs(3));
    assert!(!runs_distributed(&server, GROUPS));
    assert_eq!(sql(&server, GROUPS), groups(&model));
}

/// A file of the tests' TLS material (`mink/tests/tls`: a CA, and a certificate for
/// 127.0.0.1 it signed).
fn tls_file(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn statements_run_on_workers_serving_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ports = [free_port(), free_port()];
    let ca = tls_file("ca.pem");
    let server = ServerProcess::start_with(
        dir.path(),
        &[
            "--sql-workers",
            &ports.join(","),
            "--sql-task-rows",
            "1",
            "--sql-workers-tls-ca",
            &ca,
        ],
        &[("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)],
    );
    let model = write_history(&server);
    let data_dir = dir.path().display().to_string();
    // The node is reached in plain gRPC (its scheme says so), other workers over TLS.
    let node = format!("http://{}", server.addr);
    let (certificate, key) = (tls_file("server.pem"), tls_file("server.key"));
    let _workers = ports.map(|port| {
        WorkerProcess::start(
            &[
                "--listen",
                &port,
                "--node",
                &node,
                "--data-dir",
                &data_dir,
                "--user",
                USER,
                "--tls-cert",
                &certificate,
                "--tls-key",
                &key,
                "--tls-ca",
                &ca,
            ],
            &[("MINK_PASSWORD", PASSWORD)],
        )
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runs_distributed(&server, GROUPS) {
        assert!(Instant::now() < deadline, "the TLS workers never joined");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(sql(&server, GROUPS), groups(&model));
    assert_eq!(sql(&server, JOIN), pairs(&model));
}

#[test]
fn a_worker_refuses_tls_files_it_cannot_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with(
        dir.path(),
        &[],
        &[("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)],
    );
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let garbage = garbage.display().to_string();
    let missing = dir.path().join("missing.pem").display().to_string();
    for (certificate, key, says) in [
        (missing.as_str(), garbage.as_str(), "reading"),
        (garbage.as_str(), garbage.as_str(), "the worker's TLS"),
    ] {
        let (ok, _, stderr) = run_mink_with(
            &[
                "worker",
                "--listen",
                "127.0.0.1:0",
                "--node",
                &server.addr,
                "--user",
                USER,
                "--tls-cert",
                certificate,
                "--tls-key",
                key,
            ],
            &[("MINK_PASSWORD", PASSWORD)],
        );
        assert!(!ok, "a worker started with {certificate}");
        assert!(
            stderr.contains(says) && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
}

#[test]
fn a_worker_without_login_listens_on_loopback_only() {
    let (ok, _, stderr) = run_mink_with(
        &["worker", "--listen", "0.0.0.0:0", "--node", "127.0.0.1:1"],
        &[],
    );
    assert!(!ok);
    assert!(stderr.contains("loopback"), "{stderr}");
}

/// `CoordinatorToWorkerMsg { set_plan_request = 1 }` of datafusion-distributed's worker
/// protocol, written here as a hostile client would.
#[derive(Clone, PartialEq, Message)]
struct CoordinatorMessage {
    #[prost(message, optional, tag = "1")]
    set_plan: Option<SetPlan>,
}

#[derive(Clone, PartialEq, Message)]
struct SetPlan {
    #[prost(message, optional, tag = "1")]
    task_key: Option<TaskKey>,
    #[prost(uint64, tag = "2")]
    task_count: u64,
    #[prost(bytes = "vec", tag = "3")]
    plan: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct TaskKey {
    #[prost(bytes = "vec", tag = "1")]
    query_id: Vec<u8>,
    #[prost(uint64, tag = "2")]
    stage_id: u64,
    #[prost(uint64, tag = "3")]
    task_number: u64,
}

#[derive(Clone, PartialEq, Message)]
struct Empty {}

#[derive(Clone, PartialEq, Message)]
struct WorkerInfo {
    #[prost(string, tag = "1")]
    version: String,
}

/// A raw call to a worker's `GetWorkerInfo`, with `authorization` when given.
async fn worker_info(
    channel: Channel,
    authorization: Option<&str>,
) -> Result<String, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let request = match authorization {
        Some(authorization) => with_login(Empty {}, authorization),
        None => tonic::Request::new(Empty {}),
    };
    let path = PathAndQuery::from_static("/worker.WorkerService/GetWorkerInfo");
    let codec: ProstCodec<Empty, WorkerInfo> = ProstCodec::default();
    let answer = grpc.unary(request, path, codec).await?;
    Ok(answer.into_inner().version)
}

/// `ExecuteTaskRequest` of datafusion-distributed's worker protocol: all partitions of
/// the task of `task_key`.
#[derive(Clone, PartialEq, Message)]
struct ExecuteTask {
    #[prost(message, optional, tag = "1")]
    task_key: Option<TaskKey>,
    #[prost(uint64, tag = "2")]
    partition_start: u64,
    #[prost(uint64, tag = "3")]
    partition_end: u64,
}

/// A request of `message` with the login `authorization`.
fn with_login<M>(message: M, authorization: &str) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    let value: MetadataValue<_> = authorization.parse().expect("header");
    request.metadata_mut().insert("authorization", value);
    request
}

/// The status a worker's stream of answers ends with: `Ok` when they end without error
/// (they are not read: every message decodes as [`Empty`]).
async fn ended(
    answer: Result<tonic::Response<tonic::Streaming<Empty>>, tonic::Status>,
) -> tonic::Status {
    let mut stream = match answer {
        Ok(answer) => answer.into_inner(),
        Err(status) => return status,
    };
    loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => return tonic::Status::ok("the stream ended"),
            Err(status) => return status,
        }
    }
}

/// The status of running the plan of `bytes` as task `key` on a worker: the plan set
/// through the coordinator channel (where a worker keeps a plan's decoding error for the
/// task's execution), then the task executed.
async fn run_plan(
    channel: &Channel,
    authorization: &str,
    key: TaskKey,
    bytes: Vec<u8>,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let set = CoordinatorMessage {
        set_plan: Some(SetPlan {
            task_key: Some(key.clone()),
            task_count: 1,
            plan: bytes,
        }),
    };
    let request = with_login(futures::stream::iter([set]), authorization);
    let path = PathAndQuery::from_static("/worker.WorkerService/CoordinatorChannel");
    let status = ended(grpc.streaming(request, path, ProstCodec::default()).await).await;
    if status.code() != Code::Ok {
        return status;
    }
    grpc.ready().await.expect("ready");
    let execute = ExecuteTask {
        task_key: Some(key),
        partition_start: 0,
        partition_end: 1,
    };
    let request = with_login(execute, authorization);
    let path = PathAndQuery::from_static("/worker.WorkerService/ExecuteTask");
    ended(
        grpc.server_streaming(request, path, ProstCodec::default())
            .await,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_port_demands_the_login_and_survives_bad_plans() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with(
        dir.path(),
        &[],
        &[("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)],
    );
    let worker = logged_in_worker(&server, dir.path(), "127.0.0.1:0");
    let channel = Channel::from_shared(format!("http://{}", worker.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let basic = format!("Basic {}", base64_of(&format!("{USER}:{PASSWORD}")));
    let status = worker_info(channel.clone(), None)
        .await
        .expect_err("no login");
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    let status = worker_info(
        channel.clone(),
        Some(&format!("Basic {}", base64_of("analyst:wrong"))),
    )
    .await
    .expect_err("wrong password");
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    worker_info(channel.clone(), Some(&basic))
        .await
        .expect("with the login");

    for (query, bytes) in [
        vec![0xff; 64],
        Vec::new(),
        // A plan node nesting far deeper than any plan.
        std::iter::repeat_n([0x0a_u8, 0x80, 0x01], 200)
            .flatten()
            .collect(),
    ]
    .into_iter()
    .enumerate()
    {
        let key = TaskKey {
            query_id: vec![query as u8; 16],
            stage_id: 1,
            task_number: 0,
        };
        let status = run_plan(&channel, &basic, key, bytes).await;
        assert_ne!(status.code(), Code::Ok, "{status}");
        worker_info(channel.clone(), Some(&basic))
            .await
            .expect("the worker still answers");
    }
}

/// Standard base64, padded.
fn base64_of(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A worker that stops after a statement is planned and before its stages are sent: the
/// statement fails naming it, and the next statement runs on the other worker at once
/// (before any probe notices).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_under_a_statement_is_named_and_left_out() {
    let node = TestNode::start().await;
    let client = &node.client;
    let table = client
        .create_table(&pk_lake_table("lost", 4), false)
        .await
        .expect("create");
    let rows: Vec<(Key, Cells)> = (0..400)
        .map(|id| {
            (
                ("2024-01-01".into(), id, 0),
                (Some("v".into()), Some(id % 7)),
            )
        })
        .collect();
    client
        .write(&table, &lake_rows(&table, &rows))
        .await
        .expect("write");
    client.tier(&table.path).await.expect("tier");
    let mut workers = TestWorkers::start(2, client).await;
    let session = workers.session(client, 1).await;
    let groups = "SELECT n, count(*) AS c FROM test.lost GROUP BY n ORDER BY n";
    let want: Vec<String> = (0..7)
        .map(|n| {
            format!(
                "{n} | {}",
                rows.iter().filter(|(_, (_, m))| *m == Some(n)).count()
            )
        })
        .collect();

    let frame = session.sql(groups).await.expect("plan");
    let (state, logical) = frame.into_parts();
    let plan = state
        .create_physical_plan(&logical)
        .await
        .expect("physical plan");
    assert!(
        displayable(plan.as_ref())
            .indent(true)
            .to_string()
            .contains("DistributedExec"),
        "the statement runs on the workers"
    );
    workers.stop(0).await;
    let lost = &workers.addrs[0];
    let error = collect(plan, state.task_ctx())
        .await
        .expect_err("a task of the stopped worker");
    assert!(is_worker_unavailable(&error), "{error}");
    assert!(
        error.to_string().contains(lost.as_str()),
        "{lost} named: {error}"
    );

    // The next statement runs on the other worker.
    let answer = query(&session, groups).await;
    assert_eq!(sorted_rows(&answer).expect("rows"), want);
}
