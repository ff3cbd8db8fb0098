//! Hostile requests to `mink worker` (issue 47): plans whose payloads would make the
//! worker allocate without bound, and a task cache that a client could grow.
//!
//! The real `mink worker` of a real `mink server --sql-workers`, called over its gRPC
//! protocol (datafusion-distributed's `worker.WorkerService`) with messages built here:
//! a plan whose in-memory table is LZ4-compressed Arrow IPC declaring 2^50 bytes (which
//! aborted the worker), a task's execution over 2^40 partitions, and more tasks than a
//! worker holds. Each is refused with a status naming its limit; the worker lives, its
//! memory does not grow, and statements still run on it.

use std::path::Path;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use prost::Message;
use tonic::Code;
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

use mink_sql::distributed::wire::{CoordinatorMessage, ExecuteTask, SetPlan, TaskKey};

use crate::process::{ServerProcess, WorkerProcess, run_mink};

/// An IPC stream of one `a: Int64` batch, LZ4-compressed, its first buffer's declared
/// uncompressed length forged to 2^50 (mink-core's guard tests keep it).
const FORGED_LZ4: &str = include_str!("../../../mink-core/src/ipc_guard/forged_lz4.hex");

/// The most tasks a worker holds (`mink_sql::distributed::limits::MAX_TASKS_HELD`).
const MAX_TASKS_HELD: usize = 4096;

const SET_PLAN: &str = "/worker.WorkerService/CoordinatorChannel";
const EXECUTE_TASK: &str = "/worker.WorkerService/ExecuteTask";
const WORKER_INFO: &str = "/worker.WorkerService/GetWorkerInfo";

/// DataFusion's `PhysicalPlanNode` holding a `MemoryScanExecNode` (field 35) with
/// `partitions` (field 1 of the scan), all a worker reads before anything else of it.
#[derive(Clone, PartialEq, Message)]
struct MemoryScanPlan {
    #[prost(message, optional, tag = "35")]
    memory_scan: Option<MemoryScan>,
}

#[derive(Clone, PartialEq, Message)]
struct MemoryScan {
    #[prost(bytes = "vec", repeated, tag = "1")]
    partitions: Vec<Vec<u8>>,
}

/// An empty message (`GetWorkerInfoRequest`; answers are not read).
#[derive(Clone, PartialEq, Message)]
struct Empty {}

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).expect("ascii"), 16).expect("hex"))
        .collect()
}

/// Task 0 of stage `stage` of query `query`.
fn key(query: u8, stage: u64) -> TaskKey {
    TaskKey {
        query_id: vec![query; 16],
        stage_id: stage,
        task_number: 0,
    }
}

/// Sends the plan `plan` as task `key`: the status the worker answers.
async fn set_plan(channel: &Channel, key: TaskKey, plan: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let message = CoordinatorMessage {
        set_plan: Some(SetPlan {
            task_key: Some(key),
            task_count: 1,
            plan: plan.into(),
        }),
    };
    let request = tonic::Request::new(futures::stream::iter([message]));
    let codec: ProstCodec<CoordinatorMessage, Empty> = ProstCodec::default();
    let path = PathAndQuery::from_static(SET_PLAN);
    match grpc.streaming(request, path, codec).await {
        Ok(_) => tonic::Status::ok("plan set"),
        Err(status) => status,
    }
}

/// Asks for partitions `start..end` of task `key`: the status the worker answers first.
async fn execute(channel: &Channel, key: TaskKey, start: u64, end: u64) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let request = tonic::Request::new(ExecuteTask {
        task_key: Some(key),
        partition_start: start,
        partition_end: end,
    });
    let codec: ProstCodec<ExecuteTask, Empty> = ProstCodec::default();
    let path = PathAndQuery::from_static(EXECUTE_TASK);
    match grpc.server_streaming(request, path, codec).await {
        Ok(_) => tonic::Status::ok("executing"),
        Err(status) => status,
    }
}

/// Whether the worker answers `GetWorkerInfo`.
async fn answers(channel: &Channel) -> bool {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let codec: ProstCodec<Empty, Empty> = ProstCodec::default();
    let path = PathAndQuery::from_static(WORKER_INFO);
    grpc.unary(tonic::Request::new(Empty {}), path, codec)
        .await
        .is_ok()
}

/// The pid of the `mink worker` child of this thread listening on `listen` (process.rs's
/// [`WorkerProcess`] keeps its child to itself).
fn worker_pid(listen: &str) -> u32 {
    let children = std::fs::read_to_string("/proc/thread-self/children").expect("children");
    children
        .split_whitespace()
        .filter_map(|pid| pid.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| line.split(|b| *b == 0).any(|arg| arg == listen.as_bytes()))
        })
        .expect("a mink worker child")
}

/// The resident memory of process `pid`, in KiB; `None` once it is gone.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if status
        .lines()
        .any(|line| line.starts_with("State:") && line.contains("zombie"))
    {
        return None;
    }
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `mink sql --flight-sql` to the server: the CSV printed.
fn sql(server: &ServerProcess, statement: &str) -> String {
    let (ok, stdout, stderr) = run_mink(&[
        "sql",
        "--flight-sql",
        &server.sql_uri(),
        "--format",
        "csv",
        "-e",
        statement,
    ]);
    assert!(ok, "{statement}: {stderr}");
    stdout
}

const COUNT: &str = "SELECT g, count(*) FROM t GROUP BY g ORDER BY g";

/// A free loopback address, for a worker the server is told of before it starts.
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// `mink worker` on `listen` for `server` (data directory `data_dir`), and its pid.
fn start_worker(server: &ServerProcess, data_dir: &Path, listen: &str) -> (WorkerProcess, u32) {
    let data_dir = data_dir.display().to_string();
    let args = [
        "--listen",
        listen,
        "--node",
        &server.addr,
        "--data-dir",
        &data_dir,
    ];
    let worker = WorkerProcess::start(&args, &[]);
    let pid = worker_pid(listen);
    (worker, pid)
}

/// A server running statements on two workers (a stage has at most one task per live
/// worker, and a single task stays on the server), with a tiered table of 4 buckets
/// whose reads go to them: the server and the workers with their pids.
fn cluster(data_dir: &Path) -> (ServerProcess, Vec<(WorkerProcess, u32)>) {
    let addresses = [free_address(), free_address()];
    let server = ServerProcess::start_with(
        data_dir,
        &[
            "--sql-workers",
            &addresses.join(","),
            "--sql-task-rows",
            "1",
        ],
        &[],
    );
    sql(
        &server,
        "CREATE TABLE t (id BIGINT, g BIGINT) \
         WITH ('bucket.num' = '4', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
    );
    let rows: Vec<String> = (0..400).map(|id| format!("({id}, {})", id % 4)).collect();
    sql(
        &server,
        &format!("INSERT INTO t VALUES {}", rows.join(", ")),
    );
    // Reads of buckets nothing was tiered from stay on the server.
    sql(&server, "CALL system.tier('t')");
    let workers = addresses
        .iter()
        .map(|listen| start_worker(&server, data_dir, listen))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sql(&server, &format!("EXPLAIN {COUNT}")).contains("DistributedExec") {
        assert!(Instant::now() < deadline, "the workers never joined");
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, workers)
}

async fn connect(worker: &WorkerProcess) -> Channel {
    Channel::from_shared(format!("http://{}", worker.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_plan_is_refused_and_the_worker_runs_statements_after_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, workers) = cluster(dir.path());
    let (worker, pid) = &workers[0];
    let pid = *pid;
    let counted = "g,count(*)\n0,100\n1,100\n2,100\n3,100\n";
    assert_eq!(sql(&server, COUNT), counted);
    let channel = connect(worker).await;
    let before = rss_kib(pid).expect("running");

    let forged = MemoryScanPlan {
        memory_scan: Some(MemoryScan {
            partitions: vec![hex(FORGED_LZ4)],
        }),
    };
    for attempt in 0..3 {
        let status = set_plan(&channel, key(attempt, 0), forged.encode_to_vec()).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(
            status.message().contains("compressed Arrow IPC"),
            "{status}"
        );
    }
    // A task's execution over 2^40 partitions (the worker allocated a stream for each).
    let status = execute(&channel, key(9, 0), 0, 1 << 40).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    assert!(status.message().contains("at most 1024"), "{status}");
    let status = execute(&channel, key(9, 0), 5, 1).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");

    assert!(answers(&channel).await, "the worker answers");
    let after = rss_kib(pid).expect("the worker lives");
    assert!(
        after < before + 64 * 1024,
        "RSS {before} KiB -> {after} KiB"
    );
    assert_eq!(sql(&server, COUNT), counted);
    assert!(sql(&server, &format!("EXPLAIN {COUNT}")).contains("DistributedExec"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tasks_a_worker_holds_are_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let (worker, pid) = start_worker(&server, dir.path(), "127.0.0.1:0");
    let channel = connect(&worker).await;
    let before = rss_kib(pid).expect("running");

    // Tasks whose plans the worker never runs: each is held for a minute all the same.
    let plan = vec![0xff; 1024];
    let sent = futures::future::join_all((0..8).map(|sender| {
        let (channel, plan) = (channel.clone(), plan.clone());
        async move {
            let mut refused = Vec::new();
            for task in (sender..MAX_TASKS_HELD + 8).step_by(8) {
                let status = set_plan(&channel, key(7, task as u64), plan.clone()).await;
                if status.code() != Code::Ok {
                    refused.push(status);
                }
            }
            refused
        }
    }))
    .await;
    let refused: Vec<_> = sent.into_iter().flatten().collect();
    assert_eq!(refused.len(), 8, "{:?}", refused.first());
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
        assert!(status.message().contains("4096 tasks"), "{status}");
    }
    // A task no plan was held for is not run (nor kept waiting in the worker's cache).
    let status = execute(&channel, key(8, 0), 0, 1).await;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");

    assert!(answers(&channel).await, "the worker answers");
    let after = rss_kib(pid).expect("the worker lives");
    assert!(
        after < before + 256 * 1024,
        "RSS {before} KiB -> {after} KiB"
    );
}
