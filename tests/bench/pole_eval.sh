#!/usr/bin/env bash
# The POLE paper's wide-area evaluation, reproduced with palisade: three sites
# with the round trips of the paper's Table 2 (slac-caltech 9.88 ms, slac-fnal 53.26 ms,
# caltech-fnal 77.06 ms), a node per site (3 nodes: 1 caltech, 2 fnal, 3 slac) and the
# paper's 5-node layout (Fig. 5, Deployment 2: 1 and 2 at caltech, 3 at fnal, 4 and 5 at
# slac), the proxy "near" one site (slac by default: its round trip to a node is that
# site's). Each node's worker writes through the proxy while its node leads. Measured per
# election configuration (`off`: raft's randomized election; `default`: the node's
# defaults, the static oracle with every score 0, ranking by id; and each score oracle
# set for the layout): the write
# latency of the leader's worker (mean, p99), and the recovery time after a SIGKILL of
# the leader (until the first write with the new token is admitted). Details in
# pole_eval.py's docstring.
#
# Two emulations (POLE_NET below): namespaces with tc netem (needs root, iproute2 and a
# kernel with netem), or, where that cannot run, everything on loopback with the peer
# transport's test delays (PALISADE_TEST_FAULTS) and a delaying TCP relay between each
# node (its announcements, its worker) and the proxy. POLE_NET=netem without netem says
# "skipped" and exits 0.
#
# Environment (defaults): POLE_LAYOUTS (3,5), POLE_CONFIGS
# (off,default,storage-rtt,consensus-latency,rotating,static), POLE_PROXY_SITE (slac),
# POLE_TRIALS (5), POLE_WARM_S (6: past the default score hold of 3 s, so that a
# resignation to the best node has happened), POLE_MEASURE_S (6), POLE_INTERVAL_MS (20),
# POLE_NODE_ARGS (extra flags for every node, space-separated), BENCH_DIR (/var/tmp),
# BENCH_KEEP (0), BENCH_QUIET_WAIT (0).
# Run time: about 23 s per trial (6 configurations x 2 layouts x 5 trials: about 23
# minutes) plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

# POLE_NET: netem (namespaces and tc netem; needs root), relay (loopback: the peer
# transport's test delays and a delaying relay to the proxy), or auto (default: netem
# where it can run, else relay).
netem_available() {
  [ "$(id -u)" = 0 ] || return 1
  command -v tc >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 || return 1
  # Try it: netem may be missing from the kernel altogether (CONFIG_NET_SCH_NETEM).
  local ns="polecheck$$" ok=1
  ip netns add "$ns" 2>/dev/null || return 1
  ip netns exec "$ns" tc qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
  ip netns del "$ns" 2>/dev/null || true
  return "$ok"
}
POLE_NET="${POLE_NET:-auto}"
case "$POLE_NET" in
  netem)
    if ! netem_available; then
      echo "skipped: needs root and tc (with netem in the kernel)"
      exit 0
    fi
    ;;
  relay) ;;
  auto)
    if netem_available; then
      POLE_NET=netem
    else
      POLE_NET=relay
      log "tc netem cannot run here (not root, no tc, or a kernel without netem):" \
        "emulating the wide area with the peer transport's test delays and a relay to the proxy"
    fi
    ;;
  *) die "POLE_NET must be netem, relay or auto, not '$POLE_NET'" ;;
esac

HERE="$(cd "$(dirname "$0")" && pwd)"
# Namespace and bridge names carry this run's tag, so that the exit trap removes exactly
# what this run created; the subnet's third octet comes from it too.
POLE_TAG="$(($$ % 100000))"
POLE_SUBNET="$(($$ % 200 + 20))"

need nginx nginx
need python3 python3
build_palisade
make_workdir
# The exit trap of lib.sh stops the processes; this one also removes the namespaces and
# the bridge if the driver could not (it was killed, say).
pole_status=0
trap 'pole_status=$?; python3 "$HERE/pole_eval.py" cleanup --tag "$POLE_TAG" || true; (exit "$pole_status"); cleanup' EXIT
machine_report
wait_quiet

UPSTREAM_PORT="$(free_port)"
start_upstream "$UPSTREAM_PORT"

node_args=()
for a in ${POLE_NODE_ARGS:-}; do
  node_args+=("--node-arg=$a")
done

log "commit $(git -C "$BENCH_ROOT" rev-parse --short HEAD), $(uptime | sed 's/.*load average/load average/')"
spawn eval python3 "$HERE/pole_eval.py" eval --bin "$PALISADE" --work "$BENCH_WORK" \
  --net "$POLE_NET" --tag "$POLE_TAG" --subnet "$POLE_SUBNET" --upstream-port "$UPSTREAM_PORT" \
  --layouts "${POLE_LAYOUTS:-3,5}" \
  --configs "${POLE_CONFIGS:-off,default,storage-rtt,consensus-latency,rotating,static}" \
  --proxy-site "${POLE_PROXY_SITE:-slac}" --trials "${POLE_TRIALS:-5}" \
  --warm-s "${POLE_WARM_S:-6}" --measure-s "${POLE_MEASURE_S:-6}" \
  --interval-ms "${POLE_INTERVAL_MS:-20}" --out "$BENCH_WORK/results.json" "${node_args[@]}"
log "trials: one line each in $BENCH_WORK/eval.err as they end"
wait "$SPAWNED" || die "the evaluation failed: $(tail -5 "$BENCH_WORK/eval.err")"
cat "$BENCH_WORK/eval.err" >&2
cat "$BENCH_WORK/eval.out"
log "done, $(uptime | sed 's/.*load average/load average/')"
