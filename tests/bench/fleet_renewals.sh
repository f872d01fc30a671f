#!/usr/bin/env bash
# Renewal traffic to the cluster as the fleet grows: a 3-node cluster with leases on
# (`--lease-ms`) and 0, 1, 3 and 10 idle proxies in fleet mode (`--cluster`) on loopback,
# no writes while measured. Each proxy renews its lease in the background (every
# lease_ms / 3). Per fleet size, over a measured window: the renewals per second reaching
# the leader (its lease metrics; the proxies' when the node has none), the ReadIndex
# rounds per second when the node counts them (the leader gathers the renewals of one
# gather interval, lease_ms / 10 at most 300 ms, into one round), and the CPU of the nodes in percent of one core, all three and the leader
# alone (from their threads' /proc schedstat, with the utime + stime of /proc/PID/stat
# beside it). The 0-proxy fleet is the baseline (ticks and heartbeats only); the report
# divides the CPU above it by the number of proxies, so the reader sees whether the
# cluster's CPU grows less than linearly with the fleet.
#
# Every measurement starts a fresh cluster announcing to exactly its proxies (so no
# announce retries to absent proxies are counted); the sizes alternate their order from
# round to round. After the start, each proxy admits one write (it holds a lease), then
# the fleet idles through a warm-up before the window. The nodes run on CPU 0, the
# proxies on CPU 1 (taskset), when there are 2 CPUs.
#
# Environment (defaults): BENCH_ROUNDS (3), BENCH_DURATION (30 s), BENCH_WARMUP (3 s),
# BENCH_LEASE_MS (3000), BENCH_SIZES ("0 1 3 10"), BENCH_DIR (/var/tmp), BENCH_KEEP (0),
# BENCH_QUIET_WAIT (0). Default run time: about 8 minutes plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ROUNDS="${BENCH_ROUNDS:-3}"
DURATION="${BENCH_DURATION:-30}"
WARMUP="${BENCH_WARMUP:-3}"
LEASE_MS="${BENCH_LEASE_MS:-3000}"
read -r -a SIZES <<<"${BENCH_SIZES:-0 1 3 10}"
# Metric names (node and proxy) counted as lease traffic: every counter whose name has one
# of these, summed over its labels.
METRIC_PATTERN='lease_|renew|read_?index'

bench_start
need_fleet
fleet_name=0
"$PALISADE" proxy --help | grep -q -- '--fleet-name' && fleet_name=1

# The nodes are what is measured here: they run on MAIN_CPUS, the proxies on SIDE_CPUS.
split_cpus
start_results

up_port="$(free_port)"
start_upstream "$up_port" "$SIDE_CPUS"

# cpu_ns PID...: CPU time of the processes' live threads in nanoseconds, from
# /proc/PID/task/*/schedstat: an idle node uses well under 1% of a core, which clock ticks
# (10 ms each) resolve too coarsely over a window of seconds. Threads that exit inside the
# window lose their time here; the tick count (cpu_ticks) keeps it, and both are reported.
cpu_ns() {
  local pid
  for pid in "$@"; do cat /proc/"$pid"/task/*/schedstat 2>/dev/null; done | awk '{s += $1} END {printf "%d\n", s}'
}

# lease_metrics URL...: one JSON object {name{labels}: summed value} of the lease
# counters of the /metrics pages at the URLs, summed over them (the node_id label is
# dropped, so that the same counter of several processes adds up).
lease_metrics() {
  python3 - "$METRIC_PATTERN" "$@" <<'EOF'
import json, re, sys, urllib.request
pattern, urls = re.compile(sys.argv[1]), sys.argv[2:]
out = {}
for url in urls:
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        continue
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) != 2:
            continue
        name, _, labels = parts[0].partition("{")
        labels = ",".join(l for l in labels.rstrip("}").split(",") if l and not l.startswith("node_id="))
        if labels:
            name = f"{name}{{{labels}}}"
        base = name.split("{")[0]
        if pattern.search(base) and base.endswith("_total"):
            try:
                out[name] = out.get(name, 0.0) + float(parts[1])
            except ValueError:
                pass
print(json.dumps(out))
EOF
}

# measure ROUND N: one fleet of N proxies on a fresh 3-node cluster; appends a JSON line.
measure() {
  local round="$1" n="$2" i j tag="r$1-n$2"
  local raft=() api=() listen=() admin=() groups=() node_pids=() proxy_pids=() announce=() peers="" cluster=""
  for i in 1 2 3; do
    raft+=("$(free_port)")
    api+=("$(free_port)")
    peers+="${peers:+,}$i=127.0.0.1:${raft[-1]}"
    cluster+="${cluster:+,}http://127.0.0.1:${api[-1]}"
  done
  for j in $(seq "$n"); do
    listen+=("$(free_port)")
    admin+=("$(free_port)")
    announce+=(--announce "http://127.0.0.1:${admin[-1]}")
  done
  for j in $(seq "$n"); do
    local extra=()
    [ "$fleet_name" = 1 ] && extra=(--fleet-name "http://127.0.0.1:${admin[j - 1]}")
    start_palisade_proxy "$tag-proxy-$j" "${listen[j - 1]}" "${admin[j - 1]}" 1 "$SIDE_CPUS" \
      --upstream "http://127.0.0.1:$up_port" --cluster "$cluster" "${extra[@]}"
    groups+=("$SPAWNED")
    proxy_pids+=("$(pgrep -g "$SPAWNED" -x palisade)")
  done
  local pin=()
  [ -n "$MAIN_CPUS" ] && pin=(taskset -c "$MAIN_CPUS")
  for i in 1 2 3; do
    spawn "$tag-node-$i" "${pin[@]}" "$PALISADE" node --id "$i" --peers "$peers" \
      --api "127.0.0.1:${api[i - 1]}" --data-dir "$BENCH_WORK/$tag-node-$i-data" \
      --lease-ms "$LEASE_MS" "${announce[@]}"
    groups+=("$SPAWNED")
  done
  for i in 1 2 3; do
    wait_for_line "$BENCH_WORK/$tag-node-$i.out" "listening on"
    node_pids+=("$(pgrep -g "${groups[n + i - 1]}" -x palisade)")
  done
  # The released token, and which node leads.
  local view="" token="" leader=""
  for _ in $(seq 300); do
    for i in 1 2 3; do
      view="$(curl -s --max-time 1 "http://127.0.0.1:${api[i - 1]}/v1/leader" || true)"
      if grep -q '"role":"leader"' <<<"$view" && grep -q '"token":[0-9]' <<<"$view"; then
        token="$(grep -o '"token":[0-9]*' <<<"$view" | cut -d: -f2)"
        leader="$i"
        break 2
      fi
    done
    sleep 0.1
  done
  [ -n "$token" ] || die "$tag: no leader released a token within 30 s"
  # Every proxy holds a lease: it admits one write with the token.
  for j in $(seq "$n"); do
    await_write "${listen[j - 1]}" "$token" "$tag: proxy $j"
  done
  sleep "$WARMUP"
  local node_urls=() proxy_urls=()
  for i in 1 2 3; do node_urls+=("http://127.0.0.1:${api[i - 1]}/metrics"); done
  for j in $(seq "$n"); do proxy_urls+=("http://127.0.0.1:${admin[j - 1]}/metrics"); done
  local lpid="${node_pids[leader - 1]}" m0 p0 m1 p1 c0 l0 q0 c1 l1 q1 t0 t1 s0 s1 sl0 sl1
  m0="$(lease_metrics "${node_urls[leader - 1]}")"
  p0="$(lease_metrics "${proxy_urls[@]}")"
  c0="$(cpu_ticks "${node_pids[@]}")"
  l0="$(cpu_ticks "$lpid")"
  s0="$(cpu_ns "${node_pids[@]}")"
  sl0="$(cpu_ns "$lpid")"
  q0=0
  [ "$n" -gt 0 ] && q0="$(cpu_ticks "${proxy_pids[@]}")"
  t0="$(date +%s.%N)"
  sleep "$DURATION"
  m1="$(lease_metrics "${node_urls[leader - 1]}")"
  p1="$(lease_metrics "${proxy_urls[@]}")"
  c1="$(cpu_ticks "${node_pids[@]}")"
  l1="$(cpu_ticks "$lpid")"
  s1="$(cpu_ns "${node_pids[@]}")"
  sl1="$(cpu_ns "$lpid")"
  q1=0
  [ "$n" -gt 0 ] && q1="$(cpu_ticks "${proxy_pids[@]}")"
  t1="$(date +%s.%N)"
  # The leader must not have changed during the window (a new election would count
  # its own traffic).
  view="$(curl -s --max-time 1 "http://127.0.0.1:${api[leader - 1]}/v1/leader" || true)"
  grep -q '"role":"leader"' <<<"$view" || log "$tag: node $leader no longer leads after the window: $view"
  python3 - "$round" "$n" "$t0" "$t1" "$TICK_HZ" "$((c1 - c0))" "$((l1 - l0))" "$((q1 - q0))" \
    "$m0" "$m1" "$p0" "$p1" "$view" "$((s1 - s0))" "$((sl1 - sl0))" >>"$RESULTS" <<'EOF'
import json, sys
round_, n, t0, t1, hz, ticks, leader_ticks, proxies = sys.argv[1:9]
m0, m1, p0, p1 = (json.loads(x) for x in sys.argv[9:13])
nodes_ns, leader_ns = int(sys.argv[14]), int(sys.argv[15])
secs, hz = float(t1) - float(t0), int(hz)
rate = lambda a, b: {k: (b.get(k, 0) - a.get(k, 0)) / secs for k in b}
r = dict(round=int(round_), proxies=int(n), seconds=secs,
         nodes_cpu_pct=nodes_ns / 1e9 / secs * 100, leader_cpu_pct=leader_ns / 1e9 / secs * 100,
         nodes_ticks_pct=int(ticks) / hz / secs * 100, leader_ticks_pct=int(leader_ticks) / hz / secs * 100,
         proxies_cpu_pct=int(proxies) / hz / secs * 100,
         node_rates=rate(m0, m1), proxy_rates=rate(p0, p1), still_leader='"role":"leader"' in sys.argv[13])
print(json.dumps(r))
print(f"  {n:>2} proxies: nodes {r['nodes_cpu_pct']:.2f}% (leader {r['leader_cpu_pct']:.2f}%; "
      f"from ticks {r['nodes_ticks_pct']:.2f}%, {r['leader_ticks_pct']:.2f}%), "
      f"proxies {r['proxies_cpu_pct']:.2f}%; leader lease metrics/s {r['node_rates']}; "
      f"proxies' lease metrics/s {r['proxy_rates']}", file=sys.stderr)
EOF
  for j in "${groups[@]}"; do stop "$j"; done
  rm -rf "$BENCH_WORK/$tag"-*-data
}

for round in $(seq "$ROUNDS"); do
  log "round $round of $ROUNDS"
  if [ $((round % 2)) = 1 ]; then
    order=("${SIZES[@]}")
  else
    order=()
    for ((i = ${#SIZES[@]} - 1; i >= 0; i--)); do order+=("${SIZES[i]}"); done
  fi
  for n in "${order[@]}"; do measure "$round" "$n"; done
done

python3 - "$RESULTS" "$(nproc)" "$ROUNDS" "$DURATION" "$LEASE_MS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cores, rounds, duration, lease = sys.argv[2:6]
print(f"\nfleet renewals: {cores} cores, 3 nodes with --lease-ms {lease} (tick 100 ms), idle proxies, "
      f"{rounds} rounds of {duration} s per fleet size; medians over the rounds\n")
names = sorted({k for r in rows for k in r["node_rates"]})
sizes = sorted({r["proxies"] for r in rows})
med = lambda xs: statistics.median(xs) if xs else float("nan")
def rate(r, side, prefix, exclude=None):
    return sum(v for k, v in r[side].items() if k.startswith(prefix) and (exclude is None or exclude not in k))
grants = lambda r: rate(r, "node_rates", "palisade_node_lease_grants_total")
rounds_ = lambda r: rate(r, "node_rates", "palisade_node_lease_rounds_total")
renewed = lambda r: rate(r, "proxy_rates", "palisade_proxy_lease_renewals_total{outcome=\"granted\"")
# Everything else counted as lease traffic: refusals, failed renewals, lapsed leases.
other = lambda r: (rate(r, "node_rates", "palisade_node_lease_refusals_total")
                   + rate(r, "proxy_rates", "palisade_proxy_lease_", "outcome=\"granted\""))
print("| proxies | leases granted by the leader /s | ReadIndex rounds /s | grants per round | "
      "proxies' granted renewals /s | refusals, failures /s | nodes CPU % of a core | leader CPU % | "
      "nodes CPU above 0 proxies, per proxy | nodes CPU % from ticks | proxies CPU % |")
print("|" + "---|" * 11)
by = {n: [r for r in rows if r["proxies"] == n] for n in sizes}
base = med([r["nodes_cpu_pct"] for r in by[0]]) if 0 in by else None
for n in sizes:
    rs = by[n]
    cpu = med([r["nodes_cpu_pct"] for r in rs])
    per = f"{(cpu - base) / n:.3f}" if base is not None and n > 0 else ""
    g, ro = med([grants(r) for r in rs]), med([rounds_(r) for r in rs])
    gpr = f"{med([grants(r) / rounds_(r) for r in rs if rounds_(r) > 0]):.2f}" if any(rounds_(r) > 0 for r in rs) else ""
    print(f"| {n} | {g:.2f} | {ro:.2f} | {gpr} | {med([renewed(r) for r in rs]):.2f} | "
          f"{med([other(r) for r in rs]):.2f} | {cpu:.3f} | {med([r['leader_cpu_pct'] for r in rs]):.3f} | {per} | "
          f"{med([r['nodes_ticks_pct'] for r in rs]):.2f} | {med([r['proxies_cpu_pct'] for r in rs]):.2f} |")
if not any(k.startswith("palisade_node_lease_") for k in names):
    print("\nthe node exposes no lease metric: renewals reaching the leader are not counted on the node side")
lost = [r for r in rows if not r["still_leader"]]
if lost:
    print(f"\n{len(lost)} windows ended with a different leader: their figures include an election")
EOF
