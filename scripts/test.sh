#!/usr/bin/env bash
# Runs every check CI runs: formatting, lints, and all tests.
# Installs the peer tools the tests compare against when they are missing
# (memcached, memccapable from libmemcached-tools, fio, which
# `granary bench memcache`'s device reference runs, and for the Redis
# protocol's tests redis-server, redis-cli and redis-benchmark from
# redis-tools, and redis-py; libnbd-bin, python3-libnbd and qemu-utils
# for the NBD server's client tests, and nbdfuse, fuse3, e2fsprogs and mount
# for its mount tests); nutcracker (twemproxy) for the cluster tests;
# python3-venv for the Python binding's virtual environment, and
# python3-gdbm for its benchmark's dbm.gnu.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v memccapable >/dev/null || missing+=(libmemcached-tools)
command -v fio >/dev/null || missing+=(fio)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
/usr/bin/python3 -c 'import redis' 2>/dev/null || missing+=(python3-redis)
/usr/bin/python3 -c 'import pylibmc' 2>/dev/null || missing+=(python3-pylibmc)
command -v nbdcopy >/dev/null || missing+=(libnbd-bin)
/usr/bin/python3 -c 'import nbd' 2>/dev/null || missing+=(python3-libnbd)
command -v qemu-io >/dev/null || missing+=(qemu-utils)
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
/usr/bin/python3 -c 'import dbm.gnu' 2>/dev/null || missing+=(python3-gdbm)
PATH="$PATH:/usr/sbin:/sbin" command -v nutcracker >/dev/null || missing+=(nutcracker)
# The NBD mount tests (crates/cli/tests/nbd.rs): nbdfuse (in libnbd-bin on
# Debian 12, its own package from Debian 13), fusermount3, mkfs.ext4 and
# fsck.ext4, losetup and mount (in /sbin for some users' PATH).
if ! command -v nbdfuse >/dev/null; then
    if apt-cache show nbdfuse >/dev/null 2>&1; then missing+=(nbdfuse); else missing+=(libnbd-bin); fi
fi
command -v fusermount3 >/dev/null || missing+=(fuse3)
PATH="$PATH:/usr/sbin:/sbin" command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
PATH="$PATH:/usr/sbin:/sbin" command -v losetup >/dev/null || missing+=(mount)
# The C API's tests (crates/capi/tests/c_api.rs) compile C with cc (which
# Rust's linking needs anyway) and the header as C++ with c++.
# The TLS tests (crates/cli/tests/tls.rs): openssl makes their certificates
# and is a client (s_client); pymemcache is a memcache client over TLS.
command -v openssl >/dev/null || missing+=(openssl)
/usr/bin/python3 -c 'import pymemcache' 2>/dev/null || missing+=(python3-pymemcache)
command -v cc >/dev/null || missing+=(gcc)
command -v c++ >/dev/null || missing+=(g++)
if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
if ((${#missing[@]})); then
    echo "installing ${missing[*]} (needed by the peer tests: memcache and Redis conformance, benchmarks, NBD clients and mounts)"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# (A fresh machine's package lists were empty when nbdfuse's package was
# looked for above: where it is a package of its own, it is one now.)
if ! command -v nbdfuse >/dev/null && apt-cache show nbdfuse >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nbdfuse >/dev/null
fi
# go-ycsb (a Go module, built once into target/go-ycsb) for the YCSB
# benchmark's test; that test is skipped if it cannot be built here.
./scripts/go-ycsb.sh >/dev/null || echo "go-ycsb could not be built: the YCSB benchmark test is skipped"
# The peer-dependent tests fail (instead of skipping) when a tool is missing.
export GRANARY_REQUIRE_PEERS=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
# The engine's suite again on the io_uring backend (O_DIRECT files; the
# synchronous API through private rings): granary_io::testdev. The crash
# simulation and the model tests choose their devices themselves.
GRANARY_TEST_BACKEND=uring cargo test -p granary-store --lib --test checkpoint --test gc --test cancel
# And in zoned mode, on the emulated zoned device (zones of the test's
# segment size; a zone rule broken fails the test): granary_io::testdev,
# docs/ARCHITECTURE.md "Zoned mode". The crash cases keep their own
# simulated devices (zoned crashes: tests/zoned.rs), so they are skipped.
GRANARY_TEST_BACKEND=zoned cargo test -p granary-store --lib --test checkpoint --test gc --test batch \
    --test namespaces --test blind --test scan --test ns_model --test cancel -- --skip crashes_ --skip batches_after_a_batch_cut_short
# The index's concurrency protocol under loom's model checker.
./scripts/loom.sh
# The Python binding (bindings/python, a Cargo workspace of its own): its
# formatting and lints, then `pip install` into a virtual environment under
# target/ and its pytest suite (the client tests start target/debug/granary).
(
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
    (cd bindings/python && cargo fmt -- --check && cargo clippy --all-targets -- -D warnings)
    # (The test profile, which `cargo test` built the binary with: not a
    # second build of the tree at another optimisation level.)
    cargo build --profile test -p granary-cli
    [ -x target/pyenv/bin/python ] || /usr/bin/python3 -m venv target/pyenv
    target/pyenv/bin/pip install -q 'maturin>=1.5,<2' pytest
    PATH="$PWD/target/pyenv/bin:$PATH" target/pyenv/bin/pip install -q --no-build-isolation --force-reinstall --no-deps ./bindings/python
    target/pyenv/bin/pytest -q bindings/python/tests
    # The abi3 wheel on the oldest CPython it is built for (3.9), when pyenv
    # has one: the wheel of the build above (cached: no rebuild), the same tests.
    py39=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.9.*/bin/python3.9 2>/dev/null | tail -n 1 || true)
    if [ -n "$py39" ]; then
        rm -rf target/pywheel
        PATH="$PWD/target/pyenv/bin:$PATH" target/pyenv/bin/pip wheel -q --no-build-isolation --no-deps -w target/pywheel ./bindings/python
        [ -x target/py39env/bin/python ] || "$py39" -m venv target/py39env
        target/py39env/bin/pip install -q pytest
        target/py39env/bin/pip install -q --force-reinstall --no-deps target/pywheel/granary-*-abi3-*.whl
        target/py39env/bin/pytest -q bindings/python/tests
    else
        echo "no CPython 3.9 under pyenv: the abi3 wheel was tested on $(target/pyenv/bin/python --version) only"
    fi
)
