#!/usr/bin/env bash
# Where the machine's CPU goes per memcache operation, for memcached and
# `granary serve` in one `granary-bench memcache` run: `perf record -a -g`
# over each peer's measured phase, then scripts/perf_split.py splits the
# samples of the client process and of the server process into client,
# kernel network path, device IO, parsing, engine, executor and the rest
# (docs/BENCHMARKS.md, "CPU per request (memcache)"). Needs root (or
# perf_event_paranoid <= 0), perf, memcached, and target/release/granary and
# granary-bench (cargo build --release -p granary-cli -p granary-bench).
#
#   scripts/memcache-cpu-profile.sh OUTDIR [zipf|uniform] [more granary-bench memcache flags]
#
# GRANARY_BIN picks another `granary` binary (an A/B against a build kept
# aside). Writes OUTDIR/{stdout,stderr,bench.json,perf-PEER.data} and
# prints each peer's split.
set -u
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUTDIR [zipf|uniform] [flags]}; dist=${2:-zipf}; shift; shift || true
mkdir -p "$out"
secs=8
# perf starts when the bench announces a peer's measured phase and records
# one second less than it, so the phase covers the whole recording.
./target/release/granary-bench memcache --peers memcached,granary --dist "$dist" --secs $secs \
    --no-memcaslap --no-device-ref --disk 1G "$@" --json "$out/bench.json" \
  2> >(while IFS= read -r l; do
         echo "$l" >> "$out/stderr"
         case "$l" in *"s of load with"*)
           p=${l#bench memcache: }; p=${p%%:*}
           perf record -F 499 -a -g -o "$out/perf-$p.data" -- sleep $((secs - 1)) >/dev/null 2>&1 &
         esac
       done) > "$out/stdout"
wait
cat "$out/stdout"
for p in memcached granary; do
  ops=$(python3 -c "import json,sys; r=[x for x in json.load(open('$out/bench.json'))['peers'] if x['peer']=='$p'][0]; print(int(r['ops_per_sec']*($secs-1)))")
  echo "== $p ($ops operations in the recording)"
  python3 scripts/perf_split.py "$out/perf-$p.data" "$p" "$ops"
done
