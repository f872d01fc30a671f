#!/usr/bin/env bash
# The cost of fleet mode: proxy CPU per request of a proxy in fleet mode (`--cluster`,
# holding a lease from a one-node cluster started with `--lease-ms`) versus a standalone
# proxy, in one run. Both are in front of the same trivial upstream (nginx `return 200`),
# both with their fence at the same token (the fleet proxy's from the node's announce, the
# standalone one's set through its admin API), and every request (1 KiB PUT) carries that
# equal token, so the fleet proxy admits from its lease without waiting and renews only in
# the background (every lease_ms / 3); that background work is counted in its CPU. Rounds
# alternate the order; the proxies' CPU time comes from /proc/PID/stat (utime + stime)
# around each measured run. The report gives the medians of CPU per request, their ratio,
# and the per-round ratios; the goal is a ratio under 1.05.
#
# Each proxy runs 1 runtime thread pinned to CPU 0; the upstream, the node and the load
# generator (`palisade bench`) share CPU 1 (taskset), so the proxies never compete with
# them. On a machine with one CPU nothing is pinned.
#
# Environment (defaults): BENCH_ROUNDS (9), BENCH_DURATION (5 s), BENCH_WARMUP (1 s),
# BENCH_CONNECTIONS (32), BENCH_BODY_BYTES (1024), BENCH_LEASE_MS (3000), BENCH_DIR
# (/var/tmp), BENCH_KEEP (0), BENCH_QUIET_WAIT (0 s). Default run time: about 2 minutes
# plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

cost_settings 9 5
LEASE_MS="${BENCH_LEASE_MS:-3000}"

bench_start
need_fleet
split_cpus
start_results

up_port="$(free_port)"
start_upstream "$up_port" "$SIDE_CPUS"
up_pid="$SPAWNED"

# The fleet: a one-node cluster granting leases and announcing to the fleet proxy, whose
# admin URL (its name in the fleet) is fixed before either starts.
fleet_port="$(free_port)"
fleet_admin="$(free_port)"
fleet_url="http://127.0.0.1:$fleet_admin"
node_raft="$(free_port)"
node_api="$(free_port)"
name_flag=()
"$PALISADE" proxy --help | grep -q -- '--fleet-name' && name_flag=(--fleet-name "$fleet_url")
start_palisade_proxy fleet "$fleet_port" "$fleet_admin" 1 "$MAIN_CPUS" \
  --upstream "http://127.0.0.1:$up_port" --cluster "http://127.0.0.1:$node_api" "${name_flag[@]}"
fleet_pid="$(pgrep -g "$SPAWNED" -x palisade)"
spawn node "${PIN_SIDE[@]}" "$PALISADE" node --id 1 --peers "1=127.0.0.1:$node_raft" \
  --api "127.0.0.1:$node_api" --data-dir "$BENCH_WORK/node-data" \
  --lease-ms "$LEASE_MS" --announce "$fleet_url"
# Its pid once it runs as palisade (taskset execs it; before that, pgrep finds nothing).
wait_for_line "$BENCH_WORK/node.out" "listening on"
node_pid="$(pgrep -g "$SPAWNED" -x palisade)"
view="$(leader_view "$node_api" '"token":[0-9]' 30)"
TOKEN="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["token"])' "$view")" ||
  die "no token from the node: $view"
[ "$TOKEN" != None ] || die "the node released no token within 30 s: $view"
log "token $TOKEN (node $node_pid, fleet proxy $fleet_pid)"

# The standalone proxy, its fence set to the same token.
alone_port="$(free_port)"
alone_admin="$(free_port)"
start_palisade_proxy standalone "$alone_port" "$alone_admin" 1 "$MAIN_CPUS" \
  --upstream "http://127.0.0.1:$up_port"
alone_pid="$(pgrep -g "$SPAWNED" -x palisade)"
curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
  "http://127.0.0.1:$alone_admin/v1/fences/default" >/dev/null || die "cannot set the fence of the standalone proxy"

# Both admit a write with the token before anything is measured (the fleet proxy once it
# holds its lease).
for port in "$fleet_port" "$alone_port"; do
  await_write "$port" "$TOKEN" "the proxy on :$port"
done
log "fleet: pid $fleet_pid :$fleet_port; standalone: pid $alone_pid :$alone_port"

# load PORT SECONDS: one run of the load generator against a proxy; prints its JSON
# report (at least answered, rps, non_2xx, errors).
load() {
  "${PIN_SIDE[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
    --url "http://127.0.0.1:$1/bench" --method PUT --body-bytes "$BODY_BYTES" \
    --token "$TOKEN" --connections "$CONNECTIONS" --json --duration "$2"
}

# one_run TARGET PORT PID: one measured run; appends a JSON line. The node's CPU over the
# same run is recorded too (it serves the fleet proxy's renewals).
one_run() {
  local target="$1" port="$2" pid="$3" before after nbefore nafter out
  load "$port" "$WARMUP" >/dev/null
  before="$(cpu_ticks "$pid")"
  nbefore="$(cpu_ticks "$node_pid")"
  out="$(load "$port" "$DURATION")"
  after="$(cpu_ticks "$pid")"
  nafter="$(cpu_ticks "$node_pid")"
  record_run "$target" "$((after - before))" "$out" "$(printf '%-10s' "$target")" \
    "{\"node_ticks\": $((nafter - nbefore))}" "  node $((nafter - nbefore)) ticks"
}

for round in $(seq "$ROUNDS"); do
  log "round $round of $ROUNDS"
  if [ $((round % 2)) = 1 ]; then order="alone fleet"; else order="fleet alone"; fi
  for target in $order; do
    case "$target" in
      alone) one_run standalone "$alone_port" "$alone_pid" ;;
      fleet) one_run fleet "$fleet_port" "$fleet_pid" ;;
    esac
  done
done

printf '\nfleet cost: %s cores, %s rounds of %s s, %s connections, PUT %s B, equal token; proxies 1 thread each; fleet proxy leased from a one-node cluster with --lease-ms %s\n\n' \
  "$(nproc)" "$ROUNDS" "$DURATION" "$CONNECTIONS" "$BODY_BYTES" "$LEASE_MS"
cost_table standalone fleet "fleet / standalone" "+5%"
python3 - "$RESULTS" "$TICK_HZ" "$DURATION" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hz, duration = int(sys.argv[2]), float(sys.argv[3])
node = [r["node_ticks"] / hz / duration * 100 for r in rows if r["target"] == "fleet"]
print(f"the node's CPU during the fleet runs (renewals only; it serves no writes): median {statistics.median(node):.2f}% of a core")
EOF
stop "$up_pid"
