#!/usr/bin/env bash
# The image, built and run with no Docker engine (issue 24):
#   - builds the three release binaries and an image of them with buildah (vfs storage, chroot
#     isolation) on a base made as distroless cc-debian12 is made: from Debian bookworm's .debs
#     (the packages below), the CA bundle, passwd/group with root, nonroot (65532) and nobody,
#     /tmp, no shell; tags it with the manifests' image name and prints its size;
#   - runs it under runc, host network, from an OCI runtime bundle unpacked from the image
#     itself (its user, command, environment, working directory), inside a simulator cluster:
#     oxide-sim --run-jobs-in-bundle runs the product's pods in the image with the commands,
#     args, env and ServiceAccount of the real pods the real CronJob, Job and Deployment
#     controllers make from k8s-cronjobs/ (tests/src/pods/oci_bundle.rs);
#   - checks the webhook (`scale serve` of webhook.yaml) answers /healthz 200, GET
#     /nodes/workers 200 with the Secret's token and 401 without; asks it for one worker more,
#     which starts the CronJob's Job, and checks that run in the image converges the cluster
#     to three Ready workers; then a Job made from the CronJob with kubectl succeeds too and
#     `scale status` reports a healthy cluster.
# Why runc and not podman or crun: in CI's sandbox `podman run` fails with "setrlimit
# RLIMIT_NOFILE: Operation not permitted" (podman always writes process.rlimits, which need
# CAP_SYS_RESOURCE), and crun refuses this machine's cgroup v1 with a cgroup2 `unified` mount
# ("cgroups in hybrid mode not supported"). runc runs the same OCI bundle, without rlimits.
# The Dockerfile stays the recipe for Docker users; tests/tests/image_recipe.rs holds it and
# the recipe below (binaries, install path, user, default command) in step.
# Needs root (buildah's storage, runc). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# The recipe; tests/tests/image_recipe.rs compares these with the Dockerfile.
IMAGE_BINARIES=(bootstrap reconcile-once scale)
IMAGE_BIN_DIR=/usr/local/bin
IMAGE_USER=65532:65532
IMAGE_CMD='["/usr/local/bin/reconcile-once", "--help"]'
# What distroless cc-debian12 is made of (GoogleContainerTools/distroless static/static.bzl,
# base/config.bzl, cc/config.bzl): static's base-files, netbase, tzdata, media-types (and the
# CA bundle from ca-certificates, below), base's libc6 and libssl3, cc's libgcc-s1, libgomp1,
# libstdc++6 and gcc-12-base.
BASE_DEBS=(base-files netbase tzdata media-types libc6 libssl3 libgcc-s1 libgomp1 libstdc++6 gcc-12-base)

step() { printf '\n==> %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=sim.sh
. "$root/.ci/sim.sh"
elapsed() { echo "($(( $(date +%s) - $1 ))s)"; }

tools=${OXIDE_CONTROLLER_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/oxide-controller-ci}
debs=$tools/debs
mkdir -p "$debs"
kubectl=${KUBECTL:-$tools/kubectl}
[ -x "$kubectl" ] || fail "no kubectl at $kubectl: run .ci/kubectl.sh first (it fetches one), or set KUBECTL"
# vfs storage (no overlay mounts needed), chroot isolation (no runtime for buildah's own use).
export BUILDAH_ISOLATION=chroot
buildah() { command buildah --storage-driver vfs "$@"; }
work=$(mktemp -d)
ctr=
sim_pid=
cleanup() {
  rc=$?
  if [ "$rc" != 0 ] && [ -s "$work/sim.err" ]; then
    echo "--- oxide-sim's log (last 60 lines)" >&2
    tail -n 60 "$work/sim.err" >&2
  fi
  if [ -n "$sim_pid" ]; then kill "$sim_pid" 2>/dev/null || true; wait "$sim_pid" 2>/dev/null || true; fi
  # The simulator deletes its containers as it stops; any left (it was killed) go here.
  if [ -d "$work/sim/runc" ]; then
    for id in $(runc --root "$work/sim/runc" list -q 2>/dev/null); do
      runc --root "$work/sim/runc" delete --force "$id" || true
    done
  fi
  if [ -n "$ctr" ]; then buildah rm "$ctr" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

step "tools: buildah, runc, umoci"
apt-get install -y -qq --no-install-recommends buildah runc umoci >/dev/null
buildah --version
runc --version | head -n 1
umoci --version

step "release build of ${IMAGE_BINARIES[*]}"
t=$(date +%s)
packages=()
for b in "${IMAGE_BINARIES[@]}"; do packages+=(-p "$b"); done
# As the Dockerfile builds them.
cargo build --release --locked --bins "${packages[@]}"
cargo build --locked -q -p oxide-controller-tests --bin oxide-sim
echo "built $(elapsed "$t")"

step "base packages (bookworm .debs, cached in $debs)"
t=$(date +%s)
# apt's candidates; a file already in the cache is not fetched again.
apt-get download --print-uris "${BASE_DEBS[@]}" ca-certificates >"$work/uris"
[ "$(wc -l <"$work/uris")" = $((${#BASE_DEBS[@]} + 1)) ] || { cat "$work/uris" >&2; fail "apt has no candidate for some base package"; }
while read -r _ file _; do
  [ -f "$debs/$file" ] || need=1
done <"$work/uris"
if [ "${need:-0}" = 1 ]; then
  # (apt warns that root downloads unsandboxed into a directory its _apt user cannot write.)
  (cd "$debs" && apt-get download -q "${BASE_DEBS[@]}" ca-certificates 2>"$work/apt.err") \
    || { cat "$work/apt.err" >&2; fail "apt-get download"; }
fi
deb_of() { awk -v p="$1" '{ split($2, f, "_"); if (f[1] == p) print $2 }' "$work/uris"; }
for p in "${BASE_DEBS[@]}" ca-certificates; do
  f=$(deb_of "$p")
  [ -f "$debs/$f" ] || fail "$f was not downloaded"
  echo "$f"
done
elapsed "$t"

image=$(sed -n 's/^ *image: *//p' k8s-cronjobs/cronjob.yaml | head -n 1)
[ -n "$image" ] || fail "k8s-cronjobs/cronjob.yaml names no image"
step "image $image: buildah from scratch"
t=$(date +%s)
buildah rmi -f "$image" >/dev/null 2>&1 || true
ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
mkdir -p "$mnt/var/lib/dpkg/status.d"
for p in "${BASE_DEBS[@]}"; do
  f=$debs/$(deb_of "$p")
  dpkg-deb -x "$f" "$mnt"
  # As distroless records its packages, for scanners (no dpkg in the image).
  dpkg-deb -f "$f" >"$mnt/var/lib/dpkg/status.d/$p"
done
# The CA bundle as update-ca-certificates writes it (distroless's cacerts rule): every
# certificate of the package, in order, each ending in a newline; plus the licence.
dpkg-deb -x "$debs/$(deb_of ca-certificates)" "$work/ca"
mkdir -p "$mnt/etc/ssl/certs" "$mnt/usr/share/doc/ca-certificates"
find "$work/ca/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | while read -r c; do awk 1 "$c"; done \
  >"$mnt/etc/ssl/certs/ca-certificates.crt"
cp "$work/ca/usr/share/doc/ca-certificates/copyright" "$mnt/usr/share/doc/ca-certificates/"
grep -c 'BEGIN CERTIFICATE' "$mnt/etc/ssl/certs/ca-certificates.crt" | xargs printf '%s CA certificates\n'
# distroless's users, groups, homes, /tmp and nsswitch.conf.
cat >"$mnt/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$mnt/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
cat >"$mnt/etc/nsswitch.conf" <<'EOF'
passwd:         compat
group:          compat
shadow:         compat
gshadow:        files

hosts:          files dns
networks:       files

protocols:      db files
services:       db files
ethers:         db files
rpc:            db files

netgroup:       nis
EOF
install -d -m 0700 "$mnt/root"
install -d -m 0700 -o 65532 -g 65532 "$mnt/home/nonroot"
install -d -m 1777 "$mnt/tmp"
install -d "$mnt$IMAGE_BIN_DIR"
for b in "${IMAGE_BINARIES[@]}"; do install -m 0755 "${CARGO_TARGET_DIR:-target}/release/$b" "$mnt$IMAGE_BIN_DIR/"; done

# Everything the binaries load is in the image; nothing shell-like is.
for b in "${IMAGE_BINARIES[@]}"; do
  for lib in $(ldd "${CARGO_TARGET_DIR:-target}/release/$b" | awk '$1 !~ /^linux-vdso/ { n = split($1, p, "/"); print p[n] }'); do
    [ -n "$(find "$mnt/lib" "$mnt/lib64" "$mnt/usr/lib" -name "$lib" -print -quit 2>/dev/null)" ] \
      || fail "$b needs $lib, which the image lacks"
  done
  echo "$b: $(ldd "${CARGO_TARGET_DIR:-target}/release/$b" | awk '$1 !~ /^linux-vdso/ { n = split($1, p, "/"); printf "%s ", p[n] }')"
done
shells=$(find "$mnt" \( -type f -o -type l \) \( -name sh -o -name bash -o -name dash -o -name busybox -o -name apt -o -name dpkg \) -print)
[ -z "$shells" ] || fail "the image holds a shell or package manager: $shells"

buildah config --user "$IMAGE_USER" --workingdir /home/nonroot \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --cmd "$IMAGE_CMD" --os linux --arch amd64 "$ctr"
buildah umount "$ctr" >/dev/null
buildah commit -q --rm "$ctr" "$image" >/dev/null
ctr=
# The committed image's config is the recipe's (no entrypoint, as the Dockerfile).
buildah inspect --type image "$image" | python3 -c '
import json, sys
config = json.load(sys.stdin)["OCIv1"]["config"]
want = {"User": sys.argv[1], "Cmd": json.loads(sys.argv[2]), "Entrypoint": None}
got = {k: config.get(k) for k in want}
print("image config:", got)
sys.exit(0 if got == want else "the image config is not the recipe: %s" % want)
' "$IMAGE_USER" "$IMAGE_CMD"
buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$image"
echo "built $(elapsed "$t")"

step "OCI layout and runtime bundle of the image"
buildah push -q "$image" "oci:$work/oci:image" >/dev/null
umoci unpack --image "$work/oci:image" "$work/bundle" >/dev/null
layers=$(find "$work/oci/blobs" -type f -size +100k -printf '%s\n' | awk '{ s += $1 } END { print s }')
binaries=$(du -cb --apparent-size "$work/bundle/rootfs$IMAGE_BIN_DIR"/* | tail -n 1 | cut -f1)
printf 'IMAGE SIZE: %s %s (buildah images); files %s MB, of which the binaries %s MB; pushed as a %s MB gzip layer\n' \
  "$image" "$(buildah images --format '{{.Size}}' "$image")" \
  "$(( $(du -sb --apparent-size "$work/bundle/rootfs" | cut -f1) / 1000000 ))" "$((binaries / 1000000))" "$((layers / 1000000))"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["process"]; print("bundle process:", p["user"], p["args"], p["cwd"])' "$work/bundle/config.json"

step "oxide-sim --preset cluster:1:2, the product's pods run in the image"
start_sim "$work" --preset cluster:1:2 --ssh-port 22991 --run-jobs-in-bundle "$work/bundle"
k() { "$kubectl" "$@"; }
k apply -f k8s-cronjobs/
# No scheduled run may overlap the ones started below; a suspended CronJob still serves as
# the template the webhook and `kubectl create job --from` copy.
k patch cronjob oxide-controller -n oxide-controller-jobs --type=merge -p '{"spec":{"suspend":true}}'
# Nor may the hourly backup run in the middle of what this step checks.
k patch cronjob oxide-controller-backup -n oxide-controller-backup --type=merge -p '{"spec":{"suspend":true}}'

step "the webhook in the image (webhook.yaml's scale serve): 200 with the token, 401 without"
k rollout status deployment/oxide-controller-webhook -n kube-system --timeout=60s
# Host network: the container listens on this machine at its manifest's containerPort.
# HTTPS with the pair in the Secret (its pod mounts the webhook's keys); the preset wrote the
# CA beside the kubeconfig, as bootstrap writes it beside the resume file.
port=$(k get deployment oxide-controller-webhook -n kube-system -o jsonpath='{.spec.template.spec.containers[0].ports[0].containerPort}')
url=https://127.0.0.1:$port
ca=$(dirname "$KUBECONFIG")/webhook-ca.pem
[ -s "$ca" ] || fail "no webhook CA at $ca"
for _ in $(seq 1 100); do
  curl -fsS --cacert "$ca" "$url/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
code() { curl -sS --cacert "$ca" -o "$work/body" -w '%{http_code}' "$@" || true; }
# Waits for Job $1 to succeed; fails at once when it fails.
job_succeeds() {
  for _ in $(seq 1 240); do
    state=$(k get job "$1" -n oxide-controller-jobs --ignore-not-found \
      -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}')
    case " $state " in
      *" Complete "*) echo "job/$1 succeeded"; return 0 ;;
      *" Failed "*) k describe job "$1" -n oxide-controller-jobs >&2; fail "job/$1 failed" ;;
    esac
    sleep 1
  done
  fail "job/$1 did not finish in 240 s"
}
[ "$(code "$url/healthz")" = 200 ] || fail "/healthz: not 200"
echo "GET /healthz: 200"
# Nothing else on this machine serves it: the simulator started the webhook's pod in the image.
grep -m 1 'runc run kube-system-oxide-controller-webhook-' "$work/sim.err" \
  || fail "the simulator's log shows no webhook pod run in the image"
token=$(k get secret oxide-controller-webhook-auth -n kube-system -o jsonpath='{.data.webhook-token}' | base64 -d)
[ -n "$token" ] || fail "Secret oxide-controller-webhook-auth has no webhook-token"
[ "$(code -H "Authorization: Bearer $token" "$url/nodes/workers")" = 200 ] || { cat "$work/body" >&2; fail "GET /nodes/workers with the token: not 200"; }
echo "GET /nodes/workers with the token: 200 $(cat "$work/body")"
[ "$(code "$url/nodes/workers")" = 401 ] || { cat "$work/body" >&2; fail "GET /nodes/workers without a token: not 401"; }
echo "GET /nodes/workers without a token: 401 $(cat "$work/body")"
[ "$(code -H "Authorization: Bearer wrong" "$url/nodes/workers")" = 401 ] || fail "GET /nodes/workers with a wrong token: not 401"
echo "GET /nodes/workers with a wrong token: 401"

step "PUT /nodes/workers 3: the CronJob's Job runs in the image and adds the third worker"
t=$(date +%s)
answer=$(code -X PUT -H "Authorization: Bearer $token" -H 'content-type: application/json' -d '{"count":3}' "$url/nodes/workers")
echo "PUT /nodes/workers: $answer $(cat "$work/body")"
[ "${answer:0:1}" = 2 ] || fail "PUT /nodes/workers: not 2xx"
job_succeeds oxide-controller-now
want_cmd=$(k get cronjob oxide-controller -n oxide-controller-jobs -o jsonpath='{.spec.jobTemplate.spec.template.spec.containers[0].command}')
got_cmd=$(k get job oxide-controller-now -n oxide-controller-jobs -o jsonpath='{.spec.template.spec.containers[0].command}')
[ "$want_cmd" = "$got_cmd" ] || fail "the Job runs $got_cmd, the CronJob $want_cmd"
grep -m 1 'runc run oxide-controller-jobs-oxide-controller-now-' "$work/sim.err" \
  || fail "the simulator's log shows no reconcile pod run in the image"
grep '\[oxide-controller-now-' "$work/sim.err" | tail -n 2
workers=0
for _ in $(seq 1 240); do
  workers=$(k get nodes --no-headers | awk '$2 == "Ready" && $3 !~ /control-plane/' | wc -l)
  [ "$workers" = 3 ] && break
  sleep 1
done
k get nodes
[ "$workers" = 3 ] || fail "$workers Ready workers, not 3"
echo "three Ready workers $(elapsed "$t")"

step "a Job from the CronJob (kubectl create job --from): the run in the image succeeds"
k create job image-check --from=cronjob/oxide-controller -n oxide-controller-jobs
job_succeeds image-check
grep -q 'runc run oxide-controller-jobs-image-check-' "$work/sim.err" || fail "the simulator's log shows no run of image-check in the image"
grep '\[image-check-' "$work/sim.err" | tail -n 3
"${CARGO_TARGET_DIR:-$root/target}/release/scale" --kubeconfig "$KUBECONFIG" status || fail "scale status: the cluster is not healthy"

echo
echo "image scenario passed"
