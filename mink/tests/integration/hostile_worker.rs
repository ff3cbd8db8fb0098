//! Hostile requests to `mink worker` (issue 47): plans whose payloads would make the
//! worker allocate without bound, and a task cache that a client could grow.
//!
//! The real `mink worker` of a real `mink server --sql-workers`, called over its gRPC
//! protocol (datafusion-distributed's `worker.WorkerService`) with messages built here:
//! a plan whose in-memory table is LZ4-compressed Arrow IPC declaring 2^50 bytes (which
//! aborted the worker), a task's execution over 2^40 partitions, and more tasks than a
//! worker holds. Each is refused with a status naming its limit; the worker lives, its
//! memory does not grow, and statements still run on it.
//!
//! A plan also names the workers a stage reads its input from. In process, a statement
//! whose stages two forging "workers" answer (served here on loopback ports: they take
//! probes and plans, and answer every `ExecuteTask` with the forged batch as Arrow Flight
//! data) fails with the reason, and its reader lives: without the check of these answers
//! the process aborted ("memory allocation of 1125899906842624 bytes failed"). A worker
//! reads other workers' stages through the same channels as the coordinator.

use std::path::Path;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use prost::Message;
use tonic::Code;
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

use mink_sql::distributed::wire::{CoordinatorMessage, ExecuteTask, SetPlan, TaskKey};

use crate::distributed::free_port;
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

/// `mink worker` on `listen` for `server` (data directory `data_dir`).
fn start_worker(server: &ServerProcess, data_dir: &Path, listen: &str) -> WorkerProcess {
    let data_dir = data_dir.display().to_string();
    let args = [
        "--listen",
        listen,
        "--node",
        &server.addr,
        "--data-dir",
        &data_dir,
    ];
    WorkerProcess::start(&args, &[])
}

/// A server running statements on two workers (a stage has at most one task per live
/// worker, and a single task stays on the server), with a tiered table of 4 buckets
/// whose reads go to them: the server and the workers.
fn cluster(data_dir: &Path) -> (ServerProcess, Vec<WorkerProcess>) {
    let addresses = [free_port(), free_port()];
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
    let (server, mut workers) = cluster(dir.path());
    let worker = &mut workers[0];
    let counted = "g,count(*)\n0,100\n1,100\n2,100\n3,100\n";
    assert_eq!(sql(&server, COUNT), counted);
    let channel = connect(worker).await;
    let before = worker.rss_kib();

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
    assert!(worker.is_running(), "the worker lives");
    let after = worker.rss_kib();
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
    let mut worker = start_worker(&server, dir.path(), "127.0.0.1:0");
    let channel = connect(&worker).await;
    let before = worker.rss_kib();

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
    assert!(worker.is_running(), "the worker lives");
    let after = worker.rss_kib();
    assert!(
        after < before + 256 * 1024,
        "RSS {before} KiB -> {after} KiB"
    );
}

/// Arrow Flight's `FlightData` as a worker's `ExecuteTask` answers it (`app_metadata`
/// left empty: partition 0).
#[derive(Clone, PartialEq, Message)]
struct FlightMessage {
    #[prost(bytes = "vec", tag = "2")]
    data_header: Vec<u8>,
    #[prost(bytes = "vec", tag = "1000")]
    data_body: Vec<u8>,
}

/// The messages of [`FORGED_LZ4`] as Flight data: its schema, then its batch whose
/// buffer declares 2^50 bytes.
fn forged_flight_data() -> Vec<FlightMessage> {
    let stream = hex(FORGED_LZ4);
    let length = |at: usize| {
        let bytes = stream[at + 4..at + 8].try_into().expect("a length");
        usize::try_from(i32::from_le_bytes(bytes)).expect("positive")
    };
    let schema_end = 8 + length(0);
    let batch_header_end = schema_end + 8 + length(schema_end);
    let end_marker = stream.len() - 8;
    vec![
        FlightMessage {
            data_header: stream[8..schema_end].to_vec(),
            data_body: Vec::new(),
        },
        FlightMessage {
            data_header: stream[schema_end + 8..batch_header_end].to_vec(),
            data_body: stream[batch_header_end..end_marker].to_vec(),
        },
    ]
}

/// What a plan can point a stage's reader at: an address answering as a worker does
/// (probes, plans), whose `ExecuteTask` answers the forged LZ4 batch.
#[derive(Debug, Clone)]
struct ForgingWorker;

impl tonic::server::NamedService for ForgingWorker {
    const NAME: &'static str = "worker.WorkerService";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for ForgingWorker {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let answer = match request.uri().path() {
                EXECUTE_TASK => {
                    let codec: ProstCodec<FlightMessage, ExecuteTask> = ProstCodec::default();
                    let mut grpc = tonic::server::Grpc::new(codec);
                    grpc.server_streaming(Forge, request).await
                }
                SET_PLAN => {
                    let codec: ProstCodec<Empty, CoordinatorMessage> = ProstCodec::default();
                    let mut grpc = tonic::server::Grpc::new(codec);
                    grpc.streaming(Forge, request).await
                }
                _ => {
                    let codec: ProstCodec<Empty, Empty> = ProstCodec::default();
                    let mut grpc = tonic::server::Grpc::new(codec);
                    grpc.unary(Forge, request).await
                }
            };
            Ok(answer)
        })
    }
}

/// [`ForgingWorker`]'s answers: the forged batch for a task, nothing for the rest.
struct Forge;

type Answer<T> = std::future::Ready<Result<tonic::Response<T>, tonic::Status>>;

impl tonic::server::ServerStreamingService<ExecuteTask> for Forge {
    type Response = FlightMessage;
    type ResponseStream =
        futures::stream::Iter<std::vec::IntoIter<Result<FlightMessage, tonic::Status>>>;
    type Future = Answer<Self::ResponseStream>;

    fn call(&mut self, _: tonic::Request<ExecuteTask>) -> Self::Future {
        let messages: Vec<_> = forged_flight_data().into_iter().map(Ok).collect();
        std::future::ready(Ok(tonic::Response::new(futures::stream::iter(messages))))
    }
}

impl tonic::server::StreamingService<CoordinatorMessage> for Forge {
    type Response = Empty;
    type ResponseStream = futures::stream::Empty<Result<Empty, tonic::Status>>;
    type Future = Answer<Self::ResponseStream>;

    fn call(&mut self, _: tonic::Request<tonic::Streaming<CoordinatorMessage>>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(futures::stream::empty())))
    }
}

impl tonic::server::UnaryService<Empty> for Forge {
    type Response = Empty;
    type Future = Answer<Empty>;

    fn call(&mut self, _: tonic::Request<Empty>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(Empty {})))
    }
}

/// A statement whose stages a [`ForgingWorker`] answers: its stage reading the forged
/// batch fails with the reason, and the reader (this process, the coordinator: a worker
/// reads other stages through the same channels) lives on.
#[tokio::test(flavor = "multi_thread")]
async fn a_stage_answered_a_forged_lz4_batch_fails_and_its_reader_lives() {
    use datafusion::physical_plan::collect;
    use mink_lake::storage::LakeStorage;
    use mink_sql::MinkSession;
    use mink_sql::distributed::Distribution;
    use mink_sql::session::{SqlRuntime, memory_pool};

    use crate::sql_reads::query;
    use crate::support::TestNode;

    // Two, so that the read is cut into tasks (one per live worker at most).
    let ((first, first_server), (second, second_server)) = (serve_forging(), serve_forging());
    let node = TestNode::start().await;
    let client = &node.client;
    let storage = LakeStorage::new(
        std::sync::Arc::new(object_store::local::LocalFileSystem::new()),
        "",
    );
    let distribution = Distribution::new(&[first, second], None, None, 1).expect("workers");
    let runtime = SqlRuntime::server(memory_pool(1 << 30), &storage)
        .expect("runtime")
        .with_distribution(distribution.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while distribution.workers().live().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the forging workers never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let session = MinkSession::connect_in(client.clone(), storage, &runtime)
        .await
        .expect("session");
    for statement in [
        "CREATE TABLE forged (id BIGINT NOT NULL, n BIGINT, PRIMARY KEY (id)) \
         WITH ('bucket.num' = '4', 'lake.enabled' = 'true', 'lake.freshness' = '1h')",
        "INSERT INTO forged SELECT value, value % 7 FROM generate_series(0, 399)",
        "CALL system.tier('forged')",
    ] {
        query(&session, statement).await;
    }
    let frame = session
        .sql("SELECT n, count(*) FROM forged GROUP BY n")
        .await
        .expect("plan");
    let (state, logical) = frame.into_parts();
    let plan = state
        .create_physical_plan(&logical)
        .await
        .expect("physical plan");
    let shown = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    assert!(shown.contains("DistributedExec"), "{shown}");
    let error = collect(plan, state.task_ctx())
        .await
        .expect_err("the forged batch was read");
    let error = error.to_string();
    assert!(
        error.contains("compressed Arrow IPC is not accepted"),
        "{error}"
    );
    for server in [first_server, second_server] {
        assert!(!server.is_finished(), "a forging worker stopped");
        server.abort();
    }
}

/// A [`ForgingWorker`] served on a loopback port: its address and its server.
fn serve_forging() -> (
    String,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let incoming =
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().expect("address"))
            .expect("bind");
    let address = incoming.local_addr().expect("address").to_string();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ForgingWorker)
            .serve_with_incoming(incoming),
    );
    (address, server)
}
