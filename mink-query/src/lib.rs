//! mink's SQL engine as a library: the [`session`] that runs SQL statements over a mink
//! node (the `mink` binary, its tests and the Flight SQL endpoint share it).

#![expect(
    unused_crate_dependencies,
    reason = "the library is the session; the binary's other dependencies show up here too"
)]

pub mod flight_sql;
pub mod session;
