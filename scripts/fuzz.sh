#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of untrusted bytes (docs/FUZZING.md).
#
#   scripts/fuzz.sh [MINUTES] [TARGET...]
#
# Runs each target (all of `fuzz/fuzz_targets/` by default) for MINUTES
# (default 1) with libFuzzer through `cargo +nightly fuzz run`, starting from
# the committed corpus `fuzz/corpus/<target>/` (read only) and a working
# corpus in `fuzz/target/corpus/<target>/` (what the run learns; kept
# between runs, not committed). A crash is written to
# `fuzz/artifacts/<target>/`; the script goes on with the other targets and
# exits non-zero at the end. It prints libFuzzer's final figures per
# target (executions, edge coverage, features, corpus size, peak RSS) and
# writes them to fuzz/target/summary.txt.
#
# Needs the nightly toolchain (rustup toolchain install nightly) and
# cargo-fuzz, which it installs from crates.io when missing. Extra libFuzzer
# flags can be given in GRANARY_FUZZ_FLAGS (e.g. "-jobs=4 -workers=4").
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-1}
[ $# -gt 0 ] && shift
if ! [[ $minutes =~ ^[0-9]+$ ]] || [ "$minutes" -lt 1 ]; then
    echo "usage: scripts/fuzz.sh [MINUTES] [TARGET...]" >&2
    exit 2
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh needs the nightly toolchain: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
# cargo-fuzz's builds (sanitizer and coverage flags) never share the
# workspace's target directory.
export CARGO_TARGET_DIR="$PWD/fuzz/target"
cd fuzz
if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < <(cargo +nightly fuzz list); fi
# Build every target first (they share their dependencies), so a build
# failure shows here and the timed runs are all fuzzing.
for t in "${targets[@]}"; do cargo +nightly fuzz build "$t"; done
mkdir -p target/logs artifacts
summary=target/summary.txt
printf '%-16s %6s %14s %10s %8s %8s %8s %s\n' target secs executions exec/s cov ft corpus result > "$summary"
failed=0
for t in "${targets[@]}"; do
    mkdir -p "target/corpus/$t" "artifacts/$t"
    log="target/logs/$t.log"
    echo "== $t: ${minutes} min"
    # shellcheck disable=SC2086 # GRANARY_FUZZ_FLAGS is a list of flags
    if cargo +nightly fuzz run "$t" "target/corpus/$t" "corpus/$t" -- \
        -max_total_time=$((minutes * 60)) -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 \
        ${GRANARY_FUZZ_FLAGS:-} >"$log" 2>&1; then
        result=ok
    else
        result="CRASH (see fuzz/$log, fuzz/artifacts/$t/)"
        failed=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo '?')
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo '?')
    last=$(grep -E '^#[0-9]+' "$log" | grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*' | tail -1 || true)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.*corp: \([0-9]*\).*/\1/p' <<<"$last")
    printf '%-16s %6s %14s %10s %8s %8s %8s %s\n' "$t" $((minutes * 60)) "$execs" "$rate" "${cov:-?}" "${ft:-?}" \
        "${corp:-?}" "$result" | tee -a "$summary"
done
echo
cat "$summary"
exit $failed
