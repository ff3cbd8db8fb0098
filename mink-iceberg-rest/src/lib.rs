//! mink's Iceberg REST catalog (`mink server --iceberg-rest-listen HOST:PORT`;
//! `docs/iceberg-rest.md`): other engines list, load and append to mink's lake tables
//! through the [Iceberg REST catalog protocol] instead of opening its SQLite catalog.
//!
//! ```text
//!  pyiceberg / DuckDB / Spark ──HTTP──▶ routes ──▶ Lake's catalog (list, load)
//!                                         │
//!                                         └──▶ mink_lake::commit::{commit_foreign, commit_hosted}
//!                                              (requirements, appends to mink's log tables,
//!                                               any commit to a client's own tables,
//!                                               the catalog's compare-and-swap)
//! ```
//!
//! - `server`: the listener, bounded like mink's other ports (connection limit, loopback
//!   only without a login, TLS as the other ports), each connection served by hyper's
//!   HTTP/1.1 with a header-read timeout;
//! - `oauth`: the OAuth2 client-credentials token endpoint (`/v1/oauth/tokens`), mapped
//!   onto mink's user and password, and the bearer check of every other route;
//! - `routes`: the router, config, the checks of every request (body size and deadline);
//! - `limits`: every bound of requests and of what clients create, with its table;
//! - `namespaces`: mink databases, and the hosted namespaces clients create;
//! - `tables`: list, load, commit; create and drop in hosted namespaces;
//! - `unserved`: the spec's routes mink does not serve, answered as the spec documents
//!   (no views; `406` for renames, registrations, transactions, ...);
//! - [`NodeTables`]: what the catalog needs of the node it serves (its lake, its
//!   databases), so the catalog depends on the lake and not on the storage engine;
//! - `error`: the protocol's error model (`{"error": {"message", "type", "code"}}`).
//!
//! Namespaces are mink databases, tables the lake tables of mink tables; a client may also
//! create namespaces of its own (hosted) and its own tables in them, which is how another
//! mink server uses this one's catalog as its lake catalog (`--lake-catalog rest:URL`).
//! Tables are loaded with their metadata and the file IO properties a client needs to read
//! the warehouse (never the server's own storage keys). mink's own tables are created and
//! dropped through mink's SQL, not through this catalog.
//!
//! [Iceberg REST catalog protocol]: https://iceberg.apache.org/rest-catalog-spec/

mod error;
mod limits;
mod namespaces;
mod node_tables;
mod oauth;
mod routes;
mod server;
mod tables;
mod unserved;

pub use node_tables::NodeTables;
pub use server::{IcebergRestHandle, IcebergRestOptions, ServeError, serve};
