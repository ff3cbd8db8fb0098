//! What every connection of the listener shares: the node, the brokers clients are sent
//! to, the login, the group coordinator and the durable Kafka state.

use std::sync::Arc;

use mink_auth::Credentials;
use mink_node::Node;

use crate::brokers::Brokers;
use crate::groups::Groups;
use crate::limits::OFFSETS_EXPIRY_INTERVAL;
use crate::periodic::AtMostEvery;
use crate::produce::Producers;
use crate::server::ServeError;
use crate::state::{EtcdState, KafkaState, SqliteState};

/// The listener's shared state.
#[derive(Debug)]
pub(crate) struct Broker {
    pub(crate) node: Arc<Node>,
    /// This node's broker and the cluster's others.
    pub(crate) brokers: Brokers,
    credentials: Option<Credentials>,
    pub(crate) groups: Groups,
    pub(crate) offsets_expiry: AtMostEvery,
    pub(crate) producers: Producers,
    /// Committed offsets, producer ids and last batches: the node's `meta.db`, or the
    /// cluster's etcd.
    pub(crate) state: Box<dyn KafkaState>,
}

impl Broker {
    /// The listener's state, its broker at `advertised` (recorded in the cluster's etcd
    /// when the node has one).
    ///
    /// # Errors
    /// An advertised address that is not `HOST:PORT` or is unspecified; etcd could not
    /// be reached.
    pub(crate) async fn new(
        node: Arc<Node>,
        advertised: &str,
        credentials: Option<Credentials>,
    ) -> Result<Self, ServeError> {
        let (host, port) = split_host_port(advertised).ok_or_else(|| {
            ServeError::Config(format!(
                "the advertised Kafka address '{advertised}' is not HOST:PORT"
            ))
        })?;
        if host == "0.0.0.0" || host == "::" {
            return Err(ServeError::Config(format!(
                "the advertised Kafka address '{advertised}' is unspecified: name an address \
                 clients can connect to"
            )));
        }
        let brokers = Brokers::start(&node, host, port).await?;
        let state: Box<dyn KafkaState> = match node.membership() {
            None => {
                let path = node.data_dir().join("meta.db");
                let state = SqliteState::open(&path, Arc::clone(&node)).map_err(|e| {
                    ServeError::Config(format!("the Kafka state in {}: {e}", path.display()))
                })?;
                Box::new(state)
            }
            Some(membership) => {
                let config = membership.config();
                let client = (config.connect().await)
                    .map_err(|e| ServeError::Config(format!("the Kafka state in etcd: {e}")))?;
                Box::new(EtcdState::new(client, &config.prefix, Arc::clone(&node)))
            }
        };
        Ok(Self {
            groups: Groups::new(),
            offsets_expiry: AtMostEvery::new(OFFSETS_EXPIRY_INTERVAL),
            producers: Producers::default(),
            node,
            brokers,
            credentials,
            state,
        })
    }

    /// Whether connections must log in (SASL/PLAIN) before anything else.
    pub(crate) fn requires_login(&self) -> bool {
        self.credentials.is_some()
    }

    /// Whether `user` and `password` are the configured login.
    pub(crate) fn accepts(&self, user: &str, password: &str) -> bool {
        self.credentials
            .as_ref()
            .is_none_or(|login| login.accepts(&Credentials::new(user, password)))
    }
}

/// `host:port`, `[v6]:port`.
fn split_host_port(address: &str) -> Option<(String, i32)> {
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), i32::from(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_addresses_split_into_host_and_port() {
        assert_eq!(
            split_host_port("kafka.example.com:9092"),
            Some(("kafka.example.com".into(), 9092))
        );
        assert_eq!(split_host_port("[::1]:19092"), Some(("::1".into(), 19092)));
        assert_eq!(split_host_port("nohost"), None);
        assert_eq!(split_host_port(":9092"), None);
        assert_eq!(split_host_port("h:99999"), None);
    }
}
