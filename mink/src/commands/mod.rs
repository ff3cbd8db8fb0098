//! The `mink` subcommands, one module each: every module holds its arguments (a clap
//! `Args` struct) and a `run` function.
//!
//! | command       | module     | what it does                                              |
//! |---------------|------------|-----------------------------------------------------------|
//! | `mink server` | [`server`] | a node (every bucket), its tiering service and the Flight SQL endpoint |
//! | `mink sql`    | [`sql`]    | SQL statements against a node, a Flight SQL endpoint or a data directory |
//! | `mink read`   | [`read`]   | one bucket (or every bucket) read by mode: union, log, lake, snapshot, tail |
//! | `mink load`   | [`load`]   | a CSV, Parquet or JSON-lines file written into a table     |
//! | `mink worker` | [`worker`] | a distributed-query worker of a server's statements       |

pub(crate) mod load;
pub(crate) mod metrics_port;
pub(crate) mod read;
pub(crate) mod server;
pub(crate) mod sql;
pub(crate) mod worker;
