#!/usr/bin/env bash
# Failover, side by side: a 3-node palisade cluster (with a proxy the nodes announce to)
# and a 3-member etcd cluster, each at its own default timing: the same heartbeat
# (100 ms); palisade's election timeout of 500 ms (5 ticks) with its default score
# ranking (`static`: the best-ranked follower campaigns one tick after the timeout, the
# others a rank slot later each), etcd's of 1000 ms randomized up to twice that; pre-vote
# on in both (palisade's default; etcd 3.4's default is off). Each trial
# pauses the leader with SIGSTOP and times, from the signal:
#   palisade (`palisade bench failover`): a new leader is elected; its token is at the
#            proxy (GET /v1/fences/default rose: the paused leader's writes are refused);
#            a write with the new token is accepted at the proxy (a client following the
#            nodes' GET /v1/leader long polls PUTs as soon as one reports a new token), and
#            from the nodes' logs where the time went: detection (until a node campaigns),
#            election (until it leads), establishment (until it holds the token) and the
#            announce (until every proxy acknowledged the term);
#   etcd (tests/bench/etcd_failover.py): another member reports a new leader; a put
#            through another member commits in the new term.
# Then SIGCONT, let the cluster settle, repeat. Blocks of trials alternate between the two
# systems; the report gives medians and maxima over all trials.
#
# Environment (defaults): BENCH_TRIALS (20 per system), BENCH_BLOCKS (2: the trials are
# split into this many alternating blocks), BENCH_SETTLE_MS (1000), BENCH_POLL_MS (10),
# BENCH_DIR (/var/tmp), BENCH_KEEP (0), BENCH_QUIET_WAIT (0), BENCH_NO_BUILD (0).
# BENCH_PALISADE_ARGS (none): flags for every palisade node, space-separated, each as
# --flag=value (e.g. "--score-oracle=off --election-ticks=10", the old defaults). With it, the palisade
# side is run by pole_eval.py's `failover` (which times the same moments the same way
# and starts `palisade node` with exactly these flags, everything else at the node's
# defaults) instead of `palisade bench failover`; etcd is unchanged. That is how
# candidate defaults are measured against etcd before they are made the defaults.
# Default run time: about 3 minutes plus the build; each block is bounded by `timeout`.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

TRIALS="${BENCH_TRIALS:-20}"
BLOCKS="${BENCH_BLOCKS:-2}"
SETTLE_MS="${BENCH_SETTLE_MS:-1000}"
POLL_MS="${BENCH_POLL_MS:-10}"
HEARTBEAT_MS=100
# etcd's default election timeout.
ELECTION_MS=1000
# Palisade counts in ticks, at its defaults: 100 ms ticks, heartbeat 1 tick, election 5
# ticks (`palisade bench failover` names each, so they are given here explicitly).
TICK_MS=100
PALISADE_ELECTION_TICKS=5
# Longest one block may take, in seconds: a trial takes about 3 s.
BLOCK_BUDGET_S=$((TRIALS * 6 / BLOCKS + 30))

need etcd etcd-server
need etcdctl etcd-client
need python3 python3
build_palisade
make_workdir
machine_report
wait_quiet

HERE="$(cd "$(dirname "$0")" && pwd)"
per_block=$(((TRIALS + BLOCKS - 1) / BLOCKS))

for block in $(seq "$BLOCKS"); do
  log "block $block of $BLOCKS: palisade, $per_block trials"
  if [ -n "${BENCH_PALISADE_ARGS:-}" ]; then
    node_args=()
    for a in $BENCH_PALISADE_ARGS; do
      node_args+=("--node-arg=$a")
    done
    mkdir -p "$BENCH_WORK/palisade-$block"
    spawn "palisade-$block" timeout -s TERM -k 10 "$((BLOCK_BUDGET_S + 30))" \
      python3 "$HERE/pole_eval.py" failover --bin "$PALISADE" --work "$BENCH_WORK/palisade-$block" \
      --trials "$per_block" --poll-ms "$POLL_MS" --settle-ms "$SETTLE_MS" \
      --budget-s "$BLOCK_BUDGET_S" "${node_args[@]}"
  else
    spawn "palisade-$block" timeout -s TERM -k 10 "$((BLOCK_BUDGET_S + 30))" \
      "$PALISADE" bench failover --trials "$per_block" --tick-ms "$TICK_MS" \
      --heartbeat-ticks $((HEARTBEAT_MS / TICK_MS)) --election-ticks "$PALISADE_ELECTION_TICKS" \
      --poll-ms "$POLL_MS" --settle-ms "$SETTLE_MS" --budget-s "$BLOCK_BUDGET_S" --json
  fi
  wait "$SPAWNED" || die "palisade failover block $block failed: $(tail -5 "$BENCH_WORK/palisade-$block.err")"
  sed 's/^/  /' "$BENCH_WORK/palisade-$block.err" >&2

  log "block $block of $BLOCKS: etcd, $per_block trials"
  mkdir -p "$BENCH_WORK/etcd-$block"
  spawn "etcd-$block" timeout -s TERM -k 10 "$((BLOCK_BUDGET_S + 30))" \
    python3 "$HERE/etcd_failover.py" --dir "$BENCH_WORK/etcd-$block" --trials "$per_block" \
    --heartbeat-ms "$HEARTBEAT_MS" --election-ms "$ELECTION_MS" --poll-ms "$POLL_MS" \
    --settle-ms "$SETTLE_MS" --budget-s "$BLOCK_BUDGET_S"
  wait "$SPAWNED" || die "etcd failover block $block failed: $(tail -5 "$BENCH_WORK/etcd-$block.err")"
  sed 's/^/  /' "$BENCH_WORK/etcd-$block.err" >&2
done

python3 - "$BENCH_WORK" "$BLOCKS" "$(nproc)" "${BENCH_PALISADE_ARGS:-}" <<'EOF'
import json, statistics, sys
work, blocks = sys.argv[1], int(sys.argv[2])
flags = sys.argv[4] or "none (the defaults; `palisade bench failover`)"
pal = [t for b in range(1, blocks + 1) for t in json.load(open(f"{work}/palisade-{b}.out"))["trials"]]
etcd = [t for b in range(1, blocks + 1) for t in json.load(open(f"{work}/etcd-{b}.out"))["trials"]]
def row(name, values):
    v = [x for x in values if x is not None]
    if not v:
        return f"| {name} | 0 | - | - | - |", None
    m = statistics.median(v)
    return f"| {name} | {len(v)} | {m:.0f} | {min(v):.0f} | {max(v):.0f} |", m
print(f"\nfailover benchmark: {sys.argv[3]} cores, 3 nodes each, heartbeat 100 ms, "
      f"election timeout: palisade's default 500 ms (score-ranked), etcd's 1000 ms; "
      f"leader paused with SIGSTOP\n"
      f"palisade node flags: {flags}\n")
print("| moment (from SIGSTOP) | trials | median ms | min ms | max ms |")
print("|---|---|---|---|---|")
lines = [row("palisade: new leader elected", (t["elected_ms"] for t in pal)),
         row("palisade: new token at the proxy", (t["announced_ms"] for t in pal)),
         row("palisade: a write with the new token accepted", (t.get("accepted_ms") for t in pal)),
         row("etcd: new leader elected", (t["elected_ms"] for t in etcd)),
         row("etcd: first write in the new term", (t["first_write_ms"] for t in etcd))]
for text, _ in lines:
    print(text)
(_, pe), (_, pa), (_, pw), (_, ee), (_, ew) = lines
if None not in (pe, pa, ee, ew):
    print(f"\nratios of medians: elected palisade/etcd {pe / ee:.2f}; "
          f"token at the proxy / etcd first write {pa / ew:.2f}")
    if pw is not None:
        print(f"ratio of medians: a write with the new token accepted / etcd first write {pw / ew:.2f}")
    pmax = max(t["announced_ms"] for t in pal if t["announced_ms"] is not None)
    emax = max(t["first_write_ms"] for t in etcd if t["first_write_ms"] is not None)
    print(f"ratio of maxima: token at the proxy / etcd first write {pmax / emax:.2f}")
# Where palisade's time went, per trial from the nodes' logs (absent with pole_eval.py).
steps = [t["log"] for t in pal if isinstance(t.get("log"), dict)]
def step(name, end, start=None):
    v = [s[end] - (s[start] if start else 0) for s in steps
         if s.get(end) is not None and (start is None or s.get(start) is not None)]
    return row(name, v)[0]
if steps:
    print("\n| palisade step (from the nodes' logs) | trials | median ms | min ms | max ms |")
    print("|---|---|---|---|---|")
    print(step("detection: SIGSTOP to the first campaign", "campaign_ms"))
    print(step("election: campaign to leader", "leader_ms", "campaign_ms"))
    print(step("establishment: leader to token held", "established_ms", "leader_ms"))
    print(step("announce: token held to every proxy acknowledged", "announced_ms", "established_ms"))
    acc = [(t["accepted_ms"] - t["log"]["established_ms"]) for t in pal
           if t.get("accepted_ms") is not None and isinstance(t.get("log"), dict)
           and t["log"].get("established_ms") is not None]
    print(row("client: token held to a write accepted", acc)[0])
EOF
