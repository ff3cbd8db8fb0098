//! Statements across several machines, on datafusion-distributed (1.0, the release on
//! DataFusion 53): the server's SQL endpoint plans as it always does and becomes the
//! coordinator of `mink worker` processes, which run the stages of a statement's plan.
//!
//! ```text
//!   coordinator (mink server --sql-workers)         workers (mink worker)
//!     SQL -> logical plan -> physical plan
//!       DistributeWhenShippable: stages         ->    Stage 1 tasks: UnionTasksExec,
//!       DistributedExec (the head stage)        <-      each task a few buckets' union
//!                                                      reads (lake Parquet from the
//!                                                      object store, tails over Flight
//!                                                      from the leaders), shuffles
//!                                                    Stage 2..: DataFusion's operators
//! ```
//!
//! - [`tasks`]: a table's union read cut into tasks by bucket ([`UnionTasksExec`]), and
//!   how many tasks a read is worth ([`UnionTaskEstimator`]).
//! - [`codec`]: how the plan travels ([`EngineCodec`]).
//! - [`rule`]: which statements run distributed ([`DistributeWhenShippable`]).
//! - [`network`]: the live workers and login-carrying channels to them, whose answers of
//!   stage output are checked before they are decoded (`answers`): stages send their
//!   output uncompressed.
//! - [`worker`]: the worker's service, behind a guard that checks every call before
//!   datafusion-distributed decodes it (`guard`, `plan_check`, `held`), within the
//!   bounds of [`limits`]; [`wire`]: the worker protocol's messages it reads.
//!
//! In datafusion-distributed 1.0 tasks go to the live workers at random; the number of
//! tasks of the stage reading a table is its rows over [`Distribution::rows_per_task`],
//! at most one per bucket and one per live worker.

mod answers;
pub mod codec;
mod guard;
mod held;
pub mod limits;
pub mod network;
mod plan_check;
pub mod rule;
pub mod tasks;
pub mod wire;
pub mod worker;

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionState;
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{DistributedConfig, DistributedExt};
use mink_auth::Credentials;
use mink_scan::log_range::LogSource;
use url::Url;

pub use codec::EngineCodec;
pub use network::{LoginChannels, Workers, is_worker_unavailable};
pub use rule::DistributeWhenShippable;
pub use tasks::{UnionTaskEstimator, UnionTasksExec};

/// Rows per task of a table's read when none is configured: a read of fewer rows stays
/// on the coordinator.
pub const DEFAULT_ROWS_PER_TASK: u64 = 1_000_000;

/// The workers a server's statements run on (see the module docs); clones share them.
#[derive(Debug, Clone)]
pub struct Distribution {
    workers: Workers,
    channels: LoginChannels,
    /// Rows of a table's read per task.
    pub rows_per_task: u64,
}

impl Distribution {
    /// Statements distributed over `workers` (`HOST:PORT` each), called with
    /// `credentials`, over TLS checked against `tls_ca` when given (the workers serve
    /// TLS); probing them starts on the current tokio runtime.
    ///
    /// # Errors
    /// An address that is not `HOST:PORT`; credentials that do not fit in a header.
    pub fn new(
        workers: &[String],
        credentials: Option<&Credentials>,
        tls_ca: Option<&[u8]>,
        rows_per_task: u64,
    ) -> Result<Self> {
        // Workers serve TLS when their certificates' authority is given.
        let scheme = match tls_ca {
            Some(_) => "https",
            None => "http",
        };
        let urls = workers
            .iter()
            .map(|address| {
                Url::parse(&format!("{scheme}://{address}")).map_err(|e| {
                    DataFusionError::Configuration(format!("worker address '{address}': {e}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tls = tls_ca.map(|ca| mink_auth::client_tls(Some(ca)));
        let channels = LoginChannels::new(credentials, tls)?;
        Ok(Self {
            workers: Workers::probed(urls, channels.clone()),
            channels,
            rows_per_task,
        })
    }

    /// The workers, up or not.
    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// A session's state whose statements run on the workers when they are worth it;
    /// its tails read with `log` when a plan comes back to it.
    pub(crate) fn session_state(
        &self,
        config: SessionConfig,
        runtime: Arc<RuntimeEnv>,
        log: Arc<dyn LogSource>,
    ) -> SessionState {
        // Stages send their output uncompressed: the workers and the coordinator refuse
        // compressed Arrow IPC in what they read (`answers`). LZ4 would save network
        // bytes at the cost of a compression and a decompression of every batch.
        let mut uncompressed = DistributedConfig::default();
        uncompressed.compression = "none".into();
        SessionStateBuilder::new()
            .with_config(config)
            .with_distributed_option_extension(uncompressed)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_distributed_worker_resolver(self.workers.clone())
            .with_distributed_channel_resolver(self.channels.clone())
            .with_distributed_user_codec(EngineCodec::new(log))
            .with_distributed_task_estimator(UnionTaskEstimator {
                rows_per_task: self.rows_per_task,
            })
            .with_physical_optimizer_rule(Arc::new(DistributeWhenShippable))
            .build()
    }
}

/// Whether a session's statements may run distributed: its union reads are then cut
/// into tasks by bucket.
pub(crate) fn is_distributed(config: &SessionConfig) -> bool {
    config
        .options()
        .extensions
        .get::<DistributedConfig>()
        .is_some()
}
