#!/usr/bin/env bash
# The block device comparison of docs/BENCHMARKS.md ("Block device:
# `granary-bench nbd`"): fio's NBD engine (ioengine=nbd) against
# `granary serve --nbd-port`'s export and `nbdkit file` on a file on the
# same disk, and fio on a file directly (io_uring, O_DIRECT: the device's
# limit), in one run. Installs fio and nbdkit when missing, builds the
# release binaries, and writes docs/results/bench-nbd.json. SIZE, SECS,
# PEERS, JOBS, DIR and JSON override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v fio >/dev/null || missing+=(fio)
command -v nbdkit >/dev/null || missing+=(nbdkit)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! fio --enghelp=nbd 2>/dev/null | grep -q uri; then
    echo "this fio has no NBD engine (ioengine=nbd needs fio 3.19 or later built with libnbd)" >&2
    exit 1
fi
cargo build --release -p granary-cli
SIZE=${SIZE:-1G}
SECS=${SECS:-10}
PEERS=${PEERS:-granary,granary-flush,nbdkit,file}
JOBS=${JOBS:-randread-4k-qd1,randread-4k-qd32,read-1m-qd8,randwrite-4k-qd1,randwrite-4k-qd32,write-1m-qd8}
DIR=${DIR:-granary-data}
JSON=${JSON:-docs/results/bench-nbd.json}
./target/release/granary-bench nbd --size "$SIZE" --secs "$SECS" --peers "$PEERS" --jobs "$JOBS" \
    --dir "$DIR" --json "$JSON"
