#!/usr/bin/env bash
# Run on a 16-core machine from the repository root (run 16), the bundle of
# scripts/bench-bundle.sh at .dev16/bundle.tar.xz: redis-benchmark with
# spread keys (fewer requests than run 15's, which ran past its limit),
# memcache Zipf at 128 connections again, and the YCSB flush pair again.
set -u
T0=$(date +%s)
B=/tmp/b; R=/tmp/r3; mkdir -p $B $R
tar -xJf .dev16/bundle.tar.xz -C $B || exit 1
export PATH=$B/bin:$PATH GRANARY_BIN=$B/bin/granary
ldd $B/bin/* 2>/dev/null | grep -q "not found" && export LD_LIBRARY_PATH=$B/lib
BENCH=$B/bin/granary-bench
step() { echo "### $1 +$(( $(date +%s) - T0 ))" | tee -a $R/log.txt; }
step env
{ nproc; granary --version; } >>$R/log.txt 2>&1
step rb-keyspace
timeout 100 $BENCH ycsb --go-ycsb $B/bin/go-ycsb --workloads-dir $B/workloads --datatypes string --records 10K \
  --operations 10K --server-threads 4 --rb-requests 20K --rb-keyspace 100000 --dir /tmp/d/rb --workloads c \
  --peers granary,redis-none --json $R/rb-keyspace.json >>$R/log.txt 2>&1
rm -rf /tmp/d
step mc-zipf-128
timeout 60 $BENCH memcache --no-memcaslap --no-device-ref --server-threads 4 --secs 6 --disk 2G --dir /tmp/d/mc \
  --keys 400K --memory-mib 1024 --dist zipf --conns 128 --peers memcached,granary --json $R/mc-zipf-128.json >>$R/log.txt 2>&1
rm -rf /tmp/d
step ycsb-flush
timeout 80 $BENCH ycsb --go-ycsb $B/bin/go-ycsb --workloads-dir $B/workloads --datatypes string --records 100K \
  --secs 6 --server-threads 4 --no-redis-benchmark --dir /tmp/d/y --workloads a,b \
  --peers granary-flush,redis-always --json $R/ycsb-flush.json >>$R/log.txt 2>&1
rm -rf /tmp/d
step end
cp $R/log.txt $OUT/log.txt
tar -czf $OUT/results.tgz -C $R .
