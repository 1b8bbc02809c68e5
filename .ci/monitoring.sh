#!/usr/bin/env bash
# What the operator is told, checked with Prometheus's own tool; runnable on its own or from
# .ci/run:
#   - promtool check rules on charts/oxide-controller/files/rules.yaml (the chart's
#     PrometheusRule carries that file as it is: tests/tests/manifests_drift.rs and
#     .ci/manifests.sh hold the two equal);
#   - promtool test rules on tests/monitoring/rules_test.yaml (each alert fires in one case and
#     stays quiet in another);
#   - promtool check metrics on the cluster metrics as the webhook renders them
#     (shared/tests/snapshots/cluster-metrics.prom, kept by the renderer's own test).
# promtool is Debian bookworm's (package prometheus): its .deb is fetched with apt-get download
# into the CI cache and only promtool is unpacked from it, nothing installed (the package would
# also start a Prometheus server). Needs apt's lists (apt-get update, which .ci/run does first).
set -euo pipefail
cd "$(dirname "$0")/.."

tools=${OXIDE_CONTROLLER_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/oxide-controller-ci}
debs=$tools/debs
mkdir -p "$debs"

# apt's candidate; its file name carries the version, so a new one is unpacked afresh.
deb=$(apt-get download --print-uris prometheus | awk '{ print $2 }')
[ -n "$deb" ] || { echo "apt has no candidate for prometheus (run apt-get update)" >&2; exit 1; }
promtool=$tools/promtool/${deb%.deb}/promtool
if ! [ -x "$promtool" ]; then
  if ! [ -f "$debs/$deb" ]; then
    # (apt warns that root downloads unsandboxed into a directory its _apt user cannot write.)
    (cd "$debs" && apt-get download -q prometheus 2>/dev/null) || (cd "$debs" && apt-get download prometheus)
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  dpkg-deb --fsys-tarfile "$debs/$deb" | tar -x -C "$work" ./usr/bin/promtool
  rm -rf "$tools/promtool"
  mkdir -p "$(dirname "$promtool")"
  mv "$work/usr/bin/promtool" "$promtool"
fi
"$promtool" --version 2>&1 | head -n 1

"$promtool" check rules charts/oxide-controller/files/rules.yaml
"$promtool" test rules tests/monitoring/rules_test.yaml
"$promtool" check metrics <shared/tests/snapshots/cluster-metrics.prom
echo "cluster metrics: promtool check metrics passed"
