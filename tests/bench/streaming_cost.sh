#!/usr/bin/env bash
# The cost of the streaming request path against an older build, in one run: proxy CPU per
# request of this tree's palisade versus a baseline binary (BASELINE_BIN, for example the
# last build that read bodies whole before admission), both in front of the same trivial
# upstream (nginx `return 200`), both with their fence at token 1, every request a PUT
# with that equal token. Rounds alternate the order; each proxy's CPU time comes from
# /proc/PID/stat (utime + stime) around each measured run. The report gives, per body
# size, the medians of CPU per request, their ratio, and the median of the per-round
# ratios; the goal is a ratio at or under 1.00 ("no worse").
#
# Each proxy runs 1 runtime thread pinned to CPU 0; the upstream and the load generator
# (`palisade bench` of this tree) share CPU 1, so the proxies never compete with them.
#
# With BENCH_COUNTS=1 it measures what does not depend on the machine's load instead:
# instructions per request (valgrind callgrind, the difference between a run of
# COUNT_FEW and one of COUNT_MANY requests divided by the difference, so start-up and
# shutdown cancel) and system calls per request (strace -c -f, the same difference), each
# proxy started alone under the tool, 8 connections.
#
# Usage: BASELINE_BIN=/path/to/old/palisade tests/bench/streaming_cost.sh
# Environment (defaults): BENCH_ROUNDS (7), BENCH_DURATION (4 s), BENCH_WARMUP (1 s),
# BENCH_CONNECTIONS (32), BENCH_BODY_SIZES ("1024 65536"), BENCH_DIR (/var/tmp),
# BENCH_KEEP (0), BENCH_QUIET_WAIT (0 s), BENCH_COUNTS (0), COUNT_FEW (500), COUNT_MANY
# (2500). Default run time: about 2 minutes plus builds; with BENCH_COUNTS=1 about 5.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

cost_settings 7 4
read -r -a SIZES <<<"${BENCH_BODY_SIZES:-1024 65536}"
[ -n "${BASELINE_BIN:-}" ] && [ -x "$BASELINE_BIN" ] && [ "$(basename "$BASELINE_BIN")" = palisade ] ||
  die "set BASELINE_BIN to an executable named palisade to compare with (a release build of an older commit)"

if [ "${BENCH_COUNTS:-0}" = 1 ]; then
  need valgrind valgrind
  need strace strace
fi
bench_start
split_cpus
start_results

up_port="$(free_port)"
start_upstream "$up_port" "$SIDE_CPUS"
up_pid="$SPAWNED"

# start NAME BINARY: a proxy in front of the upstream with its fence at 1; sets
# STARTED_PID and STARTED_PORT.
start() {
  local name="$1" bin="$2" admin
  STARTED_PORT="$(free_port)"
  admin="$(free_port)"
  PALISADE="$bin" start_palisade_proxy "$name" "$STARTED_PORT" "$admin" 1 "$MAIN_CPUS" \
    --upstream "http://127.0.0.1:$up_port"
  STARTED_PID="$(pgrep -g "$SPAWNED" -x palisade)"
  curl -s --fail -X POST -H "Content-Type: application/json" --data '{"token":1}' \
    "http://127.0.0.1:$admin/v1/fences/default" >/dev/null || die "cannot set the fence of $name"
}
# counted NAME TOOL BINARY BYTES REQUESTS: a proxy under TOOL (callgrind or strace)
# serving REQUESTS PUTs of BYTES; prints the tool's total (instructions, or system calls
# as "total writev").
counted() {
  local name="$1" tool="$2" bin="$3" bytes="$4" n="$5" port admin pid proxy_pid
  port="$(free_port)"
  admin="$(free_port)"
  local cmd=("$bin" proxy --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin"
    --data-dir "$BENCH_WORK/$name-data" --upstream "http://127.0.0.1:$up_port")
  case "$tool" in
    callgrind) spawn "$name" env PALISADE_WORKER_THREADS=1 valgrind --tool=callgrind \
      --dump-instr=no --callgrind-out-file="$BENCH_WORK/$name.callgrind" "${cmd[@]}" ;;
    strace) spawn "$name" env PALISADE_WORKER_THREADS=1 strace -c -f \
      -o "$BENCH_WORK/$name.strace" "${cmd[@]}" ;;
  esac
  pid="$SPAWNED"
  wait_for_line "$BENCH_WORK/$name.out" "palisade proxy listening on" 120
  curl -s --fail -X POST -H "Content-Type: application/json" --data '{"token":1}' \
    "http://127.0.0.1:$admin/v1/fences/default" >/dev/null || die "cannot set the fence of $name"
  "${PIN_SIDE[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
    --url "http://127.0.0.1:$port/bench" --method PUT --body-bytes "$bytes" \
    --token 1 --connections 8 --requests "$n" --json >/dev/null
  # The proxy itself is asked to stop (under strace, the tracer must see it exit), and
  # the tool writes its totals as it ends.
  if [ "$tool" = callgrind ]; then
    proxy_pid="$pid"
  else
    proxy_pid="$(pgrep -P "$pid" | head -1)"
  fi
  kill -TERM "$proxy_pid"
  wait "$pid" 2>/dev/null || true
  case "$tool" in
    callgrind) awk '/Collected :/ {gsub(",", "", $4); print $4}' "$BENCH_WORK/$name.err" ;;
    strace) awk '$NF == "total" {t = $4} $NF == "writev" {w = $4} END {print t + 0, w + 0}' \
      "$BENCH_WORK/$name.strace" ;;
  esac
}

if [ "${BENCH_COUNTS:-0}" = 1 ]; then
  few="${COUNT_FEW:-500}"
  many="${COUNT_MANY:-2500}"
  echo
  echo "per request, from the difference of $few and $many requests; 8 connections, PUT with an equal token"
  echo
  echo "| body | proxy | instructions | system calls | writev |"
  echo "|---|---|---|---|---|"
  for size in "${SIZES[@]}"; do
    for target in baseline current; do
      case "$target" in
        current) bin="$PALISADE" ;;
        baseline) bin="$BASELINE_BIN" ;;
      esac
      i1="$(counted "$target-$size-i1" callgrind "$bin" "$size" "$few")"
      i2="$(counted "$target-$size-i2" callgrind "$bin" "$size" "$many")"
      read -r s1 w1 <<<"$(counted "$target-$size-s1" strace "$bin" "$size" "$few")"
      read -r s2 w2 <<<"$(counted "$target-$size-s2" strace "$bin" "$size" "$many")"
      python3 - "$size" "$target" "$few" "$many" "$i1" "$i2" "$s1" "$s2" "$w1" "$w2" <<'EOF'
import sys
size, target = sys.argv[1:3]
few, many, i1, i2, s1, s2, w1, w2 = map(int, sys.argv[3:11])
n = many - few
print(f"| {size} B | {target} | {(i2 - i1) / n:,.0f} | {(s2 - s1) / n:.2f} | {(w2 - w1) / n:.2f} |")
EOF
    done
  done
  stop "$up_pid"
  exit 0
fi

start current "$PALISADE"
cur_pid="$STARTED_PID" cur_port="$STARTED_PORT"
start baseline "$BASELINE_BIN"
base_pid="$STARTED_PID" base_port="$STARTED_PORT"
log "current: pid $cur_pid :$cur_port ($PALISADE); baseline: pid $base_pid :$base_port ($BASELINE_BIN)"

# load PORT SECONDS BYTES: one run of the load generator; prints its JSON report.
load() {
  "${PIN_SIDE[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
    --url "http://127.0.0.1:$1/bench" --method PUT --body-bytes "$3" \
    --token 1 --connections "$CONNECTIONS" --json --duration "$2"
}

# one_run TARGET PORT PID BYTES: one measured run; appends a JSON line.
one_run() {
  local target="$1" port="$2" pid="$3" bytes="$4" before after out
  load "$port" "$WARMUP" "$bytes" >/dev/null
  before="$(cpu_ticks "$pid")"
  out="$(load "$port" "$DURATION" "$bytes")"
  after="$(cpu_ticks "$pid")"
  record_run "$target" "$((after - before))" "$out" "$(printf '%-9s %7s B' "$target" "$bytes")" \
    "{\"body_bytes\": $bytes}"
}

for round in $(seq "$ROUNDS"); do
  log "round $round of $ROUNDS"
  if [ $((round % 2)) = 1 ]; then order="current baseline"; else order="baseline current"; fi
  for size in "${SIZES[@]}"; do
    for target in $order; do
      case "$target" in
        current) one_run current "$cur_port" "$cur_pid" "$size" ;;
        baseline) one_run baseline "$base_port" "$base_pid" "$size" ;;
      esac
    done
  done
done

python3 - "$RESULTS" "$(nproc)" "$ROUNDS" "$DURATION" "$CONNECTIONS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cores, rounds, duration, conns = sys.argv[2:6]
print(f"\nstreaming cost: {cores} cores, {rounds} rounds of {duration} s, {conns} connections, "
      f"PUT with an equal token; proxies 1 thread each\n")
print("| body | proxy | req/s (median) | CPU µs/req (median) | min | max | non-2xx | errors |")
print("|---|---|---|---|---|---|---|---|")
summary = []
for size in sorted({r["body_bytes"] for r in rows}):
    m = {}
    for t in ("baseline", "current"):
        rs = [r for r in rows if r["target"] == t and r["body_bytes"] == size]
        cpu = [r["cpu_us_per_req"] for r in rs if r["cpu_us_per_req"] is not None]
        m[t] = statistics.median(cpu)
        print(f"| {size} B | {t} | {statistics.median([r['rps'] for r in rs]):.0f} | {m[t]:.2f} | "
              f"{min(cpu):.2f} | {max(cpu):.2f} | {sum(r['non_2xx'] for r in rs)} | {sum(r['errors'] for r in rs)} |")
    cur = [r["cpu_us_per_req"] for r in rows if r["target"] == "current" and r["body_bytes"] == size]
    base = [r["cpu_us_per_req"] for r in rows if r["target"] == "baseline" and r["body_bytes"] == size]
    paired = statistics.median([a / b for a, b in zip(cur, base)])
    summary.append(f"{size} B: current/baseline CPU per request, ratio of the medians "
                   f"{m['current'] / m['baseline']:.3f}, median of the per-round ratios {paired:.3f}")
print()
print("\n".join(summary))
EOF
stop "$up_pid"
