//! The real `mink server` binary as a child process.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A `mink server` process listening on loopback ports it chose.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) addr: String,
    /// The address of its Flight SQL endpoint.
    pub(crate) sql_addr: String,
}

impl ServerProcess {
    /// Starts `mink server --listen 127.0.0.1:0` over `data_dir` and waits for its
    /// `listening on` line.
    pub(crate) fn start(data_dir: &Path) -> Self {
        Self::start_with_env(data_dir, &[])
    }

    /// Like [`ServerProcess::start`], with extra environment variables.
    pub(crate) fn start_with_env(data_dir: &Path, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mink"));
        command
            .args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--sql-listen",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .envs(env.iter().copied());
        Self::spawn(command)
    }

    /// Waits for the process to end by itself (an abort at a failpoint).
    pub(crate) fn wait_for_exit(mut self) {
        self.child.wait().expect("wait");
    }

    /// Like [`ServerProcess::start`], with files limited to `kib` KiB (`ulimit -f`).
    pub(crate) fn start_limited(data_dir: &Path, kib: u64) -> Self {
        let mut command = Command::new("bash");
        let script = format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\"");
        command
            .args([
                "-c",
                &script,
                env!("CARGO_BIN_EXE_mink"),
                "server",
                "--listen",
                "127.0.0.1:0",
                "--sql-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(data_dir);
        Self::spawn(command)
    }

    fn spawn(mut command: Command) -> Self {
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mink server");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = |prefix: &str| {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("read a line");
            line.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected '{prefix}...', got {line:?}"))
                .to_string()
        };
        let addr = address("mink node listening on ");
        let sql_addr = address("mink Flight SQL listening on ");
        Self {
            child,
            addr,
            sql_addr,
        }
    }

    /// `kill -9`.
    pub(crate) fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the `mink` binary to completion: `(success, stdout, stderr)`.
pub(crate) fn run_mink(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_mink"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run mink");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
