//! mink's Python package for SQL users (`python/mink-sqlalchemy`: the `mink://`
//! SQLAlchemy dialect on ADBC's Flight SQL driver and Apache Superset's engine spec)
//! against the real `mink server`, one with a login over plaintext and one over TLS.
//!
//! `tests/python/sqlalchemy_dialect.py` runs under SQLAlchemy 2 (`.venv`, with pandas 3)
//! and under SQLAlchemy 1.4 (`.venv-sqlalchemy14`, with the pandas, numpy and pyarrow
//! Superset 6.1 pins): reflection of every table kind, bound parameters, every time grain
//! of the engine spec, pandas, logins and TLS. `tests/python/superset_e2e.py` drives
//! Superset 6.1 itself (`.venv-superset`) through its API; it costs about two minutes
//! (a 850 MB install and Superset's migrations), so it runs only with
//! `MINK_TEST_SUPERSET=1`. `scripts/test.sh` creates each environment.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::ServerProcess;
use crate::python::python;

const USER: &str = "analyst";
const PASSWORD: &str = "s3cret";

/// The Python of the virtual environment `name` at the workspace root, or `variable`'s.
fn venv_python(variable: &str, name: &str) -> PathBuf {
    if let Ok(python) = std::env::var(variable) {
        return PathBuf::from(python);
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("bin/python");
    assert!(
        python.exists(),
        "no {name}: run scripts/test.sh (it creates it) or set {variable}"
    );
    python
}

fn tls_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name)
}

/// `mink server`s with the test login: one over plaintext, one over TLS.
struct Servers {
    plain: ServerProcess,
    tls: ServerProcess,
    _dirs: [tempfile::TempDir; 2],
}

impl Servers {
    fn start() -> Self {
        let login = [("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)];
        let plain_dir = tempfile::tempdir().expect("temp dir");
        let secure_dir = tempfile::tempdir().expect("temp dir");
        let certificate = tls_dir().join("server.pem").display().to_string();
        let key = tls_dir().join("server.key").display().to_string();
        let tls_args = ["--sql-tls-cert", &certificate, "--sql-tls-key", &key];
        Self {
            plain: ServerProcess::start_with(plain_dir.path(), &[], &login),
            tls: ServerProcess::start_with(secure_dir.path(), &tls_args, &login),
            _dirs: [plain_dir, secure_dir],
        }
    }

    /// The TLS endpoint by the name its certificate is for.
    fn tls_address(&self) -> String {
        let port = self.tls.sql_addr.rsplit(':').next().expect("a port");
        format!("localhost:{port}")
    }
}

/// Runs the dialect's test script with `python`; returns the JSON line it prints.
fn run_dialect_checks(python: &Path) -> String {
    let servers = Servers::start();
    let output = Command::new(python)
        .arg(script("sqlalchemy_dialect.py"))
        .args(["--plain", &servers.plain.sql_addr])
        .args(["--tls", &servers.tls_address()])
        .arg("--ca")
        .arg(tls_dir().join("ca.pem"))
        .args(["--user", USER, "--password", PASSWORD])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the SQLAlchemy dialect's checks failed ({}): {stderr}",
        python.display()
    );
    let summary = String::from_utf8_lossy(&output.stdout).trim().to_string();
    eprintln!("mink-sqlalchemy: {summary}");
    summary
}

#[test]
fn the_sqlalchemy_dialect_works_under_sqlalchemy_2() {
    let summary = run_dialect_checks(&python());
    assert!(summary.contains("\"sqlalchemy\": \"2."), "{summary}");
}

#[test]
fn the_sqlalchemy_dialect_works_under_sqlalchemy_1_4() {
    let python = venv_python("MINK_PYTHON_SQLALCHEMY14", ".venv-sqlalchemy14");
    let summary = run_dialect_checks(&python);
    assert!(summary.contains("\"sqlalchemy\": \"1.4."), "{summary}");
}

#[test]
fn superset_registers_mink_and_charts_its_tables() {
    if std::env::var("MINK_TEST_SUPERSET").as_deref() != Ok("1") {
        eprintln!("Superset's end-to-end test runs with MINK_TEST_SUPERSET=1 (see README.md)");
        return;
    }
    let python = venv_python("MINK_PYTHON_SUPERSET", ".venv-superset");
    let login = [("MINK_SQL_USER", USER), ("MINK_SQL_PASSWORD", PASSWORD)];
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with(dir.path(), &[], &login);
    let work = tempfile::tempdir().expect("Superset's directory");
    let output = Command::new(python)
        .arg(script("superset_e2e.py"))
        .args([server.sql_addr.as_str(), USER, PASSWORD])
        .arg(work.path())
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "Superset's checks failed: {stderr}"
    );
    let summary = String::from_utf8_lossy(&output.stdout);
    eprintln!("Superset: {}", summary.lines().last().unwrap_or_default());
    assert!(summary.contains("\"superset\": \"6.1"), "{summary}");
}
