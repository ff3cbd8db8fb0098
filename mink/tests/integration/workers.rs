//! `mink worker`'s service in process: workers on loopback ports over a test node, and
//! SQL sessions that run their statements on them.

use std::sync::Arc;
use std::time::Duration;

use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use mink_sql::MinkSession;
use mink_sql::distributed::Distribution;
use mink_sql::distributed::worker::{WorkerConfig, serve};
use mink_sql::session::{SqlRuntime, memory_pool};
use object_store::local::LocalFileSystem;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Memory of each worker's tasks and of a distributed session.
const MEMORY: usize = 2 << 30;

/// Workers served on 127.0.0.1:0, reading the logs of the node `client` reaches and the
/// lake's files by their absolute paths (as the tests' sessions do).
pub(crate) struct TestWorkers {
    pub(crate) addrs: Vec<String>,
    servers: Vec<Served>,
}

/// A worker's server task, and what stops it.
struct Served {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestWorkers {
    pub(crate) async fn start(count: usize, client: &MinkClient) -> Self {
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..count {
            let (addr, server) = serve_worker(client).await;
            addrs.push(addr);
            servers.push(server);
        }
        Self { addrs, servers }
    }

    /// Stops worker `index`: it answers no more calls, its port is closed.
    pub(crate) async fn stop(&mut self, index: usize) {
        let served = &mut self.servers[index];
        if let Some(stop) = served.stop.take() {
            let _ = stop.send(());
        }
        (&mut served.task).await.expect("worker stopped");
    }

    /// A session whose statements run on the workers when a read holds more than
    /// `rows_per_task` rows, once every worker answers.
    pub(crate) async fn session(&self, client: &MinkClient, rows_per_task: u64) -> MinkSession {
        let storage = storage();
        let distribution =
            Distribution::new(&self.addrs, None, None, rows_per_task).expect("workers");
        let runtime = SqlRuntime::server(memory_pool(MEMORY), &storage)
            .expect("runtime")
            .with_distribution(distribution.clone());
        for _ in 0..100 {
            if distribution.workers().live().len() == self.addrs.len() {
                return MinkSession::connect_in(client.clone(), storage, &runtime)
                    .await
                    .expect("session");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("workers {:?} never answered", self.addrs);
    }
}

impl Drop for TestWorkers {
    fn drop(&mut self) {
        for server in &self.servers {
            server.task.abort();
        }
    }
}

/// Lake files by their absolute paths.
fn storage() -> LakeStorage {
    LakeStorage::new(Arc::new(LocalFileSystem::new()), "")
}

/// One worker on a loopback port of its own: its address and its server.
async fn serve_worker(client: &MinkClient) -> (String, Served) {
    let storage = storage();
    let config = WorkerConfig {
        runtime: SqlRuntime::server(memory_pool(MEMORY), &storage).expect("runtime"),
        storage,
        node: client.clone(),
        credentials: None,
        tls: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let (stop, stopped) = oneshot::channel();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let serving = serve(config, listener, 64, shutdown).expect("worker");
    let task = tokio::spawn(async move { serving.await.expect("worker serves") });
    let stop = Some(stop);
    (addr, Served { stop, task })
}
