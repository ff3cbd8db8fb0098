//! `mink worker`'s service: a datafusion-distributed [`Worker`] that runs the stages a
//! coordinator sends it, mink's plan nodes included.
//!
//! Its sessions decode plans with [`EngineCodec`], whose log ranges read the bucket
//! leaders over Flight with the worker's own login (no credential travels in a plan);
//! lake files are read from the object store the worker was pointed at, the only store
//! its runtime knows (no `file://` over the machine). A plan that writes (a
//! `DataSinkExec`), or whose nodes have more than [`MAX_PARTITIONS`] partitions or build
//! batches of more than [`MAX_BATCH_ROWS`] rows, is refused: a worker only reads.
//!
//! [`serve`] puts the guard of [`super::guard`] between the login check and the
//! service: every call's message is read and checked before datafusion-distributed
//! decodes it, and the tasks it holds are bounded ([`super::limits`]).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{FunctionRegistry, TaskContext};
#[expect(
    deprecated,
    reason = "DataFusion 53 still decodes CoalesceBatchesExec from a plan"
)]
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext};
use mink_auth::{Auth, Credentials, TlsIdentity, client_tls, server_tls};
use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use mink_scan::lake_scan::register_lake_store;
use mink_scan::log_range::LogSource;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;

use super::codec::EngineCodec;
use super::guard::CallGuard;
use super::held::HeldTasks;
pub use super::limits::MAX_PLAN_BYTES;
use super::limits::{
    MAX_BATCH_ROWS, MAX_FRAME_BYTES, MAX_HEADER_LIST_BYTES, MAX_PARTITIONS,
    MAX_REQUESTS_PER_CONNECTION, MAX_STREAMS_PER_CONNECTION,
};
use super::network::LoginChannels;
use crate::session::SqlRuntime;
use crate::session::functions::sized_functions;
use crate::union::log_range::FlightLog;

/// What a worker runs plans with.
#[derive(Debug)]
pub struct WorkerConfig {
    /// Its runtime: the memory pool of every task, the lake's store.
    pub runtime: SqlRuntime,
    /// The lake its plans' Parquet scans read.
    pub storage: LakeStorage,
    /// The node whose logs its tails read, logged in as the worker.
    pub node: MinkClient,
    /// The login of its calls to other workers (the one they demand).
    pub credentials: Option<Credentials>,
    /// Its port's TLS, and the authority other workers' certificates are checked
    /// against (the system's roots without one): a cluster's workers all serve TLS or
    /// none does.
    pub tls: Option<(TlsIdentity, Option<Vec<u8>>)>,
}

/// The worker service (see the module docs); [`serve`] serves it behind the login check.
///
/// # Errors
/// The lake's store could not be opened; the credentials do not fit in a header.
pub fn worker(config: WorkerConfig) -> Result<Worker> {
    let WorkerConfig {
        runtime,
        storage,
        node,
        credentials,
        tls,
    } = config;
    register_lake_store(runtime.runtime_env(), &storage)?;
    let to_workers = tls.map(|(_, ca)| client_tls(ca.as_deref()));
    let channels = LoginChannels::new(credentials.as_ref(), to_workers)?;
    let log: Arc<dyn LogSource> = Arc::new(FlightLog { client: node });
    let sessions = move |context: WorkerQueryContext| {
        let (channels, log) = (channels.clone(), Arc::clone(&log));
        async move {
            let mut state = context
                .builder
                .with_distributed_channel_resolver(channels)
                .with_distributed_user_codec(EngineCodec::new(log))
                .build();
            // The functions a plan names are looked up here: sized ones refuse results
            // over the bound, as in the server's sessions.
            for function in sized_functions(&state) {
                state.register_udf(Arc::new(function))?;
            }
            Ok(state)
        }
    };
    let mut worker = Worker::from_session_builder(sessions)
        .with_runtime_env(Arc::clone(runtime.runtime_env()))
        .with_version(env!("CARGO_PKG_VERSION"));
    worker.add_on_plan_hook(refuse_unrunnable);
    Ok(worker)
}

/// Serves the worker of `config` on `listener` (over TLS when `config` has it) until
/// `shutdown` completes: every call must carry `config`'s login (any call is accepted
/// without one, so the address must then be a loopback one), at most `max_connections`
/// connections at once.
///
/// # Errors
/// [`worker`]'s; the address is not a loopback one and there is no login.
pub fn serve(
    config: WorkerConfig,
    listener: TcpListener,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = Result<()>>> {
    let addr = listener.local_addr()?;
    mink_auth::check_listen("the worker", addr, config.credentials.as_ref())
        .map_err(|e| DataFusionError::Configuration(e.to_string()))?;
    let auth = Arc::new(Auth::new(config.credentials.clone()));
    let mut server = mink_auth::server_builder()
        .max_frame_size(MAX_FRAME_BYTES)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(MAX_REQUESTS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES);
    if let Some((identity, _)) = &config.tls {
        server = server
            .tls_config(server_tls(identity))
            .map_err(|e| DataFusionError::Configuration(format!("the worker's TLS: {e}")))?;
    }
    let service = worker(config)?
        .into_worker_server()
        .max_decoding_message_size(MAX_PLAN_BYTES);
    let service = CallGuard::new(service, HeldTasks::default());
    let service = InterceptedService::new(service, move |request| auth.check(request));
    let incoming = mink_auth::limit_connections(
        mink_auth::Port::Worker,
        TcpListenerStream::new(listener),
        max_connections,
        mink_auth::GRPC_FIRST_BYTES,
    );
    let serving = server
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown);
    Ok(async move {
        serving
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    })
}

/// `plan`, or a plan of the same shape that fails with a clear error when a worker must
/// not run it: it writes, or a node has more than [`MAX_PARTITIONS`] partitions (a node
/// allocates per partition when it runs).
fn refuse_unrunnable(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut refusal = None;
    // apply's closure never fails here.
    let _ = plan.apply(|node| {
        refusal = refusal_of(node.as_ref());
        Ok(match refusal {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    });
    match refusal {
        Some(reason) => Arc::new(RefusedExec {
            properties: Arc::clone(plan.properties()),
            reason,
        }),
        None => plan,
    }
}

/// Why a worker must not run `node`, if it must not.
fn refusal_of(node: &dyn ExecutionPlan) -> Option<String> {
    let partitions = node.properties().partitioning.partition_count();
    let batch_rows = batch_rows(node).unwrap_or(0);
    if node.as_any().is::<DataSinkExec>() {
        Some("a mink worker only reads: this stage writes".into())
    } else if u64::try_from(partitions).map_or(true, |count| count > MAX_PARTITIONS) {
        Some(format!(
            "{} has {partitions} partitions: a worker runs at most {MAX_PARTITIONS}",
            node.name()
        ))
    } else if u64::try_from(batch_rows).map_or(true, |rows| rows > MAX_BATCH_ROWS) {
        Some(format!(
            "{} makes batches of {batch_rows} rows: a worker makes at most {MAX_BATCH_ROWS}",
            node.name()
        ))
    } else {
        None
    }
}

/// The rows of the batches `node` builds, whose buffers it allocates up front, when a
/// plan sets them.
fn batch_rows(node: &dyn ExecutionPlan) -> Option<usize> {
    let any = node.as_any();
    #[expect(
        deprecated,
        reason = "DataFusion 53 still decodes CoalesceBatchesExec from a plan"
    )]
    let coalesced = any
        .downcast_ref::<CoalesceBatchesExec>()
        .map(CoalesceBatchesExec::target_batch_size);
    coalesced.or_else(|| any.downcast_ref::<FilterExec>().map(FilterExec::batch_size))
}

/// A stage a worker refused to run: every partition fails.
#[derive(Debug)]
struct RefusedExec {
    properties: Arc<PlanProperties>,
    /// Why, in each partition's error.
    reason: String,
}

impl DisplayAs for RefusedExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RefusedExec")
    }
}

impl ExecutionPlan for RefusedExec {
    fn name(&self) -> &str {
        "RefusedExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Plan(self.reason.clone()))
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::physical_plan::Partitioning;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::prelude::SessionContext;

    use super::*;

    #[tokio::test]
    async fn plans_that_write_are_refused_and_reads_kept() {
        let context = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let table = MemTable::try_new(schema, vec![vec![]]).expect("table");
        context
            .register_table("m", Arc::new(table))
            .expect("register");
        let plan = |sql: &'static str| {
            let context = context.clone();
            async move {
                let frame = context.sql(sql).await.expect("plans");
                frame.create_physical_plan().await.expect("physical plan")
            }
        };

        let read = plan("SELECT x FROM m").await;
        assert!(Arc::ptr_eq(&refuse_unrunnable(Arc::clone(&read)), &read));

        let refused = refuse_unrunnable(plan("INSERT INTO m VALUES (1)").await);
        assert_eq!(refused.name(), "RefusedExec");
        let error = refused
            .execute(0, context.task_ctx())
            .err()
            .expect("refused");
        assert!(error.to_string().contains("only reads"), "{error}");
    }

    #[test]
    fn plans_with_more_partitions_or_larger_batches_than_a_worker_runs_are_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let partitions = |count: u64| -> Arc<dyn ExecutionPlan> {
            let input = Arc::new(EmptyExec::new(Arc::clone(&schema)));
            let spread = Partitioning::RoundRobinBatch(count as usize);
            Arc::new(RepartitionExec::try_new(input, spread).expect("repartition"))
        };
        let kept = partitions(MAX_PARTITIONS);
        assert!(Arc::ptr_eq(&refuse_unrunnable(Arc::clone(&kept)), &kept));

        let refused = refuse_unrunnable(partitions(MAX_PARTITIONS + 1));
        assert_eq!(refused.name(), "RefusedExec");
        let error = refused
            .execute(0, SessionContext::new().task_ctx())
            .err()
            .expect("refused");
        assert!(error.to_string().contains("at most 1024"), "{error}");

        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::clone(&schema)));
        let predicate = datafusion::physical_expr::expressions::lit(true);
        let filter = |rows: u64| -> Arc<dyn ExecutionPlan> {
            let filter = FilterExec::try_new(Arc::clone(&predicate), Arc::clone(&input))
                .and_then(|filter| filter.with_batch_size(rows as usize))
                .expect("filter");
            Arc::new(filter)
        };
        let kept = filter(MAX_BATCH_ROWS);
        assert!(Arc::ptr_eq(&refuse_unrunnable(Arc::clone(&kept)), &kept));
        let refused = refuse_unrunnable(filter(u64::from(u32::MAX)));
        assert_eq!(refused.name(), "RefusedExec");
    }
}
