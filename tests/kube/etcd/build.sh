#!/usr/bin/env bash
# Builds one real etcd member binary per etcd version a simulated k3s release bundles (a
# go.v<VERSION>.mod + go.v<VERSION>.sum pin in v3.5/ or v3.6/, the main of that etcd minor) into
# $CARGO_TARGET_DIR/etcd/etcd-v<VERSION> (default: <repo>/target/etcd/...) and prints the directory.
# Rebuilds a binary only when its pin, its main, this script or the Go version changed (a stamp
# beside each binary holds their hash); concurrent callers wait on one lock, so parallel test
# binaries build them once. The Go build cache is shared with tests/kube/build.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
out_dir=${CARGO_TARGET_DIR:-$repo/target}/etcd
mkdir -p "$out_dir"

command -v go >/dev/null || { echo "tests/kube/etcd/build.sh: 'go' is not on PATH; install Go 1.25 or newer (the tests run real etcd members built from etcd's Go modules)" >&2; exit 1; }

exec 9>"$out_dir/.lock"
flock 9
gov=$(go version)
for minor_dir in "$here"/v3.*; do
  for mod in "$minor_dir"/go.v*.mod; do
    file=$(basename "$mod")
    version=${file#go.}
    version=${version%.mod}
    bin=$out_dir/etcd-$version
    stamp=$( (cd "$minor_dir" && cat "$file" "go.$version.sum" go.mod ./*.go "$here/build.sh"; echo "$gov") | sha256sum | cut -d' ' -f1)
    if [ -x "$bin" ] && [ "$(cat "$bin.stamp" 2>/dev/null)" = "$stamp" ]; then
      continue
    fi
    echo "tests/kube/etcd/build.sh: building etcd $version" >&2
    start=$(date +%s)
    (cd "$minor_dir" && CGO_ENABLED=0 go build -modfile="$file" -mod=readonly -trimpath -ldflags "-s -w" -o "$bin.tmp" .)
    mv "$bin.tmp" "$bin"
    echo "$stamp" > "$bin.stamp"
    echo "tests/kube/etcd/build.sh: built etcd $version in $(( $(date +%s) - start ))s" >&2
  done
done
echo "$out_dir"
