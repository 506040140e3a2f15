#!/usr/bin/env bash
# A local cluster behind twemproxy (Debian's `nutcracker`), docs/CLUSTER.md:
# N nodes on 127.0.0.2, 127.0.0.3, ... (each `granary serve` on its own data
# file; or memcached / redis-server nodes, for comparisons) and one
# nutcracker on 127.0.0.1 with a generated configuration. Every process it
# starts is recorded by PID in the cluster's directory and stopped by PID.
#
#   scripts/cluster.sh up N [options]   start N nodes and the proxy
#   scripts/cluster.sh down             stop the proxy and every node
#   scripts/cluster.sh status           processes, ports and the proxy's view
#   scripts/cluster.sh kill I           SIGKILL node I (1..N)
#   scripts/cluster.sh stop I           SIGTERM node I and wait for it to exit
#   scripts/cluster.sh start I          start node I again (same data file)
#   scripts/cluster.sh restart I        stop node I, then start it
#
# Every command takes --dir D (default target/cluster; or $GRANARY_CLUSTER_DIR).
# `up` options (the rest of the commands read them back from D/cluster.env):
#   --engine granary|memcached|redis   what the nodes run (default granary)
#   --weights W1,W2,...                the nodes' weights in the proxy (default 1 each)
#   --no-names                         server lines without names: nutcracker then
#                                      names a server "host:port" ("host" on port 11211)
#   --store                            granary nodes in store mode (--no-evict)
#   --size S                           each granary node's data file (default 256M)
#   --memory-mib M                     each memcached node's memory (default 256)
#   --dram-mib M                       each granary node's DRAM tier, its -m (default granary's, 64)
#   --threads T                        executor threads per node (default 1)
#   --mc-port P --resp-port P --native-port P
#                                      the nodes' ports, the same on every node's address
#                                      (defaults 11211, 6380, 43345)
#   --proxy-mc-port P                  the memcache pool (default 22121)
#   --proxy-resp-port P                the RESP pool (default 22122)
#   --proxy-store-port P               the memcache pool without ejection (default 22123)
#   --stats-port P                     nutcracker's stats (default 22222, on 127.0.0.1)
#   --retry-ms MS --failure-limit N    server_retry_timeout and server_failure_limit
#                                      (defaults 1000 and 2)
#   --timeout-ms MS                    the pools' timeout: a reply slower than this is
#                                      a SERVER_ERROR to the client (default 5000)
#   --server-connections C             the proxy's connections to each node, its
#                                      server_connections (default 1, nutcracker's)
# The granary binary: $GRANARY_BIN, else target/release/granary (built when missing).
set -euo pipefail
# Debian installs nutcracker in /usr/sbin.
PATH="$PATH:/usr/sbin:/sbin"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

cmd=${1:-}
[ -n "$cmd" ] || die "usage: cluster.sh up N | down | status | kill I | stop I | start I | restart I [--dir D] (see the script's head)"
shift
arg=
case "$cmd" in
up | kill | stop | start | restart)
    arg=${1:-}
    [[ "$arg" =~ ^[0-9]+$ ]] || die "$cmd needs a number"
    shift
    ;;
down | status) ;;
*) die "unknown command $cmd" ;;
esac

DIR=${GRANARY_CLUSTER_DIR:-$ROOT/target/cluster}
ENGINE=granary WEIGHTS= NAMES=1 STORE=0 SIZE=256M MEMORY_MIB=256 DRAM_MIB= THREADS=1
MC_PORT=11211 RESP_PORT=6380 NATIVE_PORT=43345
PROXY_MC_PORT=22121 PROXY_RESP_PORT=22122 PROXY_STORE_PORT=22123 STATS_PORT=22222
RETRY_MS=1000 FAILURE_LIMIT=2 TIMEOUT_MS=5000 SERVER_CONNS=1
while (($#)); do
    o=$1
    case "$o" in
    --no-names) NAMES=0 ;;
    --store) STORE=1 ;;
    --dir | --engine | --weights | --size | --memory-mib | --dram-mib | --threads | --mc-port | --resp-port | --native-port | \
        --proxy-mc-port | --proxy-resp-port | --proxy-store-port | --stats-port | --retry-ms | --failure-limit | --timeout-ms | \
        --server-connections)
        (($# >= 2)) || die "$o needs a value"
        v=$2
        shift
        case "$o" in
        --dir) DIR=$v ;;
        --engine) ENGINE=$v ;;
        --weights) WEIGHTS=$v ;;
        --size) SIZE=$v ;;
        --memory-mib) MEMORY_MIB=$v ;;
        --dram-mib) DRAM_MIB=$v ;;
        --threads) THREADS=$v ;;
        --mc-port) MC_PORT=$v ;;
        --resp-port) RESP_PORT=$v ;;
        --native-port) NATIVE_PORT=$v ;;
        --proxy-mc-port) PROXY_MC_PORT=$v ;;
        --proxy-resp-port) PROXY_RESP_PORT=$v ;;
        --proxy-store-port) PROXY_STORE_PORT=$v ;;
        --stats-port) STATS_PORT=$v ;;
        --retry-ms) RETRY_MS=$v ;;
        --failure-limit) FAILURE_LIMIT=$v ;;
        --timeout-ms) TIMEOUT_MS=$v ;;
        --server-connections) SERVER_CONNS=$v ;;
        esac
        ;;
    *) die "unknown option $o" ;;
    esac
    shift
done
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
ENV_FILE=$DIR/cluster.env

if [ "$cmd" = up ]; then
    [ ! -e "$DIR/nutcracker.pid" ] || die "$DIR already has a cluster (cluster.sh down --dir $DIR first)"
    N=$arg
    ((N >= 1 && N <= 200)) || die "N must be 1..200"
    case "$ENGINE" in granary | memcached | redis) ;; *) die "--engine granary, memcached or redis" ;; esac
    if [ -z "$WEIGHTS" ]; then
        WEIGHTS=$(printf '1%.0s,' $(seq "$N"))
        WEIGHTS=${WEIGHTS%,}
    fi
    IFS=, read -r -a ws <<<"$WEIGHTS"
    ((${#ws[@]} == N)) || die "--weights needs $N weights"
    for w in "${ws[@]}"; do [[ "$w" =~ ^[1-9][0-9]*$ ]] || die "bad weight $w"; done
    for v in "$MEMORY_MIB" "$THREADS" "$MC_PORT" "$RESP_PORT" "$NATIVE_PORT" "$PROXY_MC_PORT" "$PROXY_RESP_PORT" \
        "$PROXY_STORE_PORT" "$STATS_PORT" "$RETRY_MS" "$FAILURE_LIMIT" "$TIMEOUT_MS" "$SERVER_CONNS"; do
        [[ "$v" =~ ^[0-9]+$ ]] || die "not a number: $v"
    done
    [[ "$SIZE" =~ ^[0-9]+[A-Za-z]*$ ]] || die "bad --size $SIZE"
    ((SERVER_CONNS >= 1)) || die "--server-connections must be at least 1"
    [[ "$DRAM_MIB" =~ ^[0-9]*$ ]] || die "not a number: $DRAM_MIB"
    BIN=
    if [ "$ENGINE" = granary ]; then
        BIN=${GRANARY_BIN:-$ROOT/target/release/granary}
        if [ ! -x "$BIN" ]; then
            [ -z "${GRANARY_BIN:-}" ] || die "GRANARY_BIN=$BIN is not executable"
            (cd "$ROOT" && cargo build --release -p granary-cli --bin granary)
        fi
    fi
    command -v nutcracker >/dev/null || die "nutcracker not found (apt-get install nutcracker; scripts/test.sh installs it)"
    cat >"$ENV_FILE" <<EOF
N=$N
ENGINE=$ENGINE
BIN='$BIN'
WEIGHTS=$WEIGHTS
NAMES=$NAMES
STORE=$STORE
SIZE=$SIZE
MEMORY_MIB=$MEMORY_MIB
DRAM_MIB=$DRAM_MIB
THREADS=$THREADS
MC_PORT=$MC_PORT
RESP_PORT=$RESP_PORT
NATIVE_PORT=$NATIVE_PORT
PROXY_MC_PORT=$PROXY_MC_PORT
PROXY_RESP_PORT=$PROXY_RESP_PORT
PROXY_STORE_PORT=$PROXY_STORE_PORT
STATS_PORT=$STATS_PORT
RETRY_MS=$RETRY_MS
FAILURE_LIMIT=$FAILURE_LIMIT
TIMEOUT_MS=$TIMEOUT_MS
SERVER_CONNS=$SERVER_CONNS
EOF
else
    [ -f "$ENV_FILE" ] || die "no cluster in $DIR (no cluster.env)"
    # shellcheck disable=SC1090
    . "$ENV_FILE"
fi
IFS=, read -r -a ws <<<"$WEIGHTS"

ip_of() { echo "127.0.0.$(($1 + 1))"; }

# The PID in file $1 if that process is alive and its command line
# contains $2 (so a reused PID is never signalled).
live_pid() {
    local f=$1 mark=$2 pid
    [ -f "$f" ] || return 1
    pid=$(cat "$f")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$mark" || return 1
    # A zombie has exited.
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
    echo "$pid"
}

# Whether something accepts connections on $1:$2.
accepting() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# Refuse to start a server on an address:port another process serves: the
# new one would fail to bind while its waits met the other's listener
# (a second cluster on the same ports measured the first one).
need_free() {
    local ip=$1 port i
    shift
    for port in "$@"; do
        # A node this script just stopped may keep its listener a moment
        # while the kernel tears its io_uring down (as `serve` retries a
        # bind): waited for, bounded.
        for ((i = 0; i < 30; i++)); do
            accepting "$ip" "$port" || continue 2
            sleep 0.1
        done
        die "$ip:$port is served by another process already (another cluster? see --*-port)"
    done
}

# Whether process $1 runs (not exited, not a zombie).
running() {
    kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# Wait (bounded) until something accepts connections on $1:$2 while
# process $3 runs; fails if it exits.
wait_port() {
    local ip=$1 port=$2 pid=$3 i
    for ((i = 0; i < 600; i++)); do
        running "$pid" || return 1
        if accepting "$ip" "$port"; then
            # The listener is its (the ports were free before it started),
            # unless it failed to bind another of its ports and is exiting.
            running "$pid" || return 1
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# Wait (bounded) for process $1 to exit.
wait_exit() {
    local pid=$1 i
    for ((i = 0; i < 300; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 0
        sleep 0.1
    done
    return 1
}

node_dir() { echo "$DIR/node-$1"; }
node_mark() {
    case "$ENGINE" in
    granary) echo "$(node_dir "$1")/granary.db" ;;
    memcached) echo "-l $(ip_of "$1") -p $MC_PORT" ;;
    redis) echo "$(ip_of "$1"):$RESP_PORT" ;;
    esac
}

start_node() {
    local i=$1 ip d pid port
    ip=$(ip_of "$i")
    d=$(node_dir "$i")
    mkdir -p "$d"
    if pid=$(live_pid "$d/pid" "$(node_mark "$i")"); then die "node $i is running (pid $pid)"; fi
    case "$ENGINE" in
    granary) need_free "$ip" "$MC_PORT" "$RESP_PORT" "$NATIVE_PORT" ;;
    memcached) need_free "$ip" "$MC_PORT" ;;
    redis) need_free "$ip" "$RESP_PORT" ;;
    esac
    case "$ENGINE" in
    granary)
        local extra=()
        ((STORE)) && extra+=(--no-evict)
        [ -z "$DRAM_MIB" ] || extra+=(-m "$DRAM_MIB")
        # Nodes share the machine's cores: executors sleep when idle.
        GRANARY_LOG=${GRANARY_LOG:-info} setsid "$BIN" serve --data "$d/granary.db" --size "$SIZE" -l "$ip" \
            -p "$MC_PORT" --resp-port "$RESP_PORT" --native-port "$NATIVE_PORT" -t "$THREADS" --io-spin-us 0 \
            "${extra[@]}" </dev/null >>"$d/log" 2>&1 &
        port=$NATIVE_PORT
        ;;
    memcached)
        setsid memcached -l "$ip" -p "$MC_PORT" -U 0 -t "$THREADS" -m "$MEMORY_MIB" -c 4096 -u root \
            </dev/null >>"$d/log" 2>&1 &
        port=$MC_PORT
        ;;
    redis)
        setsid redis-server --bind "$ip" --port "$RESP_PORT" --save '' --appendonly no --dir "$d" \
            --dbfilename "dump-$ip:$RESP_PORT.rdb" </dev/null >>"$d/log" 2>&1 &
        port=$RESP_PORT
        ;;
    esac
    pid=$!
    echo "$pid" >"$d/pid"
    # The native listener (granary's last) accepting means the node serves.
    wait_port "$ip" "$port" "$pid" || {
        tail -5 "$d/log" >&2
        die "node $i ($ip) did not start"
    }
}

stop_pid() {
    local pid=$1 sig=$2
    kill "-$sig" "$pid" 2>/dev/null || return 0
    wait_exit "$pid" || {
        kill -KILL "$pid" 2>/dev/null || true
        wait_exit "$pid" || true
    }
}

stop_node() {
    local i=$1 sig=$2 pid
    if pid=$(live_pid "$(node_dir "$i")/pid" "$(node_mark "$i")"); then stop_pid "$pid" "$sig"; fi
    rm -f "$(node_dir "$i")/pid"
}

server_lines() {
    local port=$1 i
    for ((i = 1; i <= N; i++)); do
        if ((NAMES)); then
            echo "   - $(ip_of "$i"):$port:${ws[i - 1]} node$i"
        else
            echo "   - $(ip_of "$i"):$port:${ws[i - 1]}"
        fi
    done
}

pool() {
    local name=$1 listen=$2 port=$3 redis=$4 eject=$5
    cat <<EOF
$name:
  listen: 127.0.0.1:$listen
  redis: $redis
  hash: md5
  distribution: ketama
  auto_eject_hosts: $eject
  server_retry_timeout: $RETRY_MS
  server_failure_limit: $FAILURE_LIMIT
  timeout: $TIMEOUT_MS
  preconnect: true
  server_connections: $SERVER_CONNS
  servers:
$(server_lines "$port")
EOF
}

write_config() {
    {
        echo "# Generated by scripts/cluster.sh (docs/CLUSTER.md)."
        if [ "$ENGINE" != redis ]; then
            pool granary_mc "$PROXY_MC_PORT" "$MC_PORT" false true
            pool granary_store "$PROXY_STORE_PORT" "$MC_PORT" false false
        fi
        if [ "$ENGINE" != memcached ]; then
            pool granary_resp "$PROXY_RESP_PORT" "$RESP_PORT" true true
        fi
    } >"$DIR/nutcracker.yml"
}

start_proxy() {
    [ "$ENGINE" = redis ] || need_free 127.0.0.1 "$PROXY_MC_PORT" "$PROXY_STORE_PORT"
    [ "$ENGINE" = memcached ] || need_free 127.0.0.1 "$PROXY_RESP_PORT"
    need_free 127.0.0.1 "$STATS_PORT"
    write_config
    nutcracker -t -c "$DIR/nutcracker.yml" >/dev/null 2>"$DIR/nutcracker-test.log" || {
        cat "$DIR/nutcracker-test.log" >&2
        die "nutcracker rejects $DIR/nutcracker.yml"
    }
    # -i: the stats port's figures are at most 100 ms old.
    setsid nutcracker -c "$DIR/nutcracker.yml" -o "$DIR/nutcracker.log" -a 127.0.0.1 -s "$STATS_PORT" -i 100 \
        -p "$DIR/nutcracker.own.pid" </dev/null >>"$DIR/nutcracker.log" 2>&1 &
    local pid=$!
    echo "$pid" >"$DIR/nutcracker.pid"
    local port=$PROXY_MC_PORT
    [ "$ENGINE" != redis ] || port=$PROXY_RESP_PORT
    wait_port 127.0.0.1 "$port" "$pid" && wait_port 127.0.0.1 "$STATS_PORT" "$pid" || {
        tail -5 "$DIR/nutcracker.log" >&2
        die "nutcracker did not start"
    }
}

stop_proxy() {
    local pid
    if pid=$(live_pid "$DIR/nutcracker.pid" "$DIR/nutcracker.yml"); then stop_pid "$pid" TERM; fi
    rm -f "$DIR/nutcracker.pid" "$DIR/nutcracker.own.pid"
}

check_index() {
    ((arg >= 1 && arg <= N)) || die "node $arg: the cluster has nodes 1..$N"
}

# Per pool and server: requests, errors and when it was ejected (0: never).
STATS_PY='
import json, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
s = json.loads(sys.stdin.read())
for pool, p in sorted(s.items()):
    if isinstance(p, dict):
        for srv, v in sorted(p.items()):
            if isinstance(v, dict):
                print("  %s %s: requests %s errors %s ejected_at %s"
                      % (pool, srv, v.get("requests"), v.get("server_err"), v.get("server_ejected_at")))
'

status() {
    local i pid ip
    echo "cluster in $DIR: $N $ENGINE node(s), weights $WEIGHTS"
    for ((i = 1; i <= N; i++)); do
        ip=$(ip_of "$i")
        if pid=$(live_pid "$(node_dir "$i")/pid" "$(node_mark "$i")"); then
            case "$ENGINE" in
            granary) echo "node$i $ip up (pid $pid): memcache $ip:$MC_PORT resp $ip:$RESP_PORT native $ip:$NATIVE_PORT" ;;
            memcached) echo "node$i $ip up (pid $pid): memcache $ip:$MC_PORT" ;;
            redis) echo "node$i $ip up (pid $pid): resp $ip:$RESP_PORT" ;;
            esac
        else
            echo "node$i $ip down"
        fi
    done
    if pid=$(live_pid "$DIR/nutcracker.pid" "$DIR/nutcracker.yml"); then
        echo "nutcracker up (pid $pid): memcache pool 127.0.0.1:$PROXY_MC_PORT, store pool 127.0.0.1:$PROXY_STORE_PORT," \
            "resp pool 127.0.0.1:$PROXY_RESP_PORT, stats 127.0.0.1:$STATS_PORT"
        # The proxy's view: per pool and server, requests, errors and ejection time.
        local stats
        stats=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$STATS_PORT && cat <&3" 2>/dev/null || true)
        if [ -n "$stats" ] && [ -x /usr/bin/python3 ]; then
            /usr/bin/python3 -c "$STATS_PY" <<<"$stats" || true
        fi
    else
        echo "nutcracker down"
    fi
}

case "$cmd" in
up)
    # A failed start stops whatever did start.
    if ! (
        for ((i = 1; i <= N; i++)); do start_node "$i"; done
        start_proxy
    ); then
        stop_proxy
        for ((i = 1; i <= N; i++)); do stop_node "$i" TERM; done
        die "up failed: stopped what had started (logs in $DIR)"
    fi
    status
    ;;
down)
    stop_proxy
    for ((i = 1; i <= N; i++)); do stop_node "$i" TERM; done
    ;;
status) status ;;
kill)
    check_index
    stop_node "$arg" KILL
    ;;
stop)
    check_index
    stop_node "$arg" TERM
    ;;
start)
    check_index
    start_node "$arg"
    ;;
restart)
    check_index
    stop_node "$arg" TERM
    start_node "$arg"
    ;;
esac
