#!/usr/bin/env bash
# Packs the server comparisons of docs/BENCHMARKS.md ("On a 16-core
# machine") into one tarball, to run them on another x86-64 Linux machine
# (more cores than this one, its own disk) that has neither Rust nor the
# peers: granary and granary-bench (release, stripped), go-ycsb and its
# workload files (scripts/go-ycsb.sh), memcached, redis-server,
# redis-benchmark and nutcracker as installed here (installed when
# missing), the shared
# libraries they load beyond glibc, scripts/cluster.sh and
# scripts/bench-cluster.sh, and run.sh, which runs the comparisons there.
#
#   scripts/bench-bundle.sh [OUT]      default target/bench-bundle.tar.xz
#
# On the other machine (as root: the capped peers need a memory cgroup):
#
#   mkdir b && tar -xJf bench-bundle.tar.xz -C b && b/run.sh RESULTS [SECS]
#
# run.sh writes RESULTS/log.txt (every step's output, with its start time)
# and one JSON per step: YCSB A and B with every peer (4 server threads,
# 32 go-ycsb threads), redis-benchmark's tests against redis-none (the
# server at 4 threads), memcache with Zipfian keys and with 4x the memory,
# the cluster's 4x case, and the device's own random reads and writes
# through the engine. Its data goes to RESULTS/data (about 8 GiB at most),
# removed at the end. A binary built here needs a glibc at least as new as
# this machine's (Debian 12: 2.36); the libraries are added to the
# search path only if the other machine lacks one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/bench-bundle.tar.xz}
PATH="$PATH:/usr/sbin:/sbin"
missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
command -v nutcracker >/dev/null || missing+=(nutcracker)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cargo build --release -p granary-cli -p granary-bench
ycsb=$(scripts/go-ycsb.sh)
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin" "$S/lib" "$S/scripts"
cp target/release/granary target/release/granary-bench "$ycsb" "$S/bin/"
for t in memcached redis-server redis-benchmark nutcracker; do cp "$(command -v $t)" "$S/bin/"; done
strip "$S/bin/"*
cp -r "$(dirname "$ycsb")/workloads" "$S/workloads"
cp scripts/cluster.sh scripts/bench-cluster.sh "$S/scripts/"
# Every library the peers load but glibc's own (the loader, libc, libm,
# libpthread, libdl, librt: the other machine's are used).
for t in memcached redis-server redis-benchmark nutcracker; do
    ldd "$S/bin/$t" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(ld-linux[^/]*|libc|libm|libpthread|libdl|librt)\.so' | while read -r l; do
    cp -L "$l" "$S/lib/"
done
cat >"$S/run.sh" <<'RUN'
#!/usr/bin/env bash
# The comparisons, on the machine this bundle was unpacked on (see
# scripts/bench-bundle.sh in Granary's repository). RESULTS: the folder
# for the log and the JSON; SECS: seconds per measured phase (default 6).
set -u
B=$(cd "$(dirname "$0")" && pwd)
R=${1:?usage: run.sh RESULTS [SECS]}
SECS=${2:-6}
mkdir -p "$R" && R=$(cd "$R" && pwd)
D=$R/data
mkdir -p "$D"
export PATH=$B/bin:$PATH GRANARY_BIN=$B/bin/granary
if ldd "$B"/bin/* 2>/dev/null | grep -q "not found"; then
    export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
LOG=$R/log.txt
T0=$(date +%s)
step() { echo "### +$(($(date +%s) - T0))s: $1" | tee -a "$LOG"; }
step env
{
    nproc
    uname -r
    grep PRETTY /etc/os-release
    free -g
    cat /sys/fs/cgroup/cgroup.controllers
    memcached -V
    redis-server --version
    nutcracker -V
    granary --version
} >>"$LOG" 2>&1
BENCH=$B/bin/granary-bench
step ycsb
$BENCH ycsb --go-ycsb "$B/bin/go-ycsb" --workloads-dir "$B/workloads" --datatypes string --records 100K \
    --secs "$SECS" --server-threads 4 --no-redis-benchmark --dir "$D/ycsb" --workloads a,b \
    --peers granary,granary-flush,granary-lru4x,redis-always,redis-none,redis-lru4x --json "$R/ycsb.json" >>"$LOG" 2>&1
step redis-benchmark
$BENCH ycsb --go-ycsb "$B/bin/go-ycsb" --workloads-dir "$B/workloads" --datatypes string --records 10K \
    --operations 10K --server-threads 4 --rb-requests 100K --dir "$D/rb" --workloads c \
    --peers granary,redis-none --json "$R/redis-benchmark.json" >>"$LOG" 2>&1
M="$BENCH memcache --no-memcaslap --no-device-ref --server-threads 4 --secs $SECS --disk 2G --dir $D/mc"
step mc-zipf
$M --keys 400K --memory-mib 1024 --dist zipf --peers memcached,granary --json "$R/mc-zipf.json" >>"$LOG" 2>&1
step mc-4x
$M --keys 512K --memory-mib 128 --peers memcached,extstore-capped,granary --json "$R/mc-4x.json" >>"$LOG" 2>&1
step cluster
(cd "$B" && MODE=4x NODES=3 SECS=$SECS CONC=32 BENCH_BIN=$BENCH OUT=$D/cluster JSON=$R/cluster-4x.json \
    scripts/bench-cluster.sh) >>"$LOG" 2>&1
step device
$BENCH device --no-fio --backends uring --depths 1,32,128 --secs 2 --size 2G --path "$D/device.data" \
    --json "$R/device.json" >>"$LOG" 2>&1
step done
rm -rf "$D"
RUN
chmod +x "$S/run.sh"
mkdir -p "$(dirname "$OUT")"
tar -cJf "$OUT" -C "$S" .
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): on the other machine, mkdir b && tar -xJf $(basename "$OUT") -C b && b/run.sh RESULTS"
