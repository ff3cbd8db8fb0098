//! What tests of the cluster share (the `testing` feature): a real etcd of their own.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
