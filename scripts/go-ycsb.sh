#!/usr/bin/env bash
# Builds go-ycsb (github.com/pingcap/go-ycsb, the YCSB port in Go with a
# redis binding) into target/go-ycsb/go-ycsb when it is absent, and prints
# its path. `go install ...@v1.0.3` fails (the module's go.mod has replace
# directives), so this builds from the module's source as downloaded by
# `go mod download`. The workload files are copied next to the binary
# (target/go-ycsb/workloads/), where `granary-bench ycsb` looks for them.
# Installs Go (Debian's golang-go) when `go` is missing. The first build
# takes a few minutes. GO_YCSB_VERSION overrides the version (default v1.0.3).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${GO_YCSB_VERSION:-v1.0.3}
OUT=target/go-ycsb
BIN=$OUT/go-ycsb
if [ -x "$BIN" ] && [ -d "$OUT/workloads" ]; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null; then
    echo "installing golang-go (go is missing)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go >/dev/null
fi
mkdir -p "$OUT"
# `go mod download` outside a module works in module mode; GOFLAGS=-mod=mod
# keeps a vendor directory or an outer go.work out of the way.
dir=$(cd "$OUT" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "github.com/pingcap/go-ycsb@$VERSION" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['Dir'])")
src=$OUT/src
rm -rf "$src"
cp -r "$dir" "$src"
chmod -R u+w "$src"
echo "building go-ycsb $VERSION in $src (a few minutes the first time)" >&2
(cd "$src" && go build -buildvcs=false -o ../go-ycsb.tmp ./cmd/go-ycsb)
rm -rf "$OUT/workloads"
cp -r "$src/workloads" "$OUT/workloads"
mv "$OUT/go-ycsb.tmp" "$BIN"
echo "$BIN"
