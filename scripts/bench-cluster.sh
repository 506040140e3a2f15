#!/usr/bin/env bash
# The cluster benchmark of docs/CLUSTER.md: throughput through nutcracker
# (twemproxy) in front of 1, 2 and 3 nodes started by scripts/cluster.sh:
# memaslap (memcaslap; its default mix, 90% get and 10% set, 1000-byte
# values) against granary nodes and memcached nodes whose memory holds the
# data set, and redis-benchmark
# (SET then GET, 1000-byte values) against granary and redis-server nodes,
# all in one run. Prints, per run: operations per second, per node, the
# CPU time per operation of the nodes together and of the proxy (utime +
# stime from /proc over the run), and memaslap's share of gets that missed.
# memaslap gets only keys it has set in its run, so the data set is what
# the run's sets wrote: a data set larger than memcached's memory needs a
# preloaded key space, which `granary-bench memcache` builds (one node,
# docs/BENCHMARKS.md), not this script. On one machine the nodes, the proxy and the
# load generators share the cores: these are costs per operation, not a
# scaling curve.
#
# SECS (memaslap seconds, default 10), REQS (redis-benchmark requests per
# test, default 100000), CONC (connections, default 16), NODES (default
# "1 2 3"), GRANARY_BIN (default target/release/granary, built if
# missing). Writes the table to target/bench-cluster/results.txt too.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin:/sbin"
missing=()
command -v nutcracker >/dev/null || missing+=(nutcracker)
command -v memcached >/dev/null || missing+=(memcached)
command -v memcaslap >/dev/null || missing+=(libmemcached-tools)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export GRANARY_BIN=${GRANARY_BIN:-$PWD/target/release/granary}
[ -x "$GRANARY_BIN" ] || cargo build --release -p granary-cli --bin granary
SECS=${SECS:-10} REQS=${REQS:-100000} CONC=${CONC:-16} NODES=${NODES:-"1 2 3"}
OUT=target/bench-cluster
D=$OUT/cluster
mkdir -p "$OUT"
TICK=$(getconf CLK_TCK)
RESULTS=$OUT/results.txt

# CPU ticks (user + system) of the PIDs in files $@ (0 for one not running).
ticks() {
    local t=0 f pid
    for f in "$@"; do
        pid=$(cat "$f" 2>/dev/null || echo 0)
        if [ -r "/proc/$pid/stat" ]; then
            t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
        fi
    done
    echo "$t"
}

now_ms() { date +%s%3N; }

# report TOOL ENGINE N OPS WALL_MS NODE_TICKS PROXY_TICKS MISS
report() {
    local tool=$1 engine=$2 n=$3 ops=$4 ms=$5 nt=$6 pt=$7 miss=$8
    awk -v tool="$tool" -v e="$engine" -v n="$n" -v ops="$ops" -v ms="$ms" -v nt="$nt" -v pt="$pt" -v tick="$TICK" \
        -v miss="$miss" 'BEGIN {
        rate = ops / (ms / 1000)
        printf "%-15s %-13s %3d %10.0f %10.0f %14.1f %15.1f %6s\n", tool, e, n, rate, rate / n,
            nt / tick * 1e6 / ops, pt / tick * 1e6 / ops, miss
    }' | tee -a "$RESULTS"
}

# up N ENGINE [cluster.sh options]
up() {
    local n=$1 engine=$2
    shift 2
    scripts/cluster.sh down --dir "$D" >/dev/null 2>&1 || true
    rm -rf "$D"
    scripts/cluster.sh up "$n" --dir "$D" --engine "$engine" --proxy-mc-port 22121 --proxy-resp-port 22122 \
        --proxy-store-port 22123 --stats-port 22222 --size 512M "$@" >/dev/null
}

# memaslap's key space: CONC windows of 10K keys of 1000 bytes (and a key
# and item header of about 100 bytes each); its data set is at most that.
DATA_MIB=$((CONC * 10000 * 1100 / 1048576))

trap 'scripts/cluster.sh down --dir "$D" >/dev/null 2>&1 || true' EXIT
{
    echo "# $(date -u +%FT%TZ) $(nproc) cores; memaslap $SECS s (key space ~$DATA_MIB MiB), redis-benchmark $REQS requests per test;" \
        "$CONC connections"
    printf "%-15s %-13s %3s %10s %10s %14s %15s %6s\n" tool engine n "ops/s" "ops/s/node" "node_cpu_us/op" \
        "proxy_cpu_us/op" miss
} | tee "$RESULTS"
for n in $NODES; do
    for engine in granary memcached; do
        case "$engine" in
        granary) up "$n" granary ;;
        memcached) up "$n" memcached --memory-mib $((DATA_MIB * 2 / n + 64)) ;;
        esac
        nodes=("$D"/node-*/pid)
        n0=$(ticks "${nodes[@]}") p0=$(ticks "$D/nutcracker.pid") t0=$(now_ms)
        log=$(memcaslap -s 127.0.0.1:22121 -T 2 -c "$CONC" -t "${SECS}s" -X 1000 2>&1)
        t1=$(now_ms) n1=$(ticks "${nodes[@]}") p1=$(ticks "$D/nutcracker.pid")
        ops=$(sed -n 's/.*Run time: .* Ops: \([0-9]*\) .*/\1/p' <<<"$log" | tail -1)
        gets=$(sed -n 's/^cmd_get: \([0-9]*\)/\1/p' <<<"$log" | tail -1)
        misses=$(sed -n 's/^get_misses: \([0-9]*\)/\1/p' <<<"$log" | tail -1)
        [ -n "$ops" ] && [ -n "$gets" ] && [ -n "$misses" ] || {
            echo "$log" >&2
            exit 1
        }
        miss=$(awk -v g="$gets" -v m="$misses" 'BEGIN { printf "%.1f%%", g ? 100 * m / g : 0 }')
        report memaslap "$engine" "$n" "$ops" $((t1 - t0)) $((n1 - n0)) $((p1 - p0)) "$miss"
    done
    for engine in granary redis; do
        up "$n" "$engine"
        nodes=("$D"/node-*/pid)
        n0=$(ticks "${nodes[@]}") p0=$(ticks "$D/nutcracker.pid") t0=$(now_ms)
        # nutcracker refuses CONFIG: redis-benchmark warns and goes on.
        redis-benchmark -h 127.0.0.1 -p 22122 -t set,get -n "$REQS" -c "$CONC" -r 100000 -d 1000 -q >/dev/null 2>&1
        t1=$(now_ms) n1=$(ticks "${nodes[@]}") p1=$(ticks "$D/nutcracker.pid")
        report redis-benchmark "$engine" "$n" $((2 * REQS)) $((t1 - t0)) $((n1 - n0)) $((p1 - p0)) -
    done
done
