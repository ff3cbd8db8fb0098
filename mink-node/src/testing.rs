//! What tests and benchmarks of the cluster share (the `testing` feature): a real etcd
//! of their own, and nodes of a cluster served on loopback ports.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mink_log::{LogConfig, LogStoreConfig};

use crate::cluster::{ClusterConfig, ClusterTasks};
use crate::server::{ServerHandle, serve};
use crate::{Node, NodeConfig};

/// An etcd server of its own on loopback, stopped (and its data removed) on drop.
#[derive(Debug)]
pub struct Etcd {
    process: Child,
    /// Its client endpoint, `127.0.0.1:PORT`.
    pub endpoint: String,
    _data: tempfile::TempDir,
}

impl Etcd {
    /// Starts an etcd on free loopback ports, and waits until it takes connections.
    pub fn start() -> Self {
        let data = tempfile::tempdir().unwrap();
        let free_port = || {
            TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
        };
        let (client, peer) = (free_port(), free_port());
        let process = Command::new("etcd")
            .args(["--data-dir", &data.path().display().to_string()])
            .args(["--listen-client-urls", &format!("http://{client}")])
            .args(["--advertise-client-urls", &format!("http://{client}")])
            .args(["--listen-peer-urls", &format!("http://{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://{peer}")])
            .args(["--initial-cluster", &format!("default=http://{peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd not found: the test command installs Debian's etcd-server");
        let etcd = Self {
            process,
            endpoint: client.to_string(),
            _data: data,
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(client).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "etcd did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        etcd
    }

    /// Sends etcd `signal` (`STOP`, `CONT`): a paused etcd answers nothing.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.process.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} etcd");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A node of a cluster over an [`Etcd`], served on a loopback port it advertises.
#[derive(Debug)]
pub struct ClusterNode {
    /// Where clients reach it.
    pub address: String,
    node: Arc<Node>,
    handle: ServerHandle,
    tasks: ClusterTasks,
}

impl ClusterNode {
    /// Node `id` of the cluster under `prefix` in `etcd`, its data in `dir`, its log in the
    /// `file://` store at `store`, with a lease of `lease` and small log segments.
    ///
    /// # Panics
    /// When the node does not open or serve.
    pub async fn start(
        etcd: &Etcd,
        prefix: &str,
        store: &Path,
        id: &str,
        dir: &Path,
        lease: Duration,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let mut config = NodeConfig::new(dir);
        config.log = LogConfig {
            segment_bytes: 4 << 10,
            ..LogConfig::default()
        };
        config.log_store = Some(LogStoreConfig::new(format!("file://{}", store.display())));
        config.cluster = Some(ClusterConfig {
            endpoints: vec![etcd.endpoint.clone()],
            prefix: prefix.into(),
            node_id: id.into(),
            advertise: address.clone(),
            lease,
            peers: mink_client::ConnectOptions::default(),
        });
        let node = Node::open(config).await.expect("open a cluster node");
        let handle = serve(Arc::clone(&node), listener).await.expect("serve");
        let tasks = ClusterTasks::start(&node).expect("a cluster node");
        Self {
            address,
            node,
            handle,
            tasks,
        }
    }

    /// The node itself.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The node dies: it serves nothing more and renews its lease no more (etcd ends it
    /// after its time to live, as for a process killed).
    ///
    /// # Panics
    /// When its server does not shut down.
    pub async fn kill(self) {
        drop(self.tasks);
        self.handle.shutdown().await.expect("shutdown");
        drop(self.node);
    }
}
