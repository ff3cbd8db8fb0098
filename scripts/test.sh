#!/usr/bin/env bash
# Runs every test of mink: clippy with warnings as errors, unit tests, and integration
# tests against the real server and binary, including pyiceberg reading the lake and the
# lake on a local S3-compatible server (moto). Installs what the tests need (pyiceberg and
# moto into ./.venv) itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ] || ! .venv/bin/python -c 'import pyiceberg' 2>/dev/null; then
  echo "installing pyiceberg and moto into .venv" >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check \
    'pyiceberg[sql-sqlite,pyarrow]==0.12.0' 'moto[server]==5.2.5'
fi
export MINK_PYTHON="$PWD/.venv/bin/python"

cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
