#!/usr/bin/env bash
# Builds the test control plane (tests/kube, one multicall binary `kcp`) into
# $CARGO_TARGET_DIR/kcp/kcp (default: <repo>/target/kcp/kcp) and prints its path.
# Rebuilds only when go.mod, go.sum, a Go file or the Go version changed (a stamp beside the
# binary holds their hash); concurrent callers wait on one lock, so parallel test binaries
# build it once. Needs Go (go.mod's version or newer) and the Go module proxy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out_dir=${CARGO_TARGET_DIR:-$repo/target}/kcp
bin=$out_dir/kcp
mkdir -p "$out_dir"

command -v go >/dev/null || { echo "tests/kube/build.sh: 'go' is not on PATH; install Go 1.24 or newer (the tests run a real Kubernetes control plane built from Go modules)" >&2; exit 1; }

# The Kubernetes version the binaries report: the k3s the product installs by default.
k8s=v1.33.4
k3s=${k8s}+k3s1
stamp=$( (cd "$here" && cat go.mod go.sum ./*.go build.sh; go version) | sha256sum | cut -d' ' -f1)

exec 9>"$out_dir/.lock"
flock 9
if [ -x "$bin" ] && [ "$(cat "$out_dir/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$bin"
  exit 0
fi
echo "tests/kube/build.sh: building the control plane (kube-apiserver, controller-manager, scheduler, etcd, kwok); a cold build takes about 5 minutes" >&2
start=$(date +%s)
v=k8s.io/component-base/version
cv=k8s.io/client-go/pkg/version
ldflags="-s -w"
for pkg in $v $cv; do
  ldflags="$ldflags -X $pkg.gitVersion=$k3s -X $pkg.gitMajor=1 -X $pkg.gitMinor=33 -X $pkg.gitTreeState=clean -X $pkg.buildDate=2025-08-01T00:00:00Z"
done
(cd "$here" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
echo "$stamp" > "$out_dir/stamp"
echo "tests/kube/build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
