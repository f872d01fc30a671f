#!/usr/bin/env bash
# Proxy memory: resident set size (VmRSS from /proc) of `palisade proxy --upstream`, with
# nginx `proxy_pass` beside it as a reference, at rest, holding 1,000 idle keep-alive
# connections (`palisade bench --hold`: each connection sends one request, then stays
# open), and under load (1 KiB PUTs with an equal token from 64 and from 1,000 busy
# connections; the peak of samples every 0.2 s). Both proxies use one worker per core.
# Idle connections are measured once palisade has parked them (about a second after
# their request: their HTTP state and buffers freed; its gauge
# palisade_proxy_connections_parked), waiting at most PARK_WAIT_S; the result gives KiB
# per idle connection, (RSS holding them - RSS at rest) / connections seen.
#
# Environment (defaults): BENCH_IDLE_CONNECTIONS (1000), BENCH_LOAD_CONNECTIONS ("64
# 1000"), BENCH_DURATION (8 s of load), BENCH_DIR (/var/tmp), BENCH_KEEP (0),
# BENCH_QUIET_WAIT (0), BENCH_PALISADE_BIN with BENCH_NO_BUILD=1 (another binary, see
# lib.sh). Default run time: about 1 minute plus the build.
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
up_port="$(free_port)"
start_upstream "$up_port"
nginx_port="$(free_port)"
start_nginx_proxy "$nginx_port" "$up_port" "$cores"
nginx_group="$SPAWNED"
pal_port="$(free_port)"
pal_admin="$(free_port)"
start_palisade_proxy palisade "$pal_port" "$pal_admin" "$cores" "" \
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

  # Idle connections.
  spawn "hold-$name" "$PALISADE" bench --hold --url "http://127.0.0.1:$port/hold" \
    --connections "$IDLE_CONNECTIONS" --duration 30
  local hold_group="$SPAWNED"
  wait_for_line "$BENCH_WORK/hold-$name.out" "holding" 30
  sleep 1
  if [ -n "$admin" ]; then
    waited=0
    while [ "$(parked "$admin")" -lt "$IDLE_CONNECTIONS" ] && [ "$waited" -lt $((PARK_WAIT_S * 5)) ]; do
      sleep 0.2
      waited=$((waited + 1))
    done
    log "$name: $(parked "$admin") connections parked"
  fi
  held="$(rss_kib "${pids[@]}")"
  conns="$(established "$port")"
  log "$name: $(cat "$BENCH_WORK/hold-$name.out"), server side sees $conns, RSS $held KiB"
  stop "$hold_group"
  printf '%s rest %s\n%s idle_connections %s\n%s held %s\n' \
    "$name" "$rest" "$name" "$conns" "$name" "$held" >>"$RESULTS"

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

python3 - "$RESULTS" "$cores" "$IDLE_CONNECTIONS" "$LOAD_CONNECTIONS" <<'EOF'
import sys
v = {}
for line in open(sys.argv[1]):
    name, key, value = line.split()
    v[(name, key)] = int(value)
mib = lambda kib: f"{kib / 1024:.1f}"
print(f"\nmemory benchmark: {sys.argv[2]} cores, {sys.argv[2]} workers per proxy; "
      f"VmRSS in MiB (nginx: master and workers summed)\n")
loads = sys.argv[4].split()
print("| proxy | at rest | " + f"{sys.argv[3]} idle connections (seen) | "
      + "KiB per idle connection | "
      + " | ".join(f"peak, load from {c} connections" for c in loads) + " |")
print("|---|---|---|---|" + "---|" * len(loads))
for name in ("palisade", "nginx"):
    seen = v[(name, 'idle_connections')]
    per = (v[(name, 'held')] - v[(name, 'rest')]) / seen if seen else float('nan')
    print(f"| {name} | {mib(v[(name, 'rest')])} | {mib(v[(name, 'held')])} "
          f"({seen}) | {per:.1f} | "
          + " | ".join(mib(v[(name, f'load_{c}')]) for c in loads) + " |")
print(f"\npalisade VmHWM (peak RSS over the whole run): {mib(v[('palisade', 'hwm')])} MiB")
EOF
