//! What the catalog needs of the mink node it serves, and no more: the node's lake and
//! which databases hold mink tables. The catalog is a port of the lake; the node's
//! storage engine stays behind this trait (the `mink` binary implements it for its node).

use async_trait::async_trait;
use mink_lake::Lake;

/// The mink node behind the catalog.
#[async_trait]
pub trait NodeTables: Send + Sync {
    /// The node's lake, opened on first use.
    ///
    /// # Errors
    /// Why the lake cannot be opened (its configuration, its catalog); the request fails
    /// with a server error naming it.
    async fn lake(&self) -> Result<&Lake, Box<dyn std::error::Error + Send + Sync>>;

    /// Whether the mink database `name` holds a table: its name is taken, a client's
    /// namespace cannot have it.
    fn is_mink_database(&self, name: &str) -> bool;
}
