# shellcheck shell=bash
# Sourced by .ci/kubectl.sh and .ci/image.sh (not run on its own): starts the simulator.
# start_sim WORK ARGS...: runs $CARGO_TARGET_DIR (default target)/debug/oxide-sim --state-dir WORK/sim ARGS... in the
# background (stdout WORK/sim.out, stderr WORK/sim.err), sets sim_pid for the caller's
# cleanup, waits for its ready line and exports KUBECONFIG (WORK/sim/kubeconfig). Uses the
# caller's `root` and `fail`.
start_sim() {
  local dir=$1
  shift
  # shellcheck disable=SC2154 # root is the caller's
  "${CARGO_TARGET_DIR:-$root/target}/debug/oxide-sim" --state-dir "$dir/sim" "$@" >"$dir/sim.out" 2>"$dir/sim.err" &
  sim_pid=$!
  for _ in $(seq 1 300); do
    grep -q '"kubeconfig"' "$dir/sim.out" 2>/dev/null && break
    kill -0 "$sim_pid" 2>/dev/null || { cat "$dir/sim.err" >&2; fail "oxide-sim exited"; }
    sleep 0.1
  done
  export KUBECONFIG="$dir/sim/kubeconfig"
  [ -f "$KUBECONFIG" ] || fail "oxide-sim wrote no kubeconfig"
}
