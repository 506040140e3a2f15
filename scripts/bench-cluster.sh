#!/usr/bin/env bash
# The cluster benchmarks of docs/CLUSTER.md, through nutcracker (twemproxy)
# in front of nodes started by scripts/cluster.sh, granary nodes against
# memcached (or redis-server) nodes behind the same proxy configuration in
# the same run. Two modes:
#
# MODE=memaslap (the default): 1, 2 and 3 nodes; memaslap (memcaslap; its
# default mix, 90% get and 10% set, 1000-byte values) against granary nodes
# and memcached nodes whose memory holds the data set, and redis-benchmark
# (SET then GET, 1000-byte values) against granary and redis-server nodes.
# Prints, per run: operations per second, per node, the CPU time per
# operation of the nodes together and of the proxy (utime + stime from
# /proc over the run), and memaslap's share of gets that missed. memaslap
# gets only keys it has set in its run, so its data set is what the run's
# sets wrote and always fits memcached's memory: MODE=4x measures the
# larger data set.
#
# MODE=4x: NODES nodes (default 3) per engine, memcached first, then
# granary; each memcached node gets `-m MEM_MIB` and each granary node
# (cache mode: it evicts when its data file is full) the same MiB as its
# DRAM tier (`-m`) and a data file 4x its share of the data set. For each
# case of CASES (default "fit 4x": a data set of half the memcached nodes'
# memory, and one 4x it) `granary-bench memcache --peers at=PROXY` loads
# every key through the proxy, then drives a GET/SET mix (GET_PERCENT,
# default 90) over CONC connections for SECS seconds with DIST keys
# (uniform or zipf) of VALUE-byte values; a GET miss counts as a served
# operation. Prints per case and engine ops/s, hits/s, hit ratio, latency
# percentiles, the machine's CPU per operation and the nodes' peak resident
# memory, and granary's ratios to memcached; writes JSON to JSON (default
# target/bench-cluster/4x.json) and each run's bench report beside it.
#
# On one machine the nodes, the proxy and the load generators share the
# cores: compare engines within a run, not a scaling curve.
#
# SECS (seconds of load, default 10), REQS (redis-benchmark requests per
# test, default 100000), CONC (connections, default 16), NODES (default
# "1 2 3"; MODE=4x: one number, default 3), GRANARY_BIN (default
# target/release/granary, built if missing), BENCH_BIN (MODE=4x; default
# target/release/granary-bench, built if missing), MEM_MIB (MODE=4x,
# default 64), SERVER_CONNS (the proxy's connections to each node, its
# server_connections; default 1), the ports MC_PORT, RESP_PORT, NATIVE_PORT (the nodes'),
# PROXY_MC_PORT, PROXY_RESP_PORT, PROXY_STORE_PORT and STATS_PORT
# (nutcracker's; cluster.sh's defaults but 22121, 22122, 22123, 22222).
# Writes the table to target/bench-cluster/results.txt (MODE=4x:
# 4x.txt) too; OUT moves that folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin:/sbin"
MODE=${MODE:-memaslap}
case "$MODE" in memaslap | 4x) ;; *) echo "bench-cluster.sh: MODE=memaslap or MODE=4x" >&2 && exit 1 ;; esac
missing=()
command -v nutcracker >/dev/null || missing+=(nutcracker)
command -v memcached >/dev/null || missing+=(memcached)
if [ "$MODE" = memaslap ]; then
    command -v memcaslap >/dev/null || missing+=(libmemcached-tools)
    command -v redis-server >/dev/null || missing+=(redis-server)
    command -v redis-benchmark >/dev/null || missing+=(redis-tools)
fi
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export GRANARY_BIN=${GRANARY_BIN:-$PWD/target/release/granary}
[ -x "$GRANARY_BIN" ] || cargo build --release -p granary-cli --bin granary
SECS=${SECS:-10} REQS=${REQS:-100000} CONC=${CONC:-16} SERVER_CONNS=${SERVER_CONNS:-1}
MC_PORT=${MC_PORT:-11211} RESP_PORT=${RESP_PORT:-6380} NATIVE_PORT=${NATIVE_PORT:-43345}
PROXY_MC_PORT=${PROXY_MC_PORT:-22121} PROXY_RESP_PORT=${PROXY_RESP_PORT:-22122}
PROXY_STORE_PORT=${PROXY_STORE_PORT:-22123} STATS_PORT=${STATS_PORT:-22222}
OUT=${OUT:-target/bench-cluster}
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
    scripts/cluster.sh up "$n" --dir "$D" --engine "$engine" --mc-port "$MC_PORT" --resp-port "$RESP_PORT" \
        --native-port "$NATIVE_PORT" --proxy-mc-port "$PROXY_MC_PORT" --proxy-resp-port "$PROXY_RESP_PORT" \
        --proxy-store-port "$PROXY_STORE_PORT" --stats-port "$STATS_PORT" --server-connections "$SERVER_CONNS" \
        --size 512M "$@" >/dev/null
}

trap 'scripts/cluster.sh down --dir "$D" >/dev/null 2>&1 || true' EXIT
if [ "$MODE" = 4x ]; then
    N=${NODES:-3} MEM_MIB=${MEM_MIB:-64} CASES=${CASES:-"fit 4x"} VALUE=${VALUE:-1024}
    GET_PERCENT=${GET_PERCENT:-90} DIST=${DIST:-uniform} JSON=${JSON:-$OUT/4x.json}
    for v in "$N" "$MEM_MIB" "$VALUE" "$GET_PERCENT"; do
        [[ "$v" =~ ^[0-9]+$ ]] || { echo "bench-cluster.sh: MODE=4x: not a number: $v (NODES is one number)" >&2 && exit 1; }
    done
    BENCH_BIN=${BENCH_BIN:-$PWD/target/release/granary-bench}
    [ -x "$BENCH_BIN" ] || cargo build --release -p granary-cli --bin granary-bench
    RESULTS=$OUT/4x.txt
    started=$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)
    runs=()
    for c in $CASES; do
        case "$c" in
        fit) data=$((N * MEM_MIB * 1048576 / 2)) ;;
        4x) data=$((4 * N * MEM_MIB * 1048576)) ;;
        *) echo "bench-cluster.sh: CASES are fit and 4x, not $c" >&2 && exit 1 ;;
        esac
        # The bench's keys are "bench:" and 12 digits: a data set of keys x
        # (18 + VALUE) bytes.
        keys=$((data / (18 + VALUE)))
        # Each granary node's data file: 4x its share of the data set (room
        # for the garbage of the run's sets), so it evicts nothing.
        size_mib=$(((4 * data / N + 1048575) / 1048576))
        ((size_mib >= 64)) || size_mib=64
        for engine in memcached granary; do
            echo "bench-cluster.sh: $c: $N $engine nodes, $keys keys of $VALUE bytes" >&2
            case $engine in
            memcached) up "$N" memcached --memory-mib "$MEM_MIB" --timeout-ms 30000 ;;
            granary) up "$N" granary --dram-mib "$MEM_MIB" --size "${size_mib}M" --timeout-ms 30000 ;;
            esac
            # The pool without ejection, and (above) a proxy timeout as long
            # as the bench client's: a node stalled for seconds by the shared
            # cores keeps its keys and shows in the maximum latency instead of
            # failing the run.
            base=$OUT/4x-$c-$engine
            "$BENCH_BIN" memcache --peers "at=127.0.0.1:$PROXY_STORE_PORT" --keys "$keys" --value-bytes "$VALUE" \
                --get-percent "$GET_PERCENT" --dist "$DIST" --conns "$CONC" --secs "$SECS" --no-memcaslap \
                --no-device-ref --json "$base.json" >"$base.txt" 2>"$base.log" || {
                cat "$base.txt" "$base.log" >&2
                exit 1
            }
            # The nodes' peak resident memory (VmHWM), summed.
            kib=0
            for f in "$D"/node-*/pid; do
                k=$(awk '/^VmHWM:/ {print $2}' "/proc/$(cat "$f")/status" 2>/dev/null || true)
                kib=$((kib + ${k:-0}))
            done
            runs+=("$c $engine $keys $data $kib $base.json")
        done
        scripts/cluster.sh down --dir "$D" >/dev/null
    done
    META="{\"date\": \"$started\", \"cores\": $(nproc), \"load_average\": \"$load\", \"nodes\": $N,
        \"mem_mib_per_node\": $MEM_MIB, \"value_bytes\": $VALUE, \"get_percent\": $GET_PERCENT, \"dist\": \"$DIST\",
        \"conns\": $CONC, \"server_connections\": $SERVER_CONNS, \"secs\": $SECS, \"granary_bin\": \"$GRANARY_BIN\"}"
    /usr/bin/python3 - "$JSON" "$META" "${runs[@]}" <<'PY' | tee "$RESULTS"
import json, sys
out, meta, runs = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
print("# %s %d cores (load average %s); %d nodes per engine behind nutcracker (ketama, md5); "
      "memcached -m %d each, granary -m %d each (cache mode); %d%% get, %s keys, %d B values, %d connections, %s s"
      % (meta["date"], meta["cores"], meta["load_average"], meta["nodes"], meta["mem_mib_per_node"],
         meta["mem_mib_per_node"], meta["get_percent"], meta["dist"], meta["value_bytes"], meta["conns"], meta["secs"]))
print("%-4s %-10s %9s %9s %9s %9s %6s %8s %8s %8s %9s %10s %9s %7s" % ("case", "engine", "keys", "data MiB",
      "ops/s", "hits/s", "hit%", "get p50", "get p99", "set p99", "max us", "mach us/op", "nodes MiB", "errors"))
cases = []
for r in runs:
    c, engine, keys, data, kib, path = r.split(" ", 5)
    j = json.load(open(path))
    p = j["peers"][0]
    p["hits_per_sec"] = p["hits"] / j["secs"]
    p["nodes_peak_rss_mib"] = int(kib) / 1024
    if not cases or cases[-1]["case"] != c:
        cases.append({"case": c, "keys": int(keys), "data_mib": int(data) / 2**20, "engines": {}})
    cases[-1]["engines"][engine] = p
    print("%-4s %-10s %9d %9.0f %9.0f %9.0f %5.1f%% %8.0f %8.0f %8.0f %9.0f %10s %9.0f %7d" % (
        c, engine, int(keys), int(data) / 2**20, p["ops_per_sec"], p["hits_per_sec"], 100 * p["hit_ratio"],
        p["get_us"]["p50"], p["get_us"]["p99"], p["set_us"]["p99"], max(p["get_us"]["max"], p["set_us"]["max"]),
        "-" if p["machine_cpu_us_per_op"] is None else "%.1f" % p["machine_cpu_us_per_op"],
        p["nodes_peak_rss_mib"], p["errors"]))
for c in cases:
    g, m = c["engines"].get("granary"), c["engines"].get("memcached")
    if g and m:
        c["ops_ratio"] = g["ops_per_sec"] / max(m["ops_per_sec"], 1e-9)
        c["hits_ratio"] = g["hits_per_sec"] / max(m["hits_per_sec"], 1e-9)
        print("%s: granary / memcached: %.2fx ops/s, %.2fx hits/s" % (c["case"], c["ops_ratio"], c["hits_ratio"]))
json.dump(dict(meta, benchmark="cluster-4x", cases=cases), open(out, "w"), indent=2)
print("wrote %s" % out)
PY
    exit 0
fi
NODES=${NODES:-"1 2 3"}

# memaslap's key space: CONC windows of 10K keys of 1000 bytes (and a key
# and item header of about 100 bytes each); its data set is at most that.
DATA_MIB=$((CONC * 10000 * 1100 / 1048576))

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
        log=$(memcaslap -s "127.0.0.1:$PROXY_MC_PORT" -T 2 -c "$CONC" -t "${SECS}s" -X 1000 2>&1)
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
        redis-benchmark -h 127.0.0.1 -p "$PROXY_RESP_PORT" -t set,get -n "$REQS" -c "$CONC" -r 100000 -d 1000 -q >/dev/null 2>&1
        t1=$(now_ms) n1=$(ticks "${nodes[@]}") p1=$(ticks "$D/nutcracker.pid")
        report redis-benchmark "$engine" "$n" $((2 * REQS)) $((t1 - t0)) $((n1 - n0)) $((p1 - p0)) -
    done
done
