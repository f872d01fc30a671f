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
  nginx_conf "$conf" 1 "    server { listen 127.0.0.1:$port; location / { return 200 \"ok\\n\"; } }"
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
