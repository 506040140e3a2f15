#!/usr/bin/env bash
# Model-checks the index's lock, seqlock and migration protocol with loom
# (crates/index/src/loom_tests.rs): the index built with `--cfg loom`, in
# its own target directory so the normal build is not invalidated.
# LOOM_MAX_PREEMPTIONS raises the preemption bound (default 2; 3 takes
# about 20 s here).
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test --release -p granary-index --lib loom_tests -- --nocapture --test-threads 1
