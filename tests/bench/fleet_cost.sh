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

ROUNDS="${BENCH_ROUNDS:-9}"
DURATION="${BENCH_DURATION:-5}"
WARMUP="${BENCH_WARMUP:-1}"
CONNECTIONS="${BENCH_CONNECTIONS:-32}"
BODY_BYTES="${BENCH_BODY_BYTES:-1024}"
LEASE_MS="${BENCH_LEASE_MS:-3000}"

need nginx nginx
need taskset util-linux
need python3 python3
need curl curl
build_palisade
make_workdir
machine_report
wait_quiet

"$PALISADE" node --help | grep -q -- '--lease-ms' || die "this palisade node has no --lease-ms (the fleet's node side)"
"$PALISADE" proxy --help | grep -q -- '--cluster' || die "this palisade proxy has no --cluster (the fleet's proxy side)"

if [ "$(nproc)" -ge 2 ]; then
  proxy_cpus=0
  side_cpus=1
  pin_side=(taskset -c "$side_cpus")
else
  proxy_cpus=""
  side_cpus=""
  pin_side=()
fi

TICK_HZ="$(getconf CLK_TCK)"
RESULTS="$BENCH_WORK/results.jsonl"
: >"$RESULTS"

up_port="$(free_port)"
start_upstream "$up_port" "$side_cpus"
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
start_palisade_proxy fleet "$fleet_port" "$fleet_admin" 1 "$proxy_cpus" \
  --upstream "http://127.0.0.1:$up_port" --cluster "http://127.0.0.1:$node_api" "${name_flag[@]}"
fleet_pid="$(pgrep -g "$SPAWNED" -x palisade)"
spawn node "${pin_side[@]}" "$PALISADE" node --id 1 --peers "1=127.0.0.1:$node_raft" \
  --api "127.0.0.1:$node_api" --data-dir "$BENCH_WORK/node-data" \
  --lease-ms "$LEASE_MS" --announce "$fleet_url"
# Its pid once it runs as palisade (taskset execs it; before that, pgrep finds nothing).
wait_for_line "$BENCH_WORK/node.out" "listening on"
node_pid="$(pgrep -g "$SPAWNED" -x palisade)"
view=""
for _ in $(seq 300); do
  view="$(curl -s --max-time 1 "http://127.0.0.1:$node_api/v1/leader" || true)"
  grep -q '"token":[0-9]' <<<"$view" && break
  sleep 0.1
done
TOKEN="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["token"])' "$view")" ||
  die "no token from the node: $view"
[ "$TOKEN" != None ] || die "the node released no token within 30 s: $view"
log "token $TOKEN (node $node_pid, fleet proxy $fleet_pid)"

# The standalone proxy, its fence set to the same token.
alone_port="$(free_port)"
alone_admin="$(free_port)"
start_palisade_proxy standalone "$alone_port" "$alone_admin" 1 "$proxy_cpus" \
  --upstream "http://127.0.0.1:$up_port"
alone_pid="$(pgrep -g "$SPAWNED" -x palisade)"
curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
  "http://127.0.0.1:$alone_admin/v1/fences/default" >/dev/null || die "cannot set the fence of the standalone proxy"

# Both admit a write with the token before anything is measured (the fleet proxy once it
# holds its lease).
for port in "$fleet_port" "$alone_port"; do
  code=""
  for _ in $(seq 100); do
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X PUT -H "Fencing-Token: $TOKEN" \
      --data x "http://127.0.0.1:$port/check" || true)"
    [ "$code" = 200 ] && break
    sleep 0.1
  done
  [ "$code" = 200 ] || die "the proxy on :$port answers $code to a write with token $TOKEN"
done
log "fleet: pid $fleet_pid :$fleet_port; standalone: pid $alone_pid :$alone_port"

# load PORT SECONDS: one run of the load generator against a proxy; prints its JSON
# report (at least answered, rps, non_2xx, errors).
load() {
  "${pin_side[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
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
  python3 - "$target" "$((after - before))" "$TICK_HZ" "$out" "$((nafter - nbefore))" >>"$RESULTS" <<'EOF'
import json, sys
target, ticks, hz, out, node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
r = json.loads(out)
r.update(target=target, cpu_ticks=ticks, node_ticks=node,
         cpu_us_per_req=(ticks / hz * 1e6 / r["answered"]) if r["answered"] else None)
print(json.dumps(r))
print(f"  {target:<10} {r['rps']:>9.0f} req/s  non-2xx {r['non_2xx']}  errors {r['errors']}  "
      f"cpu {r['cpu_us_per_req'] or 0:.2f} us/req  node {node} ticks", file=sys.stderr)
EOF
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

python3 - "$RESULTS" "$(nproc)" "$ROUNDS" "$DURATION" "$CONNECTIONS" "$BODY_BYTES" "$LEASE_MS" "$TICK_HZ" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cores, rounds, duration, conns, body, lease, hz = sys.argv[2:9]
def med(xs):
    return statistics.median([x for x in xs if x is not None])
print(f"\nfleet cost: {cores} cores, {rounds} rounds of {duration} s, {conns} connections, "
      f"PUT {body} B, equal token; proxies 1 thread each; fleet proxy leased from a one-node "
      f"cluster with --lease-ms {lease}\n")
print("| proxy | req/s | CPU µs/req (median) | min | max | non-2xx | errors |")
print("|---|---|---|---|---|---|---|")
m = {}
for t in ("standalone", "fleet"):
    rs = [r for r in rows if r["target"] == t]
    cpu = [r["cpu_us_per_req"] for r in rs]
    m[t] = med(cpu)
    print(f"| {t} | {med([r['rps'] for r in rs]):.0f} | {m[t]:.2f} | {min(cpu):.2f} | {max(cpu):.2f} | "
          f"{sum(r['non_2xx'] for r in rs)} | {sum(r['errors'] for r in rs)} |")
ratio = m["fleet"] / m["standalone"]
print(f"\nCPU per request, fleet / standalone, ratio of the medians: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); goal under +5%")
# Each round ran both proxies back to back, so the ratio within a round cancels most of
# the machine's drift between rounds.
fl = [r["cpu_us_per_req"] for r in rows if r["target"] == "fleet"]
al = [r["cpu_us_per_req"] for r in rows if r["target"] == "standalone"]
paired = [a / b for a, b in zip(fl, al)]
print(f"median of the per-round ratios: {statistics.median(paired):.3f} "
      f"(rounds: {', '.join(f'{p:.3f}' for p in paired)})")
node = [r["node_ticks"] / int(hz) / float(duration) * 100 for r in rows if r["target"] == "fleet"]
print(f"the node's CPU during the fleet runs (renewals only; it serves no writes): median {statistics.median(node):.2f}% of a core")
EOF
stop "$up_pid"
