//! The real `mink server` binary as a child process.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A `mink server` process listening on loopback ports it chose.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) addr: String,
    /// The address of its Flight SQL endpoint.
    pub(crate) sql_addr: String,
    /// The address of its Kafka listener, when it serves one.
    pub(crate) kafka_addr: Option<String>,
    /// The address of its Iceberg REST catalog, when it serves one.
    pub(crate) iceberg_rest_addr: Option<String>,
    /// The address of its metrics port, when it serves one.
    pub(crate) metrics_addr: Option<String>,
}

impl ServerProcess {
    /// Starts `mink server --listen 127.0.0.1:0` over `data_dir` and waits for its
    /// `listening on` lines.
    pub(crate) fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[], &[])
    }

    /// Like [`ServerProcess::start`], with extra environment variables.
    pub(crate) fn start_with_env(data_dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_with(data_dir, &[], env)
    }

    /// Like [`ServerProcess::start`], with extra arguments and environment variables (a
    /// login only where `env` gives one).
    pub(crate) fn start_with(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(Self::command(data_dir, "127.0.0.1:0", args, env), args)
    }

    /// Like [`ServerProcess::start_with`], its node port on `listen` (a cluster's node
    /// advertises the port it listens on).
    pub(crate) fn start_listening(data_dir: &Path, listen: &str, args: &[&str]) -> Self {
        Self::spawn(Self::command(data_dir, listen, args, &[]), args)
    }

    /// Like [`ServerProcess::start_with`], for a start that may end before it serves (a
    /// crash point reached while opening): `None` then.
    pub(crate) fn try_start_with(
        data_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Option<Self> {
        Self::try_spawn(Self::command(data_dir, "127.0.0.1:0", args, env), args)
    }

    /// `mink server` over `data_dir`, its node port on `listen` and its SQL port on one
    /// it chooses, with `args` and `env`.
    fn command(data_dir: &Path, listen: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mink"));
        command
            .args(["server", "--listen", listen, "--sql-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(args)
            .env_remove("MINK_SQL_USER")
            .env_remove("MINK_SQL_PASSWORD")
            .envs(env.iter().copied());
        command
    }

    /// The `grpc://` URI of its Flight SQL endpoint.
    pub(crate) fn sql_uri(&self) -> String {
        format!("grpc://{}", self.sql_addr)
    }

    /// Whether the process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// VmRSS of the process, in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        rss_kib_of(&self.child)
    }

    /// Runs `work` while sampling the process's VmRSS every 10 ms; returns what `work`
    /// returned and the highest VmRSS seen, in KiB (at least `from_kib`).
    pub(crate) fn peak_rss_kib_while<T>(
        &self,
        from_kib: u64,
        work: impl FnOnce() -> T,
    ) -> (T, u64) {
        let peak = AtomicU64::new(from_kib);
        let done = AtomicBool::new(false);
        let outcome = std::thread::scope(|scope| {
            scope.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    peak.fetch_max(self.rss_kib(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let outcome = work();
            done.store(true, Ordering::Relaxed);
            outcome
        });
        (outcome, peak.into_inner())
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
        Self::spawn(command, &[])
    }

    /// Spawns `command` and reads the address of each port its `args` ask for.
    fn spawn(command: Command, args: &[&str]) -> Self {
        Self::try_spawn(command, args).expect("mink server ended before it served")
    }

    /// [`ServerProcess::spawn`]; `None` when the process ends before it serves.
    fn try_spawn(mut command: Command, args: &[&str]) -> Option<Self> {
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mink server");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = |prefix: &str| listening_address(&mut stdout, prefix);
        let addr = address("mink node listening on ");
        let sql_addr = address("mink Flight SQL listening on ");
        let kafka_addr = args
            .contains(&"--kafka-listen")
            .then(|| address("mink Kafka listening on "));
        let iceberg_rest_addr = args
            .contains(&"--iceberg-rest-listen")
            .then(|| address("mink Iceberg REST listening on "));
        let metrics_addr = args
            .contains(&"--metrics-listen")
            .then(|| address("mink metrics listening on "));
        let (Some(addr), Some(sql_addr)) = (addr, sql_addr) else {
            let _ = child.wait();
            return None;
        };
        // Keep draining stdout so the child never blocks on (or dies of) a closed pipe.
        std::thread::spawn(move || for _ in stdout.lines() {});
        Some(Self {
            child,
            addr,
            sql_addr,
            kafka_addr: kafka_addr.flatten(),
            iceberg_rest_addr: iceberg_rest_addr.flatten(),
            metrics_addr: metrics_addr.flatten(),
        })
    }

    /// `kill -9`.
    pub(crate) fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// `kill -TERM`: a shutdown, as a supervisor asks for one.
    pub(crate) fn terminate(&self) {
        self.signal("TERM");
    }

    /// `kill -STOP`: the process stays, frozen mid-step, until [`ServerProcess::resume`].
    pub(crate) fn pause(&self) {
        self.signal("STOP");
    }

    /// `kill -CONT`.
    pub(crate) fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(&pid)
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS of a running child process, in KiB.
fn rss_kib_of(child: &Child) -> u64 {
    let status = std::fs::read_to_string(
        Path::new("/proc")
            .join(child.id().to_string())
            .join("status"),
    )
    .expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The address on the next line of a process's `stdout`, after `prefix`; `None` when the
/// process ended first.
fn listening_address(stdout: &mut impl BufRead, prefix: &str) -> Option<String> {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read a line");
    if line.is_empty() {
        return None;
    }
    let address = line.trim().strip_prefix(prefix);
    Some(
        address
            .unwrap_or_else(|| panic!("expected '{prefix}...', got {line:?}"))
            .to_string(),
    )
}

/// A `mink worker` process.
pub(crate) struct WorkerProcess {
    child: Child,
    /// The address it listens on.
    pub(crate) addr: String,
    /// The address of its metrics port, when it serves one.
    pub(crate) metrics_addr: Option<String>,
}

impl WorkerProcess {
    /// Whether the process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// VmRSS of the process, in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        rss_kib_of(&self.child)
    }

    /// Starts `mink worker` with `args` and `env` (no login but what `env` gives) and
    /// waits for its `listening on` lines.
    pub(crate) fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mink"))
            .arg("worker")
            .args(args)
            .env_remove("MINK_PASSWORD")
            .env_remove("MINK_SQL_PASSWORD")
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mink worker");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let addr = listening_address(&mut stdout, "mink worker listening on ")
            .expect("mink worker ended before it served");
        let metrics_addr = (args.contains(&"--metrics-listen"))
            .then(|| listening_address(&mut stdout, "mink metrics listening on "))
            .flatten();
        std::thread::spawn(move || for _ in stdout.lines() {});
        Self {
            child,
            addr,
            metrics_addr,
        }
    }

    /// `kill -9`.
    pub(crate) fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `mink server --listen 127.0.0.1:0 --sql-listen 127.0.0.1:0` over `data_dir` with
/// `args`, for a start that must fail: `(success, stdout, stderr)` once it exits.
pub(crate) fn run_server(
    data_dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let data_dir = data_dir.display().to_string();
    let mut all = vec![
        "server",
        "--data-dir",
        &data_dir,
        "--listen",
        "127.0.0.1:0",
        "--sql-listen",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    run_mink_with(&all, env)
}

/// `mink sql --connect ADDRESS --format csv -e STATEMENT` to completion: `(success,
/// stdout, stderr)`.
pub(crate) fn run_sql(address: &str, statement: &str) -> (bool, String, String) {
    run_mink(&[
        "sql",
        "--connect",
        address,
        "--format",
        "csv",
        "-e",
        statement,
    ])
}

/// Runs the `mink` binary to completion: `(success, stdout, stderr)`.
pub(crate) fn run_mink(args: &[&str]) -> (bool, String, String) {
    run_mink_with(args, &[])
}

/// [`run_mink`] with `env`, and no password from the test's own environment.
pub(crate) fn run_mink_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_mink"))
        .args(args)
        .env_remove("MINK_PASSWORD")
        .env_remove("MINK_SQL_PASSWORD")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run mink");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
