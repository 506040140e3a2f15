#!/usr/bin/env bash
# The Redis protocol comparison of docs/BENCHMARKS.md ("Redis protocol:
# `granary-bench ycsb`"): go-ycsb's redis binding (workloads A, B, C, F, D;
# string and hash records) and redis-benchmark against `granary serve`'s
# RESP listener and redis-server (AOF always, AOF everysec, no
# persistence, and a data set 4x its maxmemory), in one run. Installs
# redis-server and redis-tools when missing, builds go-ycsb
# (scripts/go-ycsb.sh) and the release binaries. Writes
# docs/results/bench-ycsb.json. RECORDS, OPERATIONS and PEERS override the
# defaults; the -lru4x Granary peer needs root and a memory cgroup.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
GO_YCSB=$(./scripts/go-ycsb.sh)
cargo build --release -p granary-cli
RECORDS=${RECORDS:-250K}
OPERATIONS=${OPERATIONS:-200K}
PEERS=${PEERS:-granary,granary-flush,granary-lru4x,redis-always,redis-everysec,redis-none,redis-lru4x}
./target/release/granary-bench ycsb --peers "$PEERS" --records "$RECORDS" --operations "$OPERATIONS" \
    --go-ycsb "$GO_YCSB" --json docs/results/bench-ycsb.json
