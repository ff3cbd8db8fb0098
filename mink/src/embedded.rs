//! Reaching a node: over the network (`--connect`), or embedded in this process over a
//! data directory (`--data-dir`), served on a loopback port so both paths speak the same
//! protocol.

use std::path::PathBuf;
use std::sync::Arc;

use mink_client::MinkClient;
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
                client: MinkClient::connect(address).await?,
                embedded: None,
            });
        }
        let data_dir = self
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let node = Node::open(NodeConfig::new(data_dir))?;
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
    Ok(serve(node, listener)?)
}
