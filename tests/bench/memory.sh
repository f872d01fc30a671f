#!/usr/bin/env bash
# Proxy memory: resident set size (VmRSS from /proc) of `palisade proxy --upstream`, with
# nginx `proxy_pass` beside it as a reference, at rest, holding 1,000 idle keep-alive
# connections (`palisade bench --hold`: each connection sends one request, then stays
# open), and under load (1 KiB PUTs with an equal token from 64 and from 1,000 busy
# connections; the peak of samples every 0.2 s). Both proxies use one worker per core, or
# BENCH_WORKERS each.
# Idle connections are measured once palisade has parked them (about a second after
# their request: their HTTP state and buffers freed; its gauge
# palisade_proxy_connections_parked), waiting at most PARK_WAIT_S. They are opened in two
# halves, and the result gives KiB per idle connection twice: (RSS holding them all - RSS
# at rest) / connections seen, and the second half's marginal cost, (RSS holding all -
# RSS holding the first half) / half, which leaves out what the first requests set up
# once (the upstream pool's idle connections, the allocator's first pages).
#
# Environment (defaults): BENCH_IDLE_CONNECTIONS (1000), BENCH_LOAD_CONNECTIONS ("64
# 1000"), BENCH_DURATION (8 s of load), BENCH_DIR (/var/tmp), BENCH_KEEP (0),
# BENCH_QUIET_WAIT (0), BENCH_WORKERS (the core count), BENCH_PALISADE_BIN with
# BENCH_NO_BUILD=1 (another binary, see lib.sh). Default run time: about 1 minute plus the
# build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

IDLE_CONNECTIONS="${BENCH_IDLE_CONNECTIONS:-1000}"
LOAD_CONNECTIONS="${BENCH_LOAD_CONNECTIONS:-64 1000}"
DURATION="${BENCH_DURATION:-8}"
TOKEN=1
# Longest wait for palisade to park the idle connections (a binary without parking never
# does: the figure is then taken when the wait runs out).
PARK_WAIT_S=10

need nginx nginx
need ss iproute2
need python3 python3
build_palisade
make_workdir
machine_report
wait_quiet
# Each connection is a descriptor in the client and one in the proxy.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

cores="$(nproc)"
workers="${BENCH_WORKERS:-$cores}"
case "$workers" in '' | *[!0-9]* | 0) die "BENCH_WORKERS: $workers is not a positive number" ;; esac
up_port="$(free_port)"
start_upstream "$up_port"
nginx_port="$(free_port)"
start_nginx_proxy "$nginx_port" "$up_port" "$workers"
nginx_group="$SPAWNED"
pal_port="$(free_port)"
pal_admin="$(free_port)"
start_palisade_proxy palisade "$pal_port" "$pal_admin" "$workers" "" \
  --upstream "http://127.0.0.1:$up_port"
pal_pid="$(pgrep -g "$SPAWNED" -x palisade)"
curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
  "http://127.0.0.1:$pal_admin/v1/fences/default" >/dev/null

RESULTS="$BENCH_WORK/memory.txt"
: >"$RESULTS"
# established PORT: client connections the server side of PORT has open.
established() {
  ss -Htn state established "( sport = :$1 )" | wc -l
}
# parked ADMIN_PORT: palisade's parked client connections now.
parked() {
  metric "http://127.0.0.1:$1/metrics" palisade_proxy_connections_parked
}
# measure NAME PORT ADMIN_PORT PIDS... (ADMIN_PORT empty for nginx)
measure() {
  local name="$1" port="$2" admin="$3"
  shift 3
  local pids=("$@") rest held peak now conns waited
  rest="$(rss_kib "${pids[@]}")"

  # Idle connections, in two equal halves: the second half's cost is the marginal cost
  # of a connection, without what the first requests set up once (the upstream pool's
  # idle connections, the runtime's and the allocator's first pages).
  local half=$((IDLE_CONNECTIONS / 2)) step held_half=0 hold_groups=()
  for step in 1 2; do
    spawn "hold-$name-$step" "$PALISADE" bench --hold --url "http://127.0.0.1:$port/hold" \
      --connections "$half" --duration 40
    hold_groups+=("$SPAWNED")
    wait_for_line "$BENCH_WORK/hold-$name-$step.out" "holding" 30
    sleep 1
    if [ -n "$admin" ]; then
      waited=0
      while [ "$(parked "$admin")" -lt $((half * step)) ] && [ "$waited" -lt $((PARK_WAIT_S * 5)) ]; do
        sleep 0.2
        waited=$((waited + 1))
      done
      log "$name: $(parked "$admin") connections parked"
    fi
    [ "$step" = 1 ] && held_half="$(rss_kib "${pids[@]}")"
  done
  held="$(rss_kib "${pids[@]}")"
  conns="$(established "$port")"
  log "$name: $(cat "$BENCH_WORK/hold-$name-1.out" "$BENCH_WORK/hold-$name-2.out" | tr '\n' ' '), server side sees $conns, RSS $held_half KiB at half, $held KiB"
  local g
  for g in "${hold_groups[@]}"; do stop "$g"; done
  printf '%s rest %s\n%s idle_connections %s\n%s held_half %s\n%s held %s\n' \
    "$name" "$rest" "$name" "$conns" "$name" "$held_half" "$name" "$held" >>"$RESULTS"

  # Under load.
  local c
  for c in $LOAD_CONNECTIONS; do
    spawn "load-$name-$c" "$PALISADE" bench --url "http://127.0.0.1:$port/load" --method PUT \
      --body-bytes 1024 --token "$TOKEN" --connections "$c" --duration "$DURATION"
    local load_group="$SPAWNED"
    peak=0
    while kill -0 "$load_group" 2>/dev/null; do
      now="$(rss_kib "${pids[@]}")"
      [ "$now" -gt "$peak" ] && peak="$now"
      sleep 0.2
    done
    wait "$load_group" || die "load run failed: $(tail -3 "$BENCH_WORK/load-$name-$c.err")"
    log "$name under load from $c connections: peak RSS $peak KiB; $(grep -E 'requests|errors' "$BENCH_WORK/load-$name-$c.out" | tr -s ' ' | tr '\n' ';')"
    echo "$name load_$c $peak" >>"$RESULTS"
  done
}

measure palisade "$pal_port" "$pal_admin" "$pal_pid"
read -r -a nginx_all <<<"$(group_pids "$nginx_group")"
measure nginx "$nginx_port" "" "${nginx_all[@]}"
echo "palisade hwm $(awk '/^VmHWM:/ {print $2}' "/proc/$pal_pid/status")" >>"$RESULTS"

python3 - "$RESULTS" "$cores" "$IDLE_CONNECTIONS" "$LOAD_CONNECTIONS" "$workers" <<'EOF'
import sys
v = {}
for line in open(sys.argv[1]):
    name, key, value = line.split()
    v[(name, key)] = int(value)
mib = lambda kib: f"{kib / 1024:.1f}"
print(f"\nmemory benchmark: {sys.argv[2]} cores, {sys.argv[5]} workers per proxy; "
      f"VmRSS in MiB (nginx: master and workers summed)\n")
loads = sys.argv[4].split()
print("| proxy | at rest | " + f"{sys.argv[3]} idle connections (seen) | "
      + "KiB per idle connection | KiB per idle connection, second half | "
      + " | ".join(f"peak, load from {c} connections" for c in loads) + " |")
print("|---|---|---|---|---|" + "---|" * len(loads))
for name in ("palisade", "nginx"):
    seen = v[(name, 'idle_connections')]
    per = (v[(name, 'held')] - v[(name, 'rest')]) / seen if seen else float('nan')
    marginal = (v[(name, 'held')] - v[(name, 'held_half')]) / (int(sys.argv[3]) // 2)
    print(f"| {name} | {mib(v[(name, 'rest')])} | {mib(v[(name, 'held')])} "
          f"({seen}) | {per:.1f} | {marginal:.1f} | "
          + " | ".join(mib(v[(name, f'load_{c}')]) for c in loads) + " |")
print(f"\npalisade VmHWM (peak RSS over the whole run): {mib(v[('palisade', 'hwm')])} MiB")
EOF
