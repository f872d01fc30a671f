#!/usr/bin/env bash
# Proxy throughput, side by side: one trivial upstream (nginx `return 200`) reached
# directly, through nginx `proxy_pass` (keepalive to the upstream), and through
# `palisade proxy --upstream`, with the same number of worker threads for both proxies.
# 1 KiB PUTs with an equal token (the fence is set once, first). Rounds alternate the
# targets; the report gives medians and the palisade/nginx ratios. Then a disk I/O check:
# /proc/PID/io of the palisade proxy across a run of equal-token requests.
#
# With 1 thread, each proxy is pinned to CPU 0 and the upstream and the load generator to
# CPU 1 (taskset), so the proxies never compete with them; with 2 threads nothing is
# pinned. `palisade bench` is the load generator for every target.
#
# Environment (defaults): BENCH_THREADS ("1 2"), BENCH_ROUNDS (5), BENCH_DURATION (4 s),
# BENCH_WARMUP (1 s), BENCH_CONNECTIONS (32), BENCH_BODY_BYTES (1024), BENCH_DIR
# (/var/tmp), BENCH_KEEP (0), BENCH_QUIET_WAIT (0 s: how long to wait for a quiet machine).
# Default run time: about 3 minutes plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

THREADS="${BENCH_THREADS:-1 2}"
ROUNDS="${BENCH_ROUNDS:-5}"
DURATION="${BENCH_DURATION:-4}"
WARMUP="${BENCH_WARMUP:-1}"
CONNECTIONS="${BENCH_CONNECTIONS:-32}"
BODY_BYTES="${BENCH_BODY_BYTES:-1024}"
TOKEN=1

need nginx nginx
need taskset util-linux
need python3 python3
build_palisade
make_workdir
machine_report
wait_quiet

TICK_HZ="$(getconf CLK_TCK)"
RESULTS="$BENCH_WORK/results.jsonl"
: >"$RESULTS"

# one_run TARGET THREADS URL CLIENT_CPUS PIDS...: one measured run; appends a JSON line
# with the client's report and the server-side CPU time per request.
one_run() {
  local target="$1" threads="$2" url="$3" cpus="$4"
  shift 4
  local before after out
  local client=(env PALISADE_WORKER_THREADS=1 "$PALISADE" bench --url "$url" --method PUT
    --body-bytes "$BODY_BYTES" --token "$TOKEN" --connections "$CONNECTIONS" --json)
  if [ -n "$cpus" ]; then
    client=(taskset -c "$cpus" "${client[@]}")
  fi
  # Warm-up as a separate run, so the CPU time read around the measured run belongs to
  # the measured requests alone.
  "${client[@]}" --duration "$WARMUP" >/dev/null
  before="$(cpu_ticks "$@")"
  out="$("${client[@]}" --duration "$DURATION")"
  after="$(cpu_ticks "$@")"
  python3 - "$target" "$threads" "$((after - before))" "$TICK_HZ" "$out" >>"$RESULTS" <<'EOF'
import json, sys
target, threads, ticks, hz, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r = json.loads(out)
r.update(target=target, threads=threads, cpu_ticks=ticks,
         cpu_us_per_req=(ticks / hz * 1e6 / r["answered"]) if r["answered"] else None)
print(json.dumps(r))
l = r["latency_us"]
print(f"  {target:<9} {threads}t {r['rps']:>9.0f} req/s  p50 {l['p50'] / 1000:.3f} ms  "
      f"p99 {l['p99'] / 1000:.3f} ms  non-2xx {r['non_2xx']}  errors {r['errors']}  "
      f"cpu {r['cpu_us_per_req'] or 0:.1f} us/req", file=sys.stderr)
EOF
}

for threads in $THREADS; do
  if [ "$threads" = 1 ]; then
    proxy_cpus=0
    side_cpus=1
  else
    proxy_cpus=""
    side_cpus=""
  fi
  up_port="$(free_port)"
  start_upstream "$up_port" "$side_cpus"
  up_pid="$SPAWNED"
  read -r -a up_all <<<"$(group_pids "$up_pid")"

  nginx_port="$(free_port)"
  start_nginx_proxy "$nginx_port" "$up_port" "$threads" "$proxy_cpus"
  nginx_pid="$SPAWNED"
  read -r -a nginx_all <<<"$(group_pids "$nginx_pid")"

  pal_port="$(free_port)"
  pal_admin="$(free_port)"
  start_palisade_proxy "palisade-$threads" "$pal_port" "$pal_admin" "$threads" "$proxy_cpus" \
    --upstream "http://127.0.0.1:$up_port"
  pal_group="$SPAWNED"
  pal_pid="$(pgrep -g "$pal_group" -x palisade)"
  curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
    "http://127.0.0.1:$pal_admin/v1/fences/default" >/dev/null
  log "$threads thread(s): upstream :$up_port, nginx :$nginx_port (pids ${nginx_all[*]}), palisade :$pal_port (pid $pal_pid, $(awk '/^Threads:/ {print $2}' "/proc/$pal_pid/status") threads)"

  for round in $(seq "$ROUNDS"); do
    log "round $round of $ROUNDS, $threads thread(s)"
    # Alternate the order every round, so a drift in the machine's speed hits all alike.
    if [ $((round % 2)) = 1 ]; then
      order="direct nginx palisade"
    else
      order="palisade nginx direct"
    fi
    for target in $order; do
      case "$target" in
        direct) one_run direct "$threads" "http://127.0.0.1:$up_port/bench" "$side_cpus" "${up_all[@]}" ;;
        nginx) one_run nginx "$threads" "http://127.0.0.1:$nginx_port/bench" "$side_cpus" "${nginx_all[@]}" ;;
        palisade) one_run palisade "$threads" "http://127.0.0.1:$pal_port/bench" "$side_cpus" "$pal_pid" ;;
      esac
    done
  done

  # Disk I/O of equal-token requests: /proc/PID/io before and after one run, then a
  # short control run where every request advances the fence (which must show writes).
  sync
  wb0="$(proc_io "$pal_pid" write_bytes)"
  sw0="$(proc_io "$pal_pid" syscw)"
  eq_out="$(PALISADE_WORKER_THREADS=1 "$PALISADE" bench --url "http://127.0.0.1:$pal_port/io" \
    --method PUT --body-bytes "$BODY_BYTES" --token "$TOKEN" --connections "$CONNECTIONS" \
    --duration 3 --json)"
  wb1="$(proc_io "$pal_pid" write_bytes)"
  sw1="$(proc_io "$pal_pid" syscw)"
  ctl_out="$(PALISADE_WORKER_THREADS=1 "$PALISADE" bench --url "http://127.0.0.1:$pal_port/io" \
    --method PUT --body-bytes "$BODY_BYTES" --token "$TOKEN" --advance-share 1 \
    --connections 1 --requests 200 --json)"
  wb2="$(proc_io "$pal_pid" write_bytes)"
  sw2="$(proc_io "$pal_pid" syscw)"
  python3 - "$threads" "$wb0" "$wb1" "$wb2" "$sw0" "$sw1" "$sw2" "$eq_out" "$ctl_out" >>"$BENCH_WORK/io.jsonl" <<'EOF'
import json, sys
t, wb0, wb1, wb2, sw0, sw1, sw2 = map(int, sys.argv[1:8])
eq, ctl = json.loads(sys.argv[8]), json.loads(sys.argv[9])
print(json.dumps({"threads": t, "equal_requests": eq["answered"], "equal_write_bytes": wb1 - wb0,
                  "equal_syscw": sw1 - sw0, "advance_requests": ctl["ok"],
                  "advance_write_bytes": wb2 - wb1, "advance_syscw": sw2 - sw1}))
EOF
  log "disk I/O: $(tail -1 "$BENCH_WORK/io.jsonl")"
  stop "$pal_group"
  stop "$nginx_pid"
  stop "$up_pid"
done

python3 - "$RESULTS" "$BENCH_WORK/io.jsonl" "$(nproc)" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
io = [json.loads(l) for l in open(sys.argv[2])]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
print(f"\nproxy benchmark: {sys.argv[3]} cores, {rows[0]['connections']} connections, "
      f"PUT {rows[0]['body_bytes']} B, equal token; medians of {len(rows) // 3 // len({r['threads'] for r in rows})} rounds\n")
print("| threads | target | req/s | p50 ms | p99 ms | CPU µs/req | non-2xx | errors |")
print("|---|---|---|---|---|---|---|---|")
summary = {}
for t in sorted({r["threads"] for r in rows}):
    for target in ("direct", "nginx", "palisade"):
        rs = [r for r in rows if r["threads"] == t and r["target"] == target]
        m = dict(rps=med([r["rps"] for r in rs]), p50=med([r["latency_us"]["p50"] for r in rs]) / 1000,
                 p99=med([r["latency_us"]["p99"] for r in rs]) / 1000,
                 cpu=med([r["cpu_us_per_req"] for r in rs]),
                 non2xx=sum(r["non_2xx"] for r in rs), errors=sum(r["errors"] for r in rs))
        summary[(t, target)] = m
        cpu = "" if target == "direct" else f"{m['cpu']:.1f}"
        print(f"| {t} | {target} | {m['rps']:.0f} | {m['p50']:.3f} | {m['p99']:.3f} | {cpu} | {m['non2xx']} | {m['errors']} |")
print("\n| threads | palisade/nginx req/s | p50 | p99 | CPU per request |")
print("|---|---|---|---|---|")
for t in sorted({r["threads"] for r in rows}):
    p, n = summary[(t, "palisade")], summary[(t, "nginx")]
    print(f"| {t} | {p['rps'] / n['rps']:.2f} | {p['p50'] / n['p50']:.2f} | {p['p99'] / n['p99']:.2f} | {p['cpu'] / n['cpu']:.2f} |")
print("\n| threads | equal-token requests | write_bytes | syscw | advancing requests (control) | write_bytes | syscw |")
print("|---|---|---|---|---|---|---|")
for r in io:
    print(f"| {r['threads']} | {r['equal_requests']} | {r['equal_write_bytes']} | {r['equal_syscw']} | "
          f"{r['advance_requests']} | {r['advance_write_bytes']} | {r['advance_syscw']} |")
EOF
