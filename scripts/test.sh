#!/usr/bin/env bash
# Runs every test of mink: clippy with warnings as errors, unit tests, and integration
# tests against the real server and binary, including pyiceberg reading the lake (and, with
# DuckDB, through mink's Iceberg REST catalog) and the
# lake on a local S3-compatible server (moto), the ADBC Flight SQL driver against the
# Flight SQL endpoint, and kafka-python, confluent-kafka (librdkafka) and kcat against the
# Kafka listener, and mink on a FUSE file system that drops what was not fsynced at a power
# cut (mfusepy; needs /dev/fuse and root). Installs what the tests need (pyiceberg, DuckDB
# and its iceberg, avro and httpfs extensions, moto, adbc-driver-flightsql, pyarrow,
# kafka-python, confluent-kafka and mfusepy into ./.venv; kcat from Debian) itself. The
# mink:// SQLAlchemy dialect and Superset engine spec (python/mink-sqlalchemy) are tested
# under SQLAlchemy 2 with pandas (./.venv) and SQLAlchemy 1.4 (./.venv-sqlalchemy14), and
# with MINK_TEST_SUPERSET=1 inside Apache Superset 6.1 (./.venv-superset).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ] \
  || ! .venv/bin/python -c 'import pyiceberg_core, duckdb_extension_iceberg, adbc_driver_flightsql, pyarrow, kafka, confluent_kafka, mfusepy, pandas, selenium' 2>/dev/null; then
  echo "installing pyiceberg, DuckDB with its iceberg extension, moto, adbc-driver-flightsql, pyarrow, kafka-python, confluent-kafka, mfusepy, SQLAlchemy 2, pandas and selenium into .venv" >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check \
    'pyiceberg[sql-sqlite,pyarrow,pyiceberg-core]==0.12.0' 'moto[server]==5.2.5' \
    'duckdb==1.5.5' 'duckdb-extension-iceberg==1.5.5' 'duckdb-extension-avro==1.5.5' \
    'duckdb-extension-httpfs==1.5.5' \
    'adbc-driver-flightsql==1.13.0' 'pyarrow' \
    'kafka-python==2.2.21' 'confluent-kafka==2.16.1' 'mfusepy==3.1.1' \
    'sqlalchemy==2.1.9' 'pandas==3.1.1' 'selenium==4.51.0'
fi
# python/mink-sqlalchemy, installed editable (the tests run this checkout's code) into
# VENV unless its dialect and engine spec are registered there from this checkout.
install_mink_sqlalchemy() {
  "$1/bin/python" - 2>/dev/null <<'CHECK' || "$1/bin/pip" install --quiet --disable-pip-version-check -e python/mink-sqlalchemy
import os, sys
from importlib.metadata import entry_points
import mink_sqlalchemy
from sqlalchemy.dialects import registry
registry.load("mink")
assert any(e.name == "mink" for e in entry_points(group="superset.db_engine_specs"))
sys.exit(not os.path.realpath(mink_sqlalchemy.__file__).startswith(os.path.realpath("python/mink-sqlalchemy")))
CHECK
}
install_mink_sqlalchemy .venv
# SQLAlchemy 1.4 with the pandas, numpy and pyarrow that Superset 6.1 pins: what the
# dialect meets inside Superset, without Superset's 850 MB.
if ! .venv-sqlalchemy14/bin/python -c 'import sqlalchemy, adbc_driver_flightsql, pandas; assert sqlalchemy.__version__.startswith("1.4.")' 2>/dev/null; then
  echo "installing SQLAlchemy 1.4, adbc-driver-flightsql, pyarrow and pandas into .venv-sqlalchemy14" >&2
  python3 -m venv .venv-sqlalchemy14
  .venv-sqlalchemy14/bin/pip install --quiet --disable-pip-version-check \
    'sqlalchemy==1.4.54' 'adbc-driver-flightsql==1.13.0' 'pyarrow==18.1.0' \
    'pandas==2.1.4' 'numpy==1.26.4'
fi
install_mink_sqlalchemy .venv-sqlalchemy14
# Apache Superset itself, only for MINK_TEST_SUPERSET=1 (about 55 s to install, 850 MB).
# Its wheel misses two imports (rich, cachetools) and takes a Flask-Caching it cannot run
# with (2.4 and later pass an argument its cache refuses).
if [ "${MINK_TEST_SUPERSET:-}" = 1 ]; then
  if ! .venv-superset/bin/python -c 'import superset, rich, cachetools, adbc_driver_flightsql' 2>/dev/null; then
    echo "installing Apache Superset 6.1 into .venv-superset" >&2
    python3 -m venv .venv-superset
    .venv-superset/bin/pip install --quiet --disable-pip-version-check \
      'apache-superset==6.1.0' 'adbc-driver-flightsql==1.13.0' 'flask-caching==2.3.1' \
      'rich==15.0.0' 'cachetools==8.0.3'
  fi
  install_mink_sqlalchemy .venv-superset
fi
# Debian packages: kcat (a Kafka client of the Kafka tests), libfuse3 (the power-cut
# tests' file system mounts through it, which needs root and /dev/fuse) and etcd-server
# (the cluster's metadata store; its tests start their own etcd on loopback).
missing=()
command -v kcat >/dev/null || missing+=(kcat)
command -v etcd >/dev/null || missing+=(etcd-server)
dpkg -s libfuse3-3 >/dev/null 2>&1 || missing+=(libfuse3-3)
# Prometheus and promtool (the metrics tests start their own Prometheus on a free port),
# Chromium and its driver (the status page test, through selenium).
command -v prometheus >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
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
