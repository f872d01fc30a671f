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
# Usage: BASELINE_BIN=/path/to/old/palisade tests/bench/streaming_cost.sh
# Environment (defaults): BENCH_ROUNDS (7), BENCH_DURATION (4 s), BENCH_WARMUP (1 s),
# BENCH_CONNECTIONS (32), BENCH_BODY_SIZES ("1024 65536"), BENCH_DIR (/var/tmp),
# BENCH_KEEP (0), BENCH_QUIET_WAIT (0 s). Default run time: about 2 minutes plus builds.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ROUNDS="${BENCH_ROUNDS:-7}"
DURATION="${BENCH_DURATION:-4}"
WARMUP="${BENCH_WARMUP:-1}"
CONNECTIONS="${BENCH_CONNECTIONS:-32}"
read -r -a SIZES <<<"${BENCH_BODY_SIZES:-1024 65536}"
[ -n "${BASELINE_BIN:-}" ] && [ -x "$BASELINE_BIN" ] && [ "$(basename "$BASELINE_BIN")" = palisade ] ||
  die "set BASELINE_BIN to an executable named palisade to compare with (a release build of an older commit)"

need nginx nginx
need taskset util-linux
need python3 python3
need curl curl
build_palisade
make_workdir
machine_report
wait_quiet

if [ "$(nproc)" -ge 2 ]; then
  proxy_cpus=0
  pin_side=(taskset -c 1)
  side_cpus=1
else
  proxy_cpus=""
  pin_side=()
  side_cpus=""
fi
TICK_HZ="$(getconf CLK_TCK)"
RESULTS="$BENCH_WORK/results.jsonl"
: >"$RESULTS"

up_port="$(free_port)"
start_upstream "$up_port" "$side_cpus"
up_pid="$SPAWNED"

# start NAME BINARY: a proxy in front of the upstream with its fence at 1; sets
# STARTED_PID and STARTED_PORT.
start() {
  local name="$1" bin="$2" admin
  STARTED_PORT="$(free_port)"
  admin="$(free_port)"
  PALISADE="$bin" start_palisade_proxy "$name" "$STARTED_PORT" "$admin" 1 "$proxy_cpus" \
    --upstream "http://127.0.0.1:$up_port"
  STARTED_PID="$(pgrep -g "$SPAWNED" -x palisade)"
  curl -s --fail -X POST -H "Content-Type: application/json" --data '{"token":1}' \
    "http://127.0.0.1:$admin/v1/fences/default" >/dev/null || die "cannot set the fence of $name"
}
start current "$PALISADE"
cur_pid="$STARTED_PID" cur_port="$STARTED_PORT"
start baseline "$BASELINE_BIN"
base_pid="$STARTED_PID" base_port="$STARTED_PORT"
log "current: pid $cur_pid :$cur_port ($PALISADE); baseline: pid $base_pid :$base_port ($BASELINE_BIN)"

# load PORT SECONDS BYTES: one run of the load generator; prints its JSON report.
load() {
  "${pin_side[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
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
  python3 - "$target" "$bytes" "$((after - before))" "$TICK_HZ" "$out" >>"$RESULTS" <<'EOF'
import json, sys
target, size, ticks, hz, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r = json.loads(out)
r.update(target=target, body_bytes=size, cpu_ticks=ticks,
         cpu_us_per_req=(ticks / hz * 1e6 / r["answered"]) if r["answered"] else None)
print(json.dumps(r))
print(f"  {target:<9} {size:>7} B {r['rps']:>9.0f} req/s  non-2xx {r['non_2xx']}  errors {r['errors']}  "
      f"cpu {r['cpu_us_per_req'] or 0:.2f} us/req", file=sys.stderr)
EOF
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
