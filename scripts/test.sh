#!/usr/bin/env bash
# Runs every test of mink: clippy with warnings as errors, unit tests, and integration
# tests against the real server and binary, including pyiceberg reading the lake (and, with
# DuckDB, through mink's Iceberg REST catalog) and the
# lake on a local S3-compatible server (moto), the ADBC Flight SQL driver against the
# Flight SQL endpoint, and kafka-python, confluent-kafka (librdkafka) and kcat against the
# Kafka listener, and mink on a FUSE file system that drops what was not fsynced at a power
# cut (mfusepy; needs /dev/fuse and root). Installs what the tests need (pyiceberg, DuckDB
# and its iceberg, avro and httpfs extensions, moto, adbc-driver-flightsql, pyarrow,
# kafka-python, confluent-kafka and mfusepy into ./.venv; kcat from Debian) itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ] \
  || ! .venv/bin/python -c 'import pyiceberg_core, duckdb_extension_iceberg, adbc_driver_flightsql, pyarrow, kafka, confluent_kafka, mfusepy' 2>/dev/null; then
  echo "installing pyiceberg, DuckDB with its iceberg extension, moto, adbc-driver-flightsql, pyarrow, kafka-python, confluent-kafka and mfusepy into .venv" >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check \
    'pyiceberg[sql-sqlite,pyarrow,pyiceberg-core]==0.12.0' 'moto[server]==5.2.5' \
    'duckdb==1.5.5' 'duckdb-extension-iceberg==1.5.5' 'duckdb-extension-avro==1.5.5' \
    'duckdb-extension-httpfs==1.5.5' \
    'adbc-driver-flightsql==1.13.0' 'pyarrow' \
    'kafka-python==2.2.21' 'confluent-kafka==2.16.1' 'mfusepy==3.1.1'
fi
# Debian packages: kcat (a Kafka client of the Kafka tests) and libfuse3 (the power-cut
# tests' file system mounts through it, which needs root and /dev/fuse).
missing=()
command -v kcat >/dev/null || missing+=(kcat)
dpkg -s libfuse3-3 >/dev/null 2>&1 || missing+=(libfuse3-3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (Debian) into the system" >&2
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo"
  apt_install() { $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
  apt_install || { $as_root apt-get update -q >/dev/null && apt_install; }
fi
export MINK_PYTHON="$PWD/.venv/bin/python"
# A cold build gains nothing from incremental state, which would double the target
# directory's size (CI machines have run out of disk with it).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Clippy lints mink's own crates while the tests build them: clippy-driver compiles the
# workspace's crates (as `cargo clippy` runs it, with warnings as errors), rustc the
# dependencies. A separate `cargo clippy` would check every dependency once more, which
# took 8 of a cold run's minutes on 2 cores.
clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
[ -x "$clippy_driver" ] || clippy_driver="$(command -v clippy-driver)" \
  || { echo "clippy-driver not found: install clippy (rustup component add clippy)" >&2; exit 1; }
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
cargo test --workspace --locked
