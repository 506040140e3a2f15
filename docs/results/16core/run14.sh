#!/usr/bin/env bash
# Run on a 16-core machine from the repository root, the bundle of
# scripts/bench-bundle.sh at .dev16/bundle.tar.xz: its run.sh, then 64 go-ycsb threads
# for the 4x case and memcache Zipf at 128 connections.
# (Its extra steps set no LD_LIBRARY_PATH, so the Redis peers of the
# 64-client step failed to start there; run15.sh sets it.)
set -u
T0=$(date +%s)
B=/tmp/b; R=/tmp/r
mkdir -p $B $R && tar -xJf .dev16/bundle.tar.xz -C $B || exit 1
timeout 420 $B/run.sh $R 6
export PATH=$B/bin:$PATH
BENCH=$B/bin/granary-bench
step() { echo "### $1 +$(( $(date +%s) - T0 ))" | tee -a $R/log.txt; }
step ycsb-c64
timeout 100 $BENCH ycsb --go-ycsb $B/bin/go-ycsb --workloads-dir $B/workloads --datatypes string --records 100K \
  --secs 6 --server-threads 4 --threads 64 --no-redis-benchmark --dir /tmp/d/y64 --workloads a,b \
  --peers granary-flush,redis-always,granary-lru4x,redis-lru4x --json $R/ycsb-c64.json >>$R/log.txt 2>&1
rm -rf /tmp/d/y64
step mc-zipf-128
timeout 60 $BENCH memcache --no-memcaslap --no-device-ref --server-threads 4 --secs 6 --disk 2G --dir /tmp/d/mc \
  --keys 400K --memory-mib 1024 --dist zipf --conns 128 --peers memcached,granary --json $R/mc-zipf-128.json >>$R/log.txt 2>&1
rm -rf /tmp/d
step end
cp $R/log.txt $OUT/log.txt
tar -czf $OUT/results.tgz -C $R .
