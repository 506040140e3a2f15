#!/usr/bin/env bash
# The Memcache comparison of docs/BENCHMARKS.md: granary serve against
# memcached (DRAM) and memcached with extstore on the same disk, in two
# scenarios (the dataset fits memcached's memory; the dataset is 4x the
# memory given to memcached and extstore). Installs memcached and
# libmemcached-tools (memcaslap) when missing. Writes docs/results/bench-memcache-*.json
# and, with matplotlib, docs/results/bench-memcache.png. The first run also measures
# the device reference (fio; installed when missing): the machine's CPU per
# 4 KiB direct read and the ceiling it puts on Granary in that scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v memcaslap >/dev/null || missing+=(libmemcached-tools)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cargo build --release -p granary-cli
G=./target/release/granary-bench
SECS=${SECS:-10}
# 1. 400K x 1 KiB (390 MiB) in 1 GiB of memcached memory.
$G memcache --keys 400K --memory-mib 1024 --secs "$SECS" --json docs/results/bench-memcache-fits.json
# 2. 512K x 1 KiB (512 MiB): 4x the 128 MiB given to memcached and extstore;
#    extstore-capped holds extstore to that memory (+64 MiB), page cache included
#    (a memory cgroup; needs root).
$G memcache --keys 512K --memory-mib 128 --secs "$SECS" \
    --peers memcached,extstore,extstore-capped,granary --no-device-ref --json docs/results/bench-memcache-4x.json
if python3 -c "import matplotlib" 2>/dev/null; then
    python3 scripts/plot_memcache.py docs/results/bench-memcache.png docs/results/bench-memcache-fits.json docs/results/bench-memcache-4x.json
fi
