#!/usr/bin/env bash
# Runs every test of mink: unit tests, integration tests against the real server and
# binary, doc tests, and clippy with warnings as errors. Needs only a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
