//! A local S3-compatible server for the tests (moto's server mode, installed by the test
//! command next to pyiceberg): the lake and the log store on S3 run against it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::python::python;

/// The region and credentials moto accepts.
const REGION: &str = "us-east-1";
const KEY: &str = "testing";

/// A moto S3 server on a free loopback port, stopped on drop.
pub(crate) struct Moto {
    child: Child,
    pub(crate) endpoint: String,
}

impl Moto {
    pub(crate) fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let server: PathBuf = python().with_file_name("moto_server");
        let child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "start {}: {e} (scripts/test.sh installs moto)",
                    server.display()
                )
            });
        let moto = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return moto;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("moto did not start on port {port}");
    }

    pub(crate) fn create_bucket(&self, bucket: &str) {
        let script = format!(
            "import boto3; boto3.client('s3', endpoint_url='{}', region_name='{REGION}', \
             aws_access_key_id='{KEY}', aws_secret_access_key='{KEY}').create_bucket(Bucket='{bucket}')",
            self.endpoint
        );
        let status = Command::new(python())
            .args(["-c", &script])
            .status()
            .expect("boto3");
        assert!(status.success(), "creating bucket {bucket}");
    }

    /// The `AWS_*` environment variables that point a mink process (its lake, its log
    /// store) at this server.
    pub(crate) fn aws_env(&self) -> [(&'static str, &str); 5] {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", REGION),
            ("AWS_ACCESS_KEY_ID", KEY),
            ("AWS_SECRET_ACCESS_KEY", KEY),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
