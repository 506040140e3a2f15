#!/usr/bin/env bash
# CPU per YCSB operation, of the server and of go-ycsb (the client), for
# `granary serve` and redis-server (no persistence): 200 K string records,
# then workloads C (reads) and A (50% updates), 100 K operations each, 32
# threads, zipfian keys. The figures explain docs/BENCHMARKS.md's "Redis
# protocol" results on a machine whose cores the client shares with the
# server. Needs target/release/granary (cargo build --release -p
# granary-cli), go-ycsb (scripts/go-ycsb.sh) and redis-server. GARGS adds
# `granary serve` flags (e.g. GARGS="--io-spin-us 0").
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
Y=$ROOT/target/go-ycsb/go-ycsb; W=$ROOT/target/go-ycsb/workloads
D=$(mktemp -d); trap 'rm -rf "$D"' EXIT
GARGS=${GARGS:-}
# Wait (10 s at most) until the server on port $1 answers PING.
up() { for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.1; done; echo "no server on $1" >&2; exit 1; }
cpu() { awk '{print $14+$15}' /proc/$1/stat; }   # clock ticks
tick=$(getconf CLK_TCK)
run() { # name pid port
  local name=$1 pid=$2 port=$3
  $Y load redis -P $W/workloada -p redis.addr=127.0.0.1:$port -p recordcount=200000 -p threadcount=32 -p redis.datatype=string > $D/$name-load.txt 2>&1
  for w in c a; do
    s0=$(cpu $pid); t0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o $D/$name-$w.time $Y run redis -P $W/workload$w -p redis.addr=127.0.0.1:$port -p recordcount=200000 -p operationcount=100000 -p threadcount=32 -p requestdistribution=zipfian -p redis.datatype=string > $D/$name-$w.txt 2>&1
    s1=$(cpu $pid); t1=$(date +%s.%N)
    ops=$(grep -E "^TOTAL|TOTAL " $D/$name-$w.txt | tail -1)
    read cu cs < $D/$name-$w.time
    python3 - "$name" "$w" "$s0" "$s1" "$t0" "$t1" "$cu" "$cs" "$tick" <<'PY'
import sys
n,w,s0,s1,t0,t1,cu,cs,tick=sys.argv[1:]
wall=float(t1)-float(t0); srv=(float(s1)-float(s0))/float(tick); cli=float(cu)+float(cs)
ops=100000
print(f"{n:12} {w}: {ops/wall:8.0f} ops/s  server {srv*1e6/ops:6.1f} us/op  client {cli*1e6/ops:6.1f} us/op  both {(srv+cli)/wall*100/2:5.1f}% of 2 cores")
PY
  done
}
$ROOT/target/release/granary serve --data $D/g.db --size 2G -p 23211 --no-native --resp-port 23380 --no-evict $GARGS > $D/g.log 2>&1 &
G=$!; up 23380; run granary $G 23380; kill $G; wait $G 2>/dev/null
redis-server --port 23379 --bind 127.0.0.1 --save "" --appendonly no --dir $D > $D/r.log 2>&1 &
R=$!; up 23379; run redis-none $R 23379; kill $R; wait $R 2>/dev/null
