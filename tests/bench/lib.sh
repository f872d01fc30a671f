# shellcheck shell=bash
# Shared helpers of the benchmark scripts in tests/bench/; sourced, not run.
#
# Every script: installs its peers from Debian's packages when missing, builds palisade
# in release mode, runs everything on 127.0.0.1, and kills every process it started on
# exit (each child runs in its own process group, which the EXIT trap signals).

set -euo pipefail

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# BENCH_PALISADE_BIN: another binary to run (with BENCH_NO_BUILD=1, say a copy that a
# concurrent build cannot replace in the middle of a run).
PALISADE="${BENCH_PALISADE_BIN:-$BENCH_ROOT/target/release/palisade}"
# The scripts find the proxy's process by its name (`pgrep -x palisade`), which is the
# file's name: a copy must keep it (say /tmp/build-a/palisade, not /tmp/palisade-a).
if [ "$(basename "$PALISADE")" != palisade ]; then
  printf 'error: BENCH_PALISADE_BIN=%s: the file must be named palisade (put copies in separate folders)\n' \
    "$PALISADE" >&2
  exit 1
fi
# Process groups to kill on exit (each child is started with setsid, so pid = pgid).
BENCH_PGIDS=()
BENCH_WORK=""

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# need CMD PACKAGE...: installs the Debian packages when CMD is missing.
need() {
  local cmd="$1"
  shift
  if ! command -v "$cmd" >/dev/null 2>&1; then
    log "installing $* (for $cmd)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  fi
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is still missing after installing $*"
}

build_palisade() {
  # BENCH_NO_BUILD=1: use the release binary as it is (say, while the tree does not build).
  if [ "${BENCH_NO_BUILD:-0}" = 1 ] && [ -x "$PALISADE" ]; then
    log "not building: using $PALISADE as built $(date -r "$PALISADE" +%H:%M)"
    return
  fi
  log "building palisade (release)"
  (cd "$BENCH_ROOT" && cargo build --release -p palisade-cli --quiet)
  [ -x "$PALISADE" ] || die "no binary at $PALISADE"
}

# A scratch directory under BENCH_DIR (default /var/tmp: a disk, so fsync is real; /tmp
# may be a tmpfs), removed on exit unless BENCH_KEEP=1.
make_workdir() {
  local base="${BENCH_DIR:-/var/tmp}"
  BENCH_WORK="$(mktemp -d "$base/palisade-bench.XXXXXX")"
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  log "work directory $BENCH_WORK"
}

cleanup() {
  local status=$?
  trap - EXIT
  local pg
  for pg in "${BENCH_PGIDS[@]}"; do
    kill -CONT -- "-$pg" 2>/dev/null || true
    kill -TERM -- "-$pg" 2>/dev/null || true
  done
  sleep 0.3
  for pg in "${BENCH_PGIDS[@]}"; do
    kill -KILL -- "-$pg" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ -n "$BENCH_WORK" ] && [ "${BENCH_KEEP:-0}" != 1 ]; then
    rm -rf "$BENCH_WORK"
  elif [ -n "$BENCH_WORK" ]; then
    log "kept $BENCH_WORK"
  fi
  exit "$status"
}

# spawn NAME CMD...: starts CMD in its own process group with stdout and stderr in
# $BENCH_WORK/NAME.out and .err; sets SPAWNED to its pid.
SPAWNED=""
spawn() {
  local name="$1"
  shift
  setsid "$@" >"$BENCH_WORK/$name.out" 2>"$BENCH_WORK/$name.err" </dev/null &
  SPAWNED=$!
  BENCH_PGIDS+=("$SPAWNED")
}

# stop PID: ends one process group started by spawn, and waits for it.
stop() {
  kill -TERM -- "-$1" 2>/dev/null || true
  local i
  for i in $(seq 50); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
    [ "$i" = 50 ] && kill -KILL -- "-$1" 2>/dev/null
  done
  wait "$1" 2>/dev/null || true
}

# free_port: a free TCP port on 127.0.0.1 (bound, then released).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for_line FILE TEXT [SECONDS]: waits until FILE contains TEXT.
wait_for_line() {
  local file="$1" text="$2" secs="${3:-30}" i
  for i in $(seq $((secs * 10))); do
    grep -q -- "$text" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  die "no '$text' in $file after ${secs}s: $(tail -5 "${file%.*}.err" 2>/dev/null)"
}

# wait_for_http URL [SECONDS]: waits until URL answers at all.
wait_for_http() {
  local url="$1" secs="${2:-30}" i
  for i in $(seq $((secs * 10))); do
    curl -s -o /dev/null --max-time 1 "$url" && return 0
    sleep 0.1
  done
  die "$url did not answer within ${secs}s"
}

# nginx_conf FILE WORKERS BODY: writes an nginx config running in the foreground with
# its temp files under $BENCH_WORK, access log off, and BODY inside http {}.
nginx_conf() {
  local file="$1" workers="$2" body="$3" name
  name="$(basename "$file" .conf)"
  mkdir -p "$BENCH_WORK/$name"
  cat >"$file" <<EOF
worker_processes $workers;
daemon off;
pid $BENCH_WORK/$name/nginx.pid;
error_log $BENCH_WORK/$name/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_temp_path $BENCH_WORK/$name/body;
    proxy_temp_path $BENCH_WORK/$name/proxy;
    fastcgi_temp_path $BENCH_WORK/$name/fastcgi;
    uwsgi_temp_path $BENCH_WORK/$name/uwsgi;
    scgi_temp_path $BENCH_WORK/$name/scgi;
$body
}
EOF
}

# start_upstream PORT [CPUS]: nginx answering 200 "ok" to everything, one worker.
start_upstream() {
  local port="$1" cpus="${2:-}" conf="$BENCH_WORK/upstream-$1.conf"
  # GETs under /get/ are answered 1 KiB, as a read of a small object would be; every
  # other request, a short "ok". UPSTREAM_WORKERS (1) sets its worker processes.
  local kib
  kib="$(head -c 1024 /dev/zero | tr '\0' 'r')"
  nginx_conf "$conf" "${UPSTREAM_WORKERS:-1}" "    server { listen 127.0.0.1:$port;
        location /get/ { return 200 \"$kib\"; }
        location / { return 200 \"ok\\n\"; } }"
  if [ -n "$cpus" ]; then
    spawn "upstream-$port" taskset -c "$cpus" nginx -c "$conf" -p "$BENCH_WORK"
  else
    spawn "upstream-$port" nginx -c "$conf" -p "$BENCH_WORK"
  fi
  wait_for_http "http://127.0.0.1:$port/"
}

# start_nginx_proxy PORT UPSTREAM_PORT WORKERS [CPUS]: nginx proxy_pass with keepalive
# connections to the upstream.
start_nginx_proxy() {
  local port="$1" up="$2" workers="$3" cpus="${4:-}" conf="$BENCH_WORK/nginx-proxy-$1.conf"
  nginx_proxy_conf "$conf" "$port" "$up" "$workers"
  if [ -n "$cpus" ]; then
    spawn "nginx-proxy-$port" taskset -c "$cpus" nginx -c "$conf" -p "$BENCH_WORK"
  else
    spawn "nginx-proxy-$port" nginx -c "$conf" -p "$BENCH_WORK"
  fi
  wait_for_http "http://127.0.0.1:$port/"
}

# nginx_proxy_conf FILE PORT UPSTREAM_PORT WORKERS: the configuration start_nginx_proxy
# runs.
nginx_proxy_conf() {
  local conf="$1" port="$2" up="$3" workers="$4"
  nginx_conf "$conf" "$workers" "    upstream backend {
        server 127.0.0.1:$up;
        keepalive 256;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"
}

# start_haproxy PORT UPSTREAM_PORT THREADS [CPUS]: HAProxy in HTTP mode with THREADS
# threads, reusing its connections to the upstream (`http-reuse always`).
start_haproxy() {
  local port="$1" up="$2" threads="$3" cpus="${4:-}" conf="$BENCH_WORK/haproxy-$1.cfg"
  cat >"$conf" <<EOF
global
    nbthread $threads
    maxconn 8000
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always
frontend f
    bind 127.0.0.1:$port
    default_backend b
backend b
    server s1 127.0.0.1:$up
EOF
  if [ -n "$cpus" ]; then
    spawn "haproxy-$port" taskset -c "$cpus" haproxy -f "$conf" -db
  else
    spawn "haproxy-$port" haproxy -f "$conf" -db
  fi
  wait_for_http "http://127.0.0.1:$port/"
}

# start_palisade_proxy NAME PORT ADMIN_PORT THREADS [CPUS] [--upstream URL ...]: a
# palisade proxy with THREADS runtime threads; sets SPAWNED.
start_palisade_proxy() {
  local name="$1" port="$2" admin="$3" threads="$4" cpus="$5"
  shift 5
  local cmd=(env "PALISADE_WORKER_THREADS=$threads" "$PALISADE" proxy
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin"
    --data-dir "$BENCH_WORK/$name-data" "$@")
  if [ -n "$cpus" ]; then
    spawn "$name" taskset -c "$cpus" "${cmd[@]}"
  else
    spawn "$name" "${cmd[@]}"
  fi
  wait_for_line "$BENCH_WORK/$name.out" "palisade proxy listening on"
}

# cpu_ticks PID...: user + system CPU time of the processes, in clock ticks.
cpu_ticks() {
  local total=0 pid fields
  for pid in "$@"; do
    # Fields after the command name, which is in parentheses: utime is the 12th, stime 13th.
    fields="$(sed 's/^.*) //' "/proc/$pid/stat")"
    total=$((total + $(echo "$fields" | awk '{print $12 + $13}')))
  done
  echo "$total"
}

# cpu_ticks_split PID...: user and system CPU time of the processes, in clock ticks, as
# "USER SYSTEM".
cpu_ticks_split() {
  local user=0 system=0 pid fields
  for pid in "$@"; do
    fields="$(sed 's/^.*) //' "/proc/$pid/stat")"
    user=$((user + $(echo "$fields" | awk '{print $12}')))
    system=$((system + $(echo "$fields" | awk '{print $13}')))
  done
  echo "$user $system"
}

# group_pids PGID: every process of a group started by spawn (nginx: master and workers).
group_pids() {
  pgrep -g "$1" | tr '\n' ' '
}

# rss_kib PID...: summed VmRSS in KiB.
rss_kib() {
  local total=0 pid
  for pid in "$@"; do
    total=$((total + $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")))
  done
  echo "$total"
}

# proc_io PID FIELD: one field of /proc/PID/io (write_bytes, syscw, ...).
proc_io() {
  awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/io"
}

# metric URL NAME: the sum of a Prometheus counter's samples (0 when absent).
metric() {
  curl -s --max-time 5 "$1" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%d\n", s}'
}

# machine_report: what the figures depend on.
machine_report() {
  log "machine: $(nproc) cores, $(uptime | sed 's/.*load average/load average/')"
}

# cpu_busy_pct [SECONDS]: how busy all CPUs were over the next SECONDS (default 3), in
# percent, from /proc/stat.
cpu_busy_pct() {
  local a b
  a="$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat)"
  sleep "${1:-3}"
  b="$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat)"
  echo "$a $b" | awk '{busy = $3 - $1; idle = $4 - $2; printf "%d\n", (busy + idle) ? 100 * busy / (busy + idle) : 0}'
}

# wait_quiet: waits (polling every 30 s) until the CPUs are less than BENCH_QUIET_BUSY
# percent busy (default 10) over 3 seconds, at most BENCH_QUIET_WAIT seconds (default 0:
# do not wait). Logs how quiet the machine was when it started, either way. The busy
# share is used rather than the load average, which lags by minutes (a previous
# benchmark's own load would still count).
wait_quiet() {
  local max="${BENCH_QUIET_WAIT:-0}" limit="${BENCH_QUIET_BUSY:-10}" waited=0 busy
  while :; do
    busy="$(cpu_busy_pct 3)"
    if [ "$busy" -lt "$limit" ] || [ "$waited" -ge "$max" ]; then
      break
    fi
    log "CPUs ${busy}% busy (limit ${limit}%); waiting (${waited}s of ${max}s)"
    sleep 30
    waited=$((waited + 30))
  done
  log "starting with CPUs ${busy}% busy, load average $(cut -d' ' -f1-3 /proc/loadavg), after waiting ${waited}s"
}

# cost_settings ROUNDS DURATION: the settings of a CPU-cost benchmark, from the
# environment: ROUNDS (BENCH_ROUNDS), DURATION (BENCH_DURATION, seconds), with the
# defaults given; WARMUP (BENCH_WARMUP, 1 s), CONNECTIONS (BENCH_CONNECTIONS, 32) and
# BODY_BYTES (BENCH_BODY_BYTES, 1024).
# shellcheck disable=SC2034 # for the scripts that source this.
cost_settings() {
  ROUNDS="${BENCH_ROUNDS:-$1}"
  DURATION="${BENCH_DURATION:-$2}"
  WARMUP="${BENCH_WARMUP:-1}"
  CONNECTIONS="${BENCH_CONNECTIONS:-32}"
  BODY_BYTES="${BENCH_BODY_BYTES:-1024}"
}

# bench_start: what every cost benchmark does first: installs nginx, taskset, python3
# and curl when missing, builds palisade, makes the work directory, reports the machine
# and waits for it to be quiet (wait_quiet).
bench_start() {
  need nginx nginx
  need taskset util-linux
  need python3 python3
  need curl curl
  build_palisade
  make_workdir
  machine_report
  wait_quiet
}

# need_fleet: dies unless this palisade has the fleet's flags (node --lease-ms, proxy
# --cluster).
need_fleet() {
  "$PALISADE" node --help | grep -q -- '--lease-ms' || die "this palisade node has no --lease-ms (the fleet's node side)"
  "$PALISADE" proxy --help | grep -q -- '--cluster' || die "this palisade proxy has no --cluster (the fleet's proxy side)"
}

# split_cpus: with 2 CPUs or more, MAIN_CPUS=0 for what is measured (the proxies, or the
# nodes), SIDE_CPUS=1 for the rest, and PIN_SIDE the taskset prefix that runs a command
# on CPU 1; with one CPU all three are empty and nothing is pinned.
# shellcheck disable=SC2034 # MAIN_CPUS and PIN_SIDE are for the scripts that source this.
split_cpus() {
  if [ "$(nproc)" -ge 2 ]; then
    MAIN_CPUS=0
    SIDE_CPUS=1
    PIN_SIDE=(taskset -c "$SIDE_CPUS")
  else
    MAIN_CPUS=""
    SIDE_CPUS=""
    PIN_SIDE=()
  fi
}

# start_results: TICK_HZ (clock ticks per second) and RESULTS, an empty file of JSON
# lines in the work directory.
start_results() {
  TICK_HZ="$(getconf CLK_TCK)"
  RESULTS="$BENCH_WORK/results.jsonl"
  : >"$RESULTS"
}

# await_write PORT TOKEN WHO: waits (10 s at most) until the proxy listening on PORT
# admits a write with TOKEN; dies naming WHO otherwise.
await_write() {
  local port="$1" token="$2" who="$3" code=""
  for _ in $(seq 100); do
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X PUT -H "Fencing-Token: $token" \
      --data x "http://127.0.0.1:$port/check" || true)"
    [ "$code" = 200 ] && break
    sleep 0.1
  done
  [ "$code" = 200 ] || die "$who answers $code to a write with token $token"
}

# leader_view PORT PATTERN [SECONDS]: the leader view of the node whose API listens on
# PORT once it matches PATTERN (grep), polled every 0.1 s for SECONDS at most (default
# 30); the last view read when it never does.
leader_view() {
  local port="$1" pattern="$2" secs="${3:-30}" view=""
  for _ in $(seq $((secs * 10))); do
    view="$(curl -s --max-time 1 "http://127.0.0.1:$port/v1/leader" || true)"
    grep -q -- "$pattern" <<<"$view" && break
    sleep 0.1
  done
  printf '%s\n' "$view"
}

# record_run TARGET TICKS OUT LABEL [EXTRA_JSON [NOTE]]: appends to RESULTS one measured
# run of TARGET: the load generator's JSON report OUT (at least answered, rps, non_2xx,
# errors), the proxy's CPU TICKS over it, its CPU per request, and the fields of
# EXTRA_JSON; logs one line that starts with LABEL and ends with NOTE.
record_run() {
  python3 - "$1" "$2" "$3" "$4" "${5:-}" "${6:-}" "$TICK_HZ" >>"$RESULTS" <<'PY'
import json, sys
target, ticks, out, label, extra, note, hz = sys.argv[1:8]
ticks, hz = int(ticks), int(hz)
r = json.loads(out)
r.update(target=target, cpu_ticks=ticks, **json.loads(extra or "{}"))
r["cpu_us_per_req"] = (ticks / hz * 1e6 / r["answered"]) if r["answered"] else None
print(json.dumps(r))
print(f"  {label} {r['rps']:>9.0f} req/s  non-2xx {r['non_2xx']}  errors {r['errors']}  "
      f"cpu {r['cpu_us_per_req'] or 0:.2f} us/req{note}", file=sys.stderr)
PY
}

# cost_table BASELINE OTHER RATIO_NAME GOAL: the report of RESULTS for two proxies
# measured round by round (record_run): per proxy the medians of req/s and CPU per
# request, then OTHER's CPU per request over BASELINE's (ratio of the medians, against
# GOAL, and the median of the per-round ratios).
cost_table() {
  python3 - "$RESULTS" "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base, other, name, goal = sys.argv[2:6]
def med(xs):
    return statistics.median([x for x in xs if x is not None])
print("| proxy | req/s | CPU µs/req (median) | min | max | non-2xx | errors |")
print("|---|---|---|---|---|---|---|")
m = {}
for t in (base, other):
    rs = [r for r in rows if r["target"] == t]
    cpu = [r["cpu_us_per_req"] for r in rs]
    m[t] = med(cpu)
    print(f"| {t} | {med([r['rps'] for r in rs]):.0f} | {m[t]:.2f} | {min(cpu):.2f} | {max(cpu):.2f} | "
          f"{sum(r['non_2xx'] for r in rs)} | {sum(r['errors'] for r in rs)} |")
ratio = m[other] / m[base]
print(f"\nCPU per request, {name}, ratio of the medians: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); goal under {goal}")
# Each round ran both proxies back to back, so the ratio within a round cancels most of
# the machine's drift between rounds.
o = [r["cpu_us_per_req"] for r in rows if r["target"] == other]
b = [r["cpu_us_per_req"] for r in rows if r["target"] == base]
paired = [x / y for x, y in zip(o, b)]
print(f"median of the per-round ratios: {statistics.median(paired):.3f} "
      f"(rounds: {', '.join(f'{p:.3f}' for p in paired)})")
PY
}
