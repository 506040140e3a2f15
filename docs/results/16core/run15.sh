#!/usr/bin/env bash
# Run right after run14.sh on the same machine (its bundle unpacked in /tmp/b).
set -u
T0=$(date +%s)
B=/tmp/b; R=/tmp/r2; mkdir -p $R
[ -x $B/bin/granary ] || { mkdir -p $B && tar -xJf .dev16/bundle.tar.xz -C $B || exit 1; }
export PATH=$B/bin:$PATH GRANARY_BIN=$B/bin/granary LD_LIBRARY_PATH=$B/lib
BENCH=$B/bin/granary-bench
step() { echo "### $1 +$(( $(date +%s) - T0 ))" | tee -a $R/log.txt; }
step ycsb-c64
timeout 110 $BENCH ycsb --go-ycsb $B/bin/go-ycsb --workloads-dir $B/workloads --datatypes string --records 100K \
  --secs 6 --server-threads 4 --threads 64 --no-redis-benchmark --dir /tmp/d/y64 --workloads a,b \
  --peers granary-flush,redis-always,granary-lru4x,redis-lru4x --json $R/ycsb-c64.json >>$R/log.txt 2>&1
rm -rf /tmp/d
step rb-keyspace
timeout 60 $BENCH ycsb --go-ycsb $B/bin/go-ycsb --workloads-dir $B/workloads --datatypes string --records 10K \
  --operations 10K --server-threads 4 --rb-requests 100K --rb-keyspace 100000 --dir /tmp/d/rb --workloads c \
  --peers granary,redis-none --json $R/rb-keyspace.json >>$R/log.txt 2>&1
rm -rf /tmp/d
step end
cp $R/log.txt $OUT/log.txt
tar -czf $OUT/results.tgz -C $R .
