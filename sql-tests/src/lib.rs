//! mink's SQL tests: `slt/*.slt` run by `tests/sqllogictests.rs`, each file against a
//! fresh embedded node (`cargo test -p sql-tests`; `-- --complete` rewrites the expected
//! results from what mink answers).

// The dev-dependencies are the runner's; the library itself is only this documentation.
#![cfg_attr(
    test,
    expect(
        unused_crate_dependencies,
        reason = "dev-dependencies serve tests/sqllogictests.rs"
    )
)]
