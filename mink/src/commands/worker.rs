//! `mink worker`: a datafusion-distributed worker that runs the stages of statements a
//! `mink server --sql-workers` coordinator sends it (`docs/scaling.md`), until Ctrl-C or
//! SIGTERM.
//!
//! Its first line on stdout is `mink worker listening on HOST:PORT`. The port is as
//! dangerous as a shell: with `--user` (password in MINK_PASSWORD) every call must carry
//! that login, the one of every port of the server, and the worker logs in with it to the
//! node whose logs it reads and to the other workers; without it the worker listens on
//! a loopback address only. With `--tls-cert`/`--tls-key` the port serves TLS and the
//! worker calls other workers over TLS. Its tasks share one memory pool of
//! `--memory-limit`; it reads lake files from `--lake-warehouse` and nothing else of the
//! machine, and refuses plans that write. Every call is read and checked before
//! datafusion-distributed decodes it, and the tasks it holds are bounded
//! (`mink_sql::distributed::limits`, `docs/security.md`).

use std::path::PathBuf;

use mink_client::{ConnectOptions, MinkClient};
use mink_lake::LakeConfig;
use mink_sql::distributed::worker::{WorkerConfig, serve};
use mink_sql::session::{SqlRuntime, default_memory_limit, memory_pool, parse_size};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::commands::metrics_port::{self, MetricsOptions, Sources};
use crate::commands::server::{tls_identity, wait_for_shutdown_signal};
use crate::commands::sql::warehouse_storage;
use crate::embedded::{DEFAULT_DATA_DIR, LoginArgs};
use crate::error::CliError;

/// Arguments of `mink worker`.
#[derive(Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// Address the worker serves coordinators and other workers on. Without `--user` it
    /// must be a loopback address.
    #[arg(long)]
    listen: String,
    /// The node whose logs the worker's tasks read (its `--listen` address).
    #[arg(long, default_value = "127.0.0.1:9123")]
    node: String,
    /// The lake's warehouse, as the server's `--lake-warehouse` (`s3://bucket/prefix`,
    /// or the same absolute path); default: the lake of `--data-dir`.
    #[arg(long)]
    lake_warehouse: Option<String>,
    /// The data directory whose lake is read when no `--lake-warehouse` is given.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    #[command(flatten)]
    login: LoginArgs,
    /// A PEM certificate (chain): serve the worker's port over TLS (with `--tls-key`),
    /// and call other workers over TLS, their certificates checked against `--tls-ca`.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The memory all the worker's tasks together may use: bytes or a size (512MiB,
    /// 2GiB). A task that needs more fails alone. Default: half the machine's memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_limit: Option<usize>,
    /// The most connections the worker holds open at once.
    #[arg(
        long,
        value_name = "N",
        default_value_t = mink_auth::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    max_connections: usize,
    /// Serve Prometheus metrics (`/metrics`) on this address (off by default;
    /// `docs/operations.md`), with the worker's login as HTTP basic auth and its TLS.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<String>,
}

pub(crate) async fn run(args: WorkerArgs) -> Result<(), CliError> {
    let credentials = args.login.credentials()?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(CliError::io(format!("cannot listen on {}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(CliError::io(format!("cannot listen on {}", args.listen)))?;
    mink_auth::check_listen("the worker", addr, credentials.as_ref())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let warehouse = match &args.lake_warehouse {
        Some(warehouse) => warehouse.clone(),
        None => {
            LakeConfig::chosen(&args.data_dir, None, None)
                .map_err(|e| CliError::Usage(e.to_string()))?
                .warehouse
        }
    };
    let storage = warehouse_storage(&warehouse)?;
    let memory_limit = args.memory_limit.unwrap_or_else(default_memory_limit);
    let runtime = SqlRuntime::server(memory_pool(memory_limit), &storage)
        .map_err(|e| CliError::Usage(format!("the worker's runtime: {e}")))?;
    let node_login = ConnectOptions {
        credentials: credentials.clone(),
        tls_ca: args.login.tls_ca()?,
        ..ConnectOptions::default()
    };
    let authenticated = credentials.is_some();
    let metrics = match &args.metrics_listen {
        Some(listen) => {
            let options = MetricsOptions {
                credentials: credentials.clone(),
                tls: tls_identity(args.tls_cert.as_deref(), args.tls_key.as_deref())?,
                max_connections: args.max_connections,
            };
            Some(metrics_port::serve(listen, options, Sources::default()).await?)
        }
        None => None,
    };
    let tls = tls_identity(args.tls_cert.as_deref(), args.tls_key.as_deref())?
        .map(|identity| (identity, node_login.tls_ca.clone()));
    let config = WorkerConfig {
        runtime,
        storage,
        node: MinkClient::connect_with(&args.node, &node_login).await?,
        credentials,
        tls,
    };
    let serving = serve(
        config,
        listener,
        args.max_connections,
        wait_for_shutdown_signal(),
    )
    .map_err(|e| CliError::Usage(format!("the worker: {e}")))?;
    let metrics_line = metrics
        .as_ref()
        .map(|m| format!("mink metrics listening on {}\n", m.addr()))
        .unwrap_or_default();
    print!("mink worker listening on {addr}\n{metrics_line}");
    match authenticated {
        true => {
            info!(%addr, node = %args.node, memory_limit, "serving as a worker; callers authenticate")
        }
        false => {
            warn!(%addr, node = %args.node, memory_limit, "serving as a worker without authentication (loopback only)")
        }
    }
    serving
        .await
        .map_err(|e| CliError::Usage(format!("the worker's port: {e}")))
}
