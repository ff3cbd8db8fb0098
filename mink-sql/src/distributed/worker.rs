//! `mink worker`'s service: a datafusion-distributed [`Worker`] that runs the stages a
//! coordinator sends it, mink's plan nodes included.
//!
//! Its sessions decode plans with [`EngineCodec`], whose log tails read the bucket
//! leaders over Flight with the worker's own login (no credential travels in a plan);
//! lake files are read from the object store the worker was pointed at, the only store
//! its runtime knows (no `file://` over the machine). A plan that writes (a
//! `DataSinkExec`) is refused: a worker only reads.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext};
use mink_auth::Credentials;
use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use mink_scan::lake_scan::register_lake_store;
use mink_scan::tail::LogSource;

use super::codec::EngineCodec;
use super::network::LoginChannels;
use crate::session::SqlRuntime;
use crate::union::tail::FlightLog;

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
}

/// The worker service (see the module docs); serve it behind the login check.
///
/// # Errors
/// The lake's store could not be opened; the credentials do not fit in a header.
pub fn worker(config: WorkerConfig) -> Result<Worker> {
    let WorkerConfig {
        runtime,
        storage,
        node,
        credentials,
    } = config;
    register_lake_store(runtime.runtime_env(), &storage)?;
    let channels = LoginChannels::new(credentials.as_ref())?;
    let log: Arc<dyn LogSource> = Arc::new(FlightLog { client: node });
    let sessions = move |context: WorkerQueryContext| {
        let (channels, log) = (channels.clone(), Arc::clone(&log));
        async move {
            Ok(context
                .builder
                .with_distributed_channel_resolver(channels)
                .with_distributed_user_codec(EngineCodec::new(log))
                .build())
        }
    };
    let mut worker = Worker::from_session_builder(sessions)
        .with_runtime_env(Arc::clone(runtime.runtime_env()))
        .with_version(env!("CARGO_PKG_VERSION"));
    worker.add_on_plan_hook(refuse_writes);
    Ok(worker)
}

/// `plan`, or a plan of the same shape that fails with a clear error when it writes.
fn refuse_writes(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut writes = false;
    // apply's closure never fails here.
    let _ = plan.apply(|node| {
        writes = node.as_any().is::<DataSinkExec>();
        Ok(match writes {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    match writes {
        true => Arc::new(RefusedExec {
            properties: Arc::clone(plan.properties()),
        }),
        false => plan,
    }
}

/// A stage a worker refused to run: every partition fails.
#[derive(Debug)]
struct RefusedExec {
    properties: Arc<PlanProperties>,
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
        Err(DataFusionError::Plan(
            "a mink worker only reads: this stage writes".into(),
        ))
    }
}
