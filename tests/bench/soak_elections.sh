#!/usr/bin/env bash
# Elections without a fault: a 3-node palisade cluster (announcing to a proxy in front of
# an nginx upstream) runs for SOAK_DURATION_S while `palisade bench` loads the proxy with
# 1 KiB PUTs carrying the leader's token; nothing is paused, cut or slowed. Every second
# each node's leader view is read; an election is a rise of the highest term seen after
# the first established leader. The answer must be 0: a cluster that elects under load
# alone would fail over (and raise the token) for nothing.
#
# Not run by `cargo test`: it takes minutes. The nodes run at palisade's defaults, plus
# SOAK_NODE_ARGS (space-separated flags for every node, e.g. candidate defaults such as
# "--tick-ms 50"), so that a proposed change of the defaults can be soaked before it is
# made.
#
# Environment (defaults): SOAK_DURATION_S (600), SOAK_CONNECTIONS (8: the load's
# connections), SOAK_NODE_ARGS (none), BENCH_DIR (/var/tmp), BENCH_KEEP (0),
# BENCH_QUIET_WAIT (0), BENCH_NO_BUILD (0).
# Exit status: 0 when no election happened, 1 otherwise (or on a setup failure).
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

DURATION_S="${SOAK_DURATION_S:-600}"
CONNECTIONS="${SOAK_CONNECTIONS:-8}"
# shellcheck disable=SC2206 # flags are split on spaces on purpose
NODE_ARGS=(${SOAK_NODE_ARGS:-})
# Longest wait for the first established leader whose token the proxy holds.
LEADER_WAIT_S=30

need nginx nginx
need python3 python3
build_palisade
make_workdir
machine_report
wait_quiet

UPSTREAM_PORT="$(free_port)"
start_upstream "$UPSTREAM_PORT"
PROXY_PORT="$(free_port)"
ADMIN_PORT="$(free_port)"
start_palisade_proxy proxy "$PROXY_PORT" "$ADMIN_PORT" 1 "" --upstream "http://127.0.0.1:$UPSTREAM_PORT"

declare -A RAFT API
peers=""
for i in 1 2 3; do
  RAFT[$i]="$(free_port)"
  API[$i]="$(free_port)"
  peers+="${peers:+,}$i=127.0.0.1:${RAFT[$i]}"
done
for i in 1 2 3; do
  spawn "node$i" "$PALISADE" node --id "$i" --peers "$peers" --data-dir "$BENCH_WORK/node$i" \
    --api "127.0.0.1:${API[$i]}" --announce "http://127.0.0.1:$ADMIN_PORT" "${NODE_ARGS[@]}"
done
for i in 1 2 3; do
  wait_for_line "$BENCH_WORK/node$i.out" "listening on"
done

apis="${API[1]},${API[2]},${API[3]}"
# The established leader's token, once the proxy's fence holds it.
token="$(python3 - "$apis" "$ADMIN_PORT" "$LEADER_WAIT_S" <<'EOF'
import json, sys, time, urllib.request
apis, admin, wait = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + wait
while time.monotonic() < deadline:
    for port in apis:
        try:
            v = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/leader", timeout=1))
            f = json.load(urllib.request.urlopen(f"http://127.0.0.1:{admin}/v1/fences/default", timeout=1))
        except OSError:
            continue
        if v["role"] == "leader" and v["token"] is not None and f.get("token") == v["token"]:
            print(v["token"])
            sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
EOF
)" || die "no established leader whose token the proxy holds within ${LEADER_WAIT_S}s"
log "leader established with token $token; soaking for ${DURATION_S}s with $CONNECTIONS connections of load"

spawn load "$PALISADE" bench --url "http://127.0.0.1:$PROXY_PORT/soak" --method PUT \
  --body-bytes 1024 --token "$token" --connections "$CONNECTIONS" --duration "$DURATION_S" --json
LOAD_PID="$SPAWNED"

# Poll every node's term each second for the duration; print the figures as JSON.
python3 - "$apis" "$DURATION_S" "$token" >"$BENCH_WORK/terms.json" <<'EOF'
import json, sys, time, urllib.request
apis, duration, token = sys.argv[1].split(","), float(sys.argv[2]), int(sys.argv[3])
start = time.monotonic()
first = None
highest = 0
leaders = set()
unanswered = 0
changes = []
while time.monotonic() - start < duration:
    tick = time.monotonic()
    for port in apis:
        try:
            v = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/leader", timeout=2))
        except OSError:
            unanswered += 1
            continue
        if first is None:
            first = v["term"]
            highest = first
        if v["term"] > highest:
            changes.append({"at_s": round(tick - start, 1), "node": v["node_id"], "term": v["term"]})
            highest = v["term"]
        if v.get("leader_id"):
            leaders.add(v["leader_id"])
    time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
json.dump({"first_term": first, "last_term": highest, "elections": highest - (first or 0),
           "term_changes": changes, "leaders_seen": sorted(leaders),
           "unanswered_polls": unanswered, "token": token}, sys.stdout)
EOF
wait "$LOAD_PID" || log "the load generator ended with an error: $(tail -3 "$BENCH_WORK/load.err")"

status=0
(python3 - "$BENCH_WORK/terms.json" "$BENCH_WORK/load.out" "$DURATION_S" "$CONNECTIONS" \
  "${SOAK_NODE_ARGS:-none}" <<'EOF'
import json, sys
terms = json.load(open(sys.argv[1]))
try:
    load = json.load(open(sys.argv[2]))
except ValueError:
    load = {}
print(f"\nsoak: {sys.argv[3]} s, 3 nodes, node flags beyond the defaults: {sys.argv[5]}; "
      f"load {sys.argv[4]} connections of 1 KiB PUTs")
print(f"elections (term rises): {terms['elections']} (term {terms['first_term']} to "
      f"{terms['last_term']}); leaders seen: {terms['leaders_seen']}; "
      f"unanswered polls: {terms['unanswered_polls']}")
for c in terms["term_changes"]:
    print(f"  term {c['term']} seen on node {c['node']} at {c['at_s']} s")
if load:
    print(f"load: {load.get('answered')} answered, {load.get('ok')} 2xx, "
          f"{load.get('rps', 0):,.0f} req/s, {load.get('errors')} errors")
else:
    print("load: no report")
sys.exit(0 if terms["elections"] == 0 else 1)
EOF
) || status=$?
log "done, $(uptime | sed 's/.*load average/load average/')"
exit "$status"
