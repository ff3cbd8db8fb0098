//! Reaching a node: over the network (`--connect`), or embedded in this process over a
//! data directory (`--data-dir`), served on a loopback port so both paths speak the same
//! protocol.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mink_client::{ConnectOptions, Credentials, MinkClient};
use mink_node::server::{ServerHandle, serve};
use mink_node::{Node, NodeConfig};
use tokio::net::TcpListener;

use crate::error::CliError;

/// The data directory used when none is given.
pub(crate) const DEFAULT_DATA_DIR: &str = "./mink-data";

/// Where a command finds its node.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct NodeArgs {
    /// Address of a running node (`host:port`).
    #[arg(long, conflicts_with = "data_dir")]
    pub(crate) connect: Option<String>,
    /// Data directory of a node to run inside this command (default ./mink-data).
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// How to log in to the node at `--connect`.
    #[command(flatten)]
    pub(crate) login: LoginArgs,
}

/// The login of a client command: `--user` (password in MINK_PASSWORD, or
/// MINK_SQL_PASSWORD) and `--tls-ca`, the same for a node and a Flight SQL address.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct LoginArgs {
    /// The user to log in as (the password comes from MINK_PASSWORD, or
    /// MINK_SQL_PASSWORD).
    #[arg(long)]
    pub(crate) user: Option<String>,
    /// Connect with TLS, checking the server's certificate against this PEM certificate
    /// authority.
    #[arg(long, value_name = "FILE")]
    pub(crate) tls_ca: Option<PathBuf>,
}

/// The environment variable holding a client's password.
pub(crate) const PASSWORD_VAR: &str = "MINK_PASSWORD";
/// The older name of [`PASSWORD_VAR`], still read.
pub(crate) const SQL_PASSWORD_VAR: &str = "MINK_SQL_PASSWORD";

impl LoginArgs {
    /// The credentials: `--user` with its password from the environment.
    ///
    /// # Errors
    /// `--user` without a password in MINK_PASSWORD or MINK_SQL_PASSWORD.
    pub(crate) fn credentials(&self) -> Result<Option<Credentials>, CliError> {
        let Some(user) = &self.user else {
            return Ok(None);
        };
        let password = [PASSWORD_VAR, SQL_PASSWORD_VAR]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|p| !p.is_empty()))
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "--user needs the password in {PASSWORD_VAR} (or {SQL_PASSWORD_VAR})"
                ))
            })?;
        Ok(Some(Credentials::new(user, password)))
    }

    /// The contents of `--tls-ca`.
    ///
    /// # Errors
    /// The file cannot be read.
    pub(crate) fn tls_ca(&self) -> Result<Option<Vec<u8>>, CliError> {
        self.tls_ca.as_deref().map(read_file).transpose()
    }

    /// How a [`MinkClient`] connects with this login.
    ///
    /// # Errors
    /// See [`LoginArgs::credentials`] and [`LoginArgs::tls_ca`].
    pub(crate) fn options(&self) -> Result<ConnectOptions, CliError> {
        Ok(ConnectOptions {
            credentials: self.credentials()?,
            tls_ca: self.tls_ca()?,
            ..ConnectOptions::default()
        })
    }
}

/// A client, and the embedded node it talks to when there is one.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) client: MinkClient,
    embedded: Option<ServerHandle>,
}

impl NodeArgs {
    /// Connects to the node the arguments name.
    pub(crate) async fn connect(&self) -> Result<Connection, CliError> {
        if let Some(address) = &self.connect {
            return Ok(Connection {
                client: MinkClient::connect_with(address, &self.login.options()?).await?,
                embedded: None,
            });
        }
        let data_dir = self
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let node = Node::open(NodeConfig::new(data_dir)).await?;
        let handle = start(node).await?;
        let client = MinkClient::connect(&handle.addr().to_string()).await?;
        Ok(Connection {
            client,
            embedded: Some(handle),
        })
    }
}

impl Connection {
    /// Shuts the embedded node down cleanly, if there is one.
    pub(crate) async fn close(self) -> Result<(), CliError> {
        if let Some(handle) = self.embedded {
            handle.shutdown().await?;
        }
        Ok(())
    }
}

/// Serves `node` on a loopback port chosen by the OS.
pub(crate) async fn start(node: Arc<Node>) -> Result<ServerHandle, CliError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(CliError::io("binding a loopback port"))?;
    Ok(serve(node, listener).await?)
}

/// The bytes of the file at `path` (a certificate, a key), with the path in the error.
///
/// # Errors
/// The file cannot be read.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(CliError::io(format!("reading {}", path.display())))
}
