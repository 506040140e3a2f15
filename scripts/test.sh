#!/usr/bin/env bash
# Runs every check CI runs: formatting, lints, and all tests.
# Installs nothing today; system packages needed by later tests
# (memcached, libmemcached-tools, fio) are installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
