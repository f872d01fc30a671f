#!/usr/bin/env bash
# The proxy's cost on a machine with at least 16 cores, in one command: palisade, nginx and
# HAProxy side by side (proxy.sh) at 1, 2, 4 and 8 proxy threads, each pinned to its own
# cores, PUTs and GETs; peak memory at 1,000 busy connections with 4 workers each
# (memory.sh), once alone and once after a phase of 64 busy connections (on 16 cores the
# allocator's thread caches keep up to about 20 MiB from that phase); and, where `perf`
# works, a flat CPU profile of the palisade proxy under load at 1, 4 and 8 threads, to
# see where a cost that grows with threads goes.
#
# Cores: for 1, 2 and 4 threads, the upstream on 0-3, the proxies from core 4, the load
# generator on 8-15; for 8 threads, the upstream on 0-2, the proxies on 3-10 and the load
# generator on 11-15 (so no two of them ever share a core).
#
# BENCH_FLOOR=1 also runs proxy.sh at 1 thread with the benchmarks' yardstick beside the
# others (tests/bench/floor: the least an HTTP/1 proxy on tokio does per request;
# `proxy-1-floor.txt`): BENCH_FLOOR_BIN (target/release/palisade-floor, built here unless
# BENCH_NO_BUILD=1). Off by default, so that the whole run fits in 10 minutes.
#
# It also runs proxy.sh at 1 and 4 threads with the same binary beside itself on hyper's
# upstream client (`upstream_http1_client = "hyper"`, named "hyper" in the tables;
# `proxy-1-4-hyper.txt`), to measure the proxy's own upstream exchange against it where
# threads share a machine; BENCH_HYPER=0 leaves that run out.
#
# Environment (defaults): BENCH_ROUNDS (3), BENCH_DURATION (3 s), BENCH_CONNECTIONS
# (128), BENCH_PROFILE (1 when `perf` is installed), BENCH_PROFILE_THREADS ("1 4 8"),
# BENCH_OUT (a directory for the tables and profiles; none: printed only), and those of
# proxy.sh and memory.sh (BENCH_NO_BUILD, BENCH_PALISADE_BIN, ...).
# To measure the build with profile-guided optimisation, carry target/pgo/palisade (made
# here by tests/bench/pgo.sh: the lent machine has no registry) and set BENCH_PALISADE_BIN
# to it, with BENCH_NO_BUILD=1.
# Run time: about 9.5 minutes plus the build (BENCH_FLOOR=1 adds 1.5, BENCH_HYPER=0 takes
# 3 off).
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

here="$(cd "$(dirname "$0")" && pwd)"
cores="$(nproc)"
[ "$cores" -ge 16 ] || die "this layout needs at least 16 cores; this machine has $cores"
OUT_DIR="${BENCH_OUT:-}"
[ -n "$OUT_DIR" ] && mkdir -p "$OUT_DIR"
export BENCH_ROUNDS="${BENCH_ROUNDS:-3}" BENCH_DURATION="${BENCH_DURATION:-3}"
export BENCH_CONNECTIONS="${BENCH_CONNECTIONS:-128}" BENCH_METHODS="${BENCH_METHODS:-PUT GET}"
export BENCH_DIRECT="${BENCH_DIRECT:-0}"
need taskset util-linux
build_palisade
FLOOR_BIN="${BENCH_FLOOR_BIN:-$BENCH_ROOT/target/release/palisade-floor}"
if [ "${BENCH_FLOOR:-0}" = 1 ] && [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "building palisade-floor (release)"
  (cd "$BENCH_ROOT" && cargo build --release -p palisade-floor --quiet)
fi
export BENCH_NO_BUILD=1

# keep NAME CMD...: runs CMD, and copies its output to $OUT_DIR/NAME when one is set.
keep() {
  local name="$1"
  shift
  if [ -n "$OUT_DIR" ]; then
    "$@" 2>&1 | tee "$OUT_DIR/$name"
  else
    "$@"
  fi
}

log "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), kernel $(uname -r)"
keep proxy-1-2-4.txt env BENCH_THREADS="1 2 4" BENCH_UPSTREAM_CPUS=0-3 BENCH_PROXY_CPU_BASE=4 \
  BENCH_CLIENT_CPUS=8-15 BENCH_CLIENT_THREADS=8 "$here/proxy.sh"
keep proxy-8.txt env BENCH_THREADS=8 BENCH_UPSTREAM_CPUS=0-2 BENCH_PROXY_CPU_BASE=3 \
  BENCH_CLIENT_CPUS=11-15 BENCH_CLIENT_THREADS=5 "$here/proxy.sh"
if [ "${BENCH_FLOOR:-0}" = 1 ]; then
  if [ -x "$FLOOR_BIN" ]; then
    keep proxy-1-floor.txt env BENCH_THREADS=1 BENCH_UPSTREAM_CPUS=0-3 BENCH_PROXY_CPU_BASE=4 \
      BENCH_CLIENT_CPUS=8-15 BENCH_CLIENT_THREADS=8 BASELINE_BIN="$FLOOR_BIN" BASELINE_NAME=floor \
      "$here/proxy.sh"
  else
    log "no yardstick at $FLOOR_BIN: the run beside it is left out"
  fi
fi
if [ "${BENCH_HYPER:-1}" = 1 ]; then
  hyper_conf="$(mktemp)"
  echo 'upstream_http1_client = "hyper"' >"$hyper_conf"
  keep proxy-1-4-hyper.txt env BENCH_THREADS="1 4" BENCH_UPSTREAM_CPUS=0-3 BENCH_PROXY_CPU_BASE=4 \
    BENCH_CLIENT_CPUS=8-15 BENCH_CLIENT_THREADS=8 BASELINE_BIN="$PALISADE" BASELINE_NAME=hyper \
    BASELINE_ARGS="--config $hyper_conf" "$here/proxy.sh"
  rm -f "$hyper_conf"
fi
keep memory-4.txt env BENCH_WORKERS=4 BENCH_LOAD_CONNECTIONS=1000 BENCH_DURATION=6 \
  "$here/memory.sh"
keep memory-4-after-64.txt env BENCH_WORKERS=4 BENCH_LOAD_CONNECTIONS="64 1000" BENCH_DURATION=6 \
  "$here/memory.sh"

profile_default=0
command -v perf >/dev/null 2>&1 && profile_default=1
[ "${BENCH_PROFILE:-$profile_default}" = 1 ] || exit 0
need perf linux-perf

# The profiles: the proxy pinned as in the comparison, under 128 connections of PUTs,
# sampled by the CPU clock (a virtual machine may have no hardware counters).
make_workdir
TOKEN=1
# report DATA: the samples' shares by program and library, then by function (0.5% and up).
report() {
  local sort
  for sort in dso dso,symbol; do
    { perf report -i "$1" --stdio --no-children --sort "$sort" --percent-limit 0.5 2>/dev/null || true; } |
      grep -v '^#' | grep -v '^$' | cut -c1-150 | sed 's/ *$//'
    echo
  done
}
for threads in ${BENCH_PROFILE_THREADS:-1 4 8}; do
  if [ "$threads" -le 4 ]; then
    up_cpus=0-3 base=4 client_cpus=8-15
  else
    up_cpus=0-2 base=3 client_cpus=11-15
  fi
  up_port="$(free_port)"
  UPSTREAM_WORKERS="$(taskset -c "$up_cpus" nproc)" start_upstream "$up_port" "$up_cpus"
  up_pid="$SPAWNED"
  port="$(free_port)"
  admin="$(free_port)"
  start_palisade_proxy "profiled-$threads" "$port" "$admin" "$threads" \
    "$base-$((base + threads - 1))" --upstream "http://127.0.0.1:$up_port"
  group="$SPAWNED"
  pid="$(pgrep -g "$group" -x palisade)"
  curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
    "http://127.0.0.1:$admin/v1/fences/default" >/dev/null
  spawn "profile-load-$threads" taskset -c "$client_cpus" \
    env PALISADE_WORKER_THREADS="$(taskset -c "$client_cpus" nproc)" \
    "$PALISADE" bench --url "http://127.0.0.1:$port/p" --method PUT --body-bytes 1024 \
    --token "$TOKEN" --connections "$BENCH_CONNECTIONS" --duration 8
  load="$SPAWNED"
  sleep 1
  perf record -q -e cpu-clock -F 1999 -p "$pid" -o "$BENCH_WORK/perf-$threads.data" -- sleep 5 \
    >/dev/null 2>&1 || log "perf record failed at $threads threads"
  wait "$load" 2>/dev/null || true
  log "profile at $threads thread(s): $(tail -3 "$BENCH_WORK/profile-load-$threads.out" | tr -s ' ' | tr '\n' ';')"
  if [ -s "$BENCH_WORK/perf-$threads.data" ]; then
    keep "profile-$threads.txt" report "$BENCH_WORK/perf-$threads.data"
  fi
  stop "$group"
  stop "$up_pid"
done
