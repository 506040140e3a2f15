#!/usr/bin/env bash
# Runs every check CI runs: formatting, lints, and all tests.
# Installs the peer tools the tests compare against when they are missing
# (memcached, memccapable from libmemcached-tools, and fio, which
# `granary bench memcache`'s device reference runs).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v memccapable >/dev/null || missing+=(libmemcached-tools)
command -v fio >/dev/null || missing+=(fio)
if ((${#missing[@]})); then
    echo "installing ${missing[*]} (needed by the memcache conformance tests and benchmark tests)"
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The peer-dependent tests fail (instead of skipping) when a tool is missing.
export GRANARY_REQUIRE_PEERS=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
# The engine's suite again on the io_uring backend (O_DIRECT files; the
# synchronous API through private rings): granary_io::testdev. The crash
# simulation and the model tests choose their devices themselves.
GRANARY_TEST_BACKEND=uring cargo test -p granary-store --lib --test checkpoint --test gc
# The index's concurrency protocol under loom's model checker.
./scripts/loom.sh
