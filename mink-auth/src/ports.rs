//! The ports a mink process serves, by the names its logs and its metrics give them.

use std::fmt;

/// A port of a mink process: its name in log lines (`Display`) and its `port` label in
/// the connection metrics ([`Port::label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The node's read and write protocol (`--listen`).
    Node,
    /// The node's loopback port for its own Flight SQL endpoint and rounds.
    NodeInternal,
    /// Flight SQL (`--sql-listen`).
    FlightSql,
    /// Kafka (`--kafka-listen`).
    Kafka,
    /// The Iceberg REST catalog (`--iceberg-rest-listen`).
    IcebergRest,
    /// A worker of distributed statements (`mink worker --listen`).
    Worker,
    /// Metrics and the status page (`--metrics-listen`).
    Metrics,
}

impl Port {
    /// The port's `port` label in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::NodeInternal => "node_internal",
            Self::FlightSql => "flight_sql",
            Self::Kafka => "kafka",
            Self::IcebergRest => "iceberg_rest",
            Self::Worker => "worker",
            Self::Metrics => "metrics",
        }
    }

    /// The port's name in log lines and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Node => "the node",
            Self::NodeInternal => "the node's internal port",
            Self::FlightSql => "Flight SQL",
            Self::Kafka => "Kafka",
            Self::IcebergRest => "the Iceberg REST catalog",
            Self::Worker => "the worker",
            Self::Metrics => "the metrics port",
        }
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
