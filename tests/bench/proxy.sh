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
# CPU time per request is read from /proc/PID/stat around each measured run, split into
# user and system time: both proxies make the same socket calls per request (two reads,
# two writes), so the system time is a floor they share, and the user time is where they
# differ.
#
# BASELINE_BIN=PATH adds a fourth target, "before": a second palisade binary (say, the
# release build of an older commit) measured in the same rounds, for a before/after
# table from one run. BASELINE_NAME (before) names it in the tables: the benchmarks'
# yardstick, `BASELINE_BIN=target/release/palisade-floor BASELINE_NAME=floor` (built by
# `cargo build --release -p palisade-floor`), shows how far palisade is from the least an
# HTTP/1 proxy on tokio does per request (tests/bench/floor/src/main.rs).
#
# BENCH_COUNTS=1 measures what does not depend on the machine's load instead:
# instructions per request in user space (valgrind callgrind; the difference between a
# run of COUNT_FEW and one of COUNT_MANY requests, which divides out start-up), for
# nginx (one worker, no master process), palisade (one worker thread) and, with
# BASELINE_BIN, the baseline; 8 connections.
#
# BENCH_PIN=0 leaves one thread's proxies unpinned too, as two threads' are: the figures
# then show what sharing both cores with the client and the upstream costs, apart from
# the number of threads.
#
# BENCH_METHODS ("PUT"): the requests measured, in turn: PUT (1 KiB bodies with an equal
# token) and GET (no token: unfenced reads pass through; the upstream answers 1 KiB).
#
# HAProxy is measured beside nginx when `haproxy` is installed (BENCH_HAPROXY=0 leaves it
# out), with `nbthread` equal to the thread count and the same pinning as the proxies.
#
# A many-core layout (BENCH_PROXY_CPU_BASE=N): every proxy is pinned to cores N to
# N+THREADS-1, the upstream to BENCH_UPSTREAM_CPUS (0-3, with one nginx worker per core),
# and the load generator to BENCH_CLIENT_CPUS (8-15, with BENCH_CLIENT_THREADS runtime
# threads, 4), so that no two of them share a core at any thread count. For 8 threads on
# 16 cores: BENCH_UPSTREAM_CPUS=0-2 BENCH_PROXY_CPU_BASE=3 BENCH_CLIENT_CPUS=11-15.
#
# BENCH_DIRECT=0 leaves out the upstream reached directly (a reference, not a ratio's
# term), to save a quarter of the run time.
#
# BENCH_PALISADE_ARGS="FLAGS" appends FLAGS (split on spaces) to the palisade target's
# `palisade proxy` flags (not the baseline's), say "--reuseport-threads 2
# --worker-threads 1" to measure the thread-per-core mode at BENCH_THREADS=2.
# BASELINE_ARGS="FLAGS" does the same for the baseline's: with BASELINE_BIN set to the
# same binary, `BASELINE_ARGS="--config hyper.toml" BASELINE_NAME=hyper` (the file
# holding `upstream_http1_client = "hyper"`) compares the two upstream exchanges.
#
# Environment (defaults): BENCH_THREADS ("1 2"), BENCH_ROUNDS (5), BENCH_DURATION (4 s),
# BENCH_WARMUP (1 s), BENCH_CONNECTIONS (32), BENCH_BODY_BYTES (1024), BENCH_DIR
# (/var/tmp), BENCH_KEEP (0), BENCH_QUIET_WAIT (0 s: how long to wait for a quiet machine),
# BENCH_PIN (1), BASELINE_BIN (none), BASELINE_NAME (before), BENCH_COUNTS (0), COUNT_FEW
# (1000), COUNT_MANY (6000), COUNT_REPEATS (3), COUNT_METHOD (PUT).
# Default run time: about 3 minutes plus the build (4 with BASELINE_BIN); with
# BENCH_COUNTS=1 about 8.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

THREADS="${BENCH_THREADS:-1 2}"
ROUNDS="${BENCH_ROUNDS:-5}"
DURATION="${BENCH_DURATION:-4}"
WARMUP="${BENCH_WARMUP:-1}"
CONNECTIONS="${BENCH_CONNECTIONS:-32}"
BODY_BYTES="${BENCH_BODY_BYTES:-1024}"
METHODS="${BENCH_METHODS:-PUT}"
DIRECT="${BENCH_DIRECT:-1}"
TOKEN=1
CLIENT_THREADS=1
if [ -n "${BENCH_PROXY_CPU_BASE:-}" ]; then
  UPSTREAM_CPUS="${BENCH_UPSTREAM_CPUS:-0-3}"
  CLIENT_CPUS="${BENCH_CLIENT_CPUS:-8-15}"
  CLIENT_THREADS="${BENCH_CLIENT_THREADS:-4}"
  # One upstream worker per core it has.
  UPSTREAM_WORKERS="$(taskset -c "$UPSTREAM_CPUS" nproc)"
  export UPSTREAM_WORKERS
fi
for m in $METHODS; do
  case "$m" in PUT | GET) ;; *) die "BENCH_METHODS: $m is neither PUT nor GET" ;; esac
done
HAPROXY=0
if [ "${BENCH_HAPROXY:-1}" = 1 ] && command -v haproxy >/dev/null; then
  HAPROXY=1
fi

need nginx nginx
need taskset util-linux
need python3 python3
if [ -n "${BASELINE_BIN:-}" ] && [ ! -x "$BASELINE_BIN" ]; then
  die "BASELINE_BIN=$BASELINE_BIN is not an executable"
fi
if [ "${BENCH_COUNTS:-0}" = 1 ]; then
  need valgrind valgrind
fi
build_palisade
make_workdir
machine_report
wait_quiet
# Every connection is a descriptor in the client and one in each proxy.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

TICK_HZ="$(getconf CLK_TCK)"
RESULTS="$BENCH_WORK/results.jsonl"
: >"$RESULTS"

# counted NAME KIND BINARY REQUESTS [FLAGS]: a proxy (KIND nginx or palisade, FLAGS
# appended to a palisade's flags) under callgrind in front of the upstream on $up_port,
# serving REQUESTS PUTs (GETs of the upstream's 1 KiB answer with COUNT_METHOD=GET) from 8
# connections; prints the instructions callgrind collected.
counted() {
  local name="$1" kind="$2" bin="$3" n="$4" port admin pid conf extra
  read -r -a extra <<<"${5:-}"
  port="$(free_port)"
  case "$kind" in
    nginx)
      conf="$BENCH_WORK/$name.conf"
      nginx_proxy_conf "$conf" "$port" "$up_port" 1
      # One process: the worker's instructions are the proxy's.
      sed -i '1i master_process off;' "$conf"
      spawn "$name" valgrind --tool=callgrind --dump-instr=no \
        --callgrind-out-file="$BENCH_WORK/$name.callgrind" nginx -c "$conf" -p "$BENCH_WORK"
      pid="$SPAWNED"
      wait_for_http "http://127.0.0.1:$port/" 120
      ;;
    palisade)
      admin="$(free_port)"
      spawn "$name" env PALISADE_WORKER_THREADS=1 valgrind --tool=callgrind --dump-instr=no \
        --callgrind-out-file="$BENCH_WORK/$name.callgrind" "$bin" proxy \
        --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
        --data-dir "$BENCH_WORK/$name-data" --upstream "http://127.0.0.1:$up_port" "${extra[@]}"
      pid="$SPAWNED"
      wait_for_line "$BENCH_WORK/$name.out" "palisade proxy listening on" 120
      curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
        "http://127.0.0.1:$admin/v1/fences/default" >/dev/null || die "cannot set the fence of $name"
      ;;
  esac
  local what=(--url "http://127.0.0.1:$port/bench" --method PUT --body-bytes "$BODY_BYTES"
    --token "$TOKEN")
  if [ "${COUNT_METHOD:-PUT}" = GET ]; then
    what=(--url "http://127.0.0.1:$port/get/bench" --method GET --body-bytes 0)
  fi
  taskset -c 1 env PALISADE_WORKER_THREADS=1 "$PALISADE" bench "${what[@]}" \
    --connections 8 --requests "$n" --json >/dev/null
  # valgrind runs the program in its own process: signal the group's members so the
  # tool writes its totals as the proxy exits (nginx stops gracefully on QUIT).
  case "$kind" in
    nginx) kill -QUIT "$pid" ;;
    palisade) kill -TERM "$pid" ;;
  esac
  wait "$pid" 2>/dev/null || true
  awk '/Collected :/ {gsub(",", "", $4); print $4}' "$BENCH_WORK/$name.err"
}

if [ "${BENCH_COUNTS:-0}" = 1 ]; then
  few="${COUNT_FEW:-1000}"
  many="${COUNT_MANY:-6000}"
  # How the requests interleave (how many are ready per wake-up) moves a count by a few
  # percent from one pair of runs to the next, so each is repeated and the median given.
  repeats="${COUNT_REPEATS:-3}"
  up_port="$(free_port)"
  start_upstream "$up_port" 1
  up_pid="$SPAWNED"
  counts=("nginx nginx" "palisade $PALISADE")
  [ -n "${BASELINE_BIN:-}" ] && counts+=("${BASELINE_NAME:-before} $BASELINE_BIN")
  echo
  echo "user-space instructions per request, from the difference of $few and $many requests;"
  if [ "${COUNT_METHOD:-PUT}" = GET ]; then
    echo "8 connections, GET of 1024 B (unfenced read), one worker"
  else
    echo "8 connections, PUT $BODY_BYTES B with an equal token, one worker"
  fi
  echo
  echo "| proxy | instructions per request (median) | each repetition |"
  echo "|---|---|---|"
  for t in "${counts[@]}"; do
    read -r name bin <<<"$t"
    kind=palisade
    [ "$name" = nginx ] && kind=nginx
    args=""
    [ "$bin" = "${BASELINE_BIN:-}" ] && [ "$name" != palisade ] && args="${BASELINE_ARGS:-}"
    per=()
    for rep in $(seq "$repeats"); do
      i1="$(counted "$name-few-$rep" "$kind" "$bin" "$few" "$args")"
      i2="$(counted "$name-many-$rep" "$kind" "$bin" "$many" "$args")"
      per+=($(((i2 - i1) / (many - few))))
    done
    echo "| $name | $(printf '%s\n' "${per[@]}" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}') | ${per[*]} |"
  done
  stop "$up_pid"
  exit 0
fi

# one_run TARGET THREADS METHOD BASE_URL CLIENT_CPUS PIDS...: one measured run; appends a
# JSON line with the client's report and the server-side CPU time per request.
one_run() {
  local target="$1" threads="$2" method="$3" url="$4" cpus="$5"
  shift 5
  local out
  local client=(env "PALISADE_WORKER_THREADS=$CLIENT_THREADS" "$PALISADE" bench
    --connections "$CONNECTIONS" --json)
  if [ "$method" = GET ]; then
    client+=(--url "$url/get/bench" --method GET --body-bytes 0)
  else
    client+=(--url "$url/bench" --method PUT --body-bytes "$BODY_BYTES" --token "$TOKEN")
  fi
  if [ -n "$cpus" ]; then
    client=(taskset -c "$cpus" "${client[@]}")
  fi
  # Warm-up as a separate run, so the CPU time read around the measured run belongs to
  # the measured requests alone.
  "${client[@]}" --duration "$WARMUP" >/dev/null
  local round="$ROUND" u0 s0 u1 s1
  read -r u0 s0 <<<"$(cpu_ticks_split "$@")"
  out="$("${client[@]}" --duration "$DURATION")"
  read -r u1 s1 <<<"$(cpu_ticks_split "$@")"
  python3 - "$target" "$threads" "$((u1 - u0))" "$((s1 - s0))" "$TICK_HZ" "$round" "$out" "$method" >>"$RESULTS" <<'EOF'
import json, sys
target, threads, user, system, hz, rnd, out, method = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8])
r = json.loads(out)
per = lambda ticks: (ticks / hz * 1e6 / r["answered"]) if r["answered"] else None
r.update(target=target, threads=threads, method=method, round=rnd, cpu_ticks=user + system,
         cpu_us_per_req=per(user + system), user_us_per_req=per(user), system_us_per_req=per(system))
print(json.dumps(r))
l = r["latency_us"]
print(f"  {target:<9} {threads}t {method:<3} {r['rps']:>9.0f} req/s  p50 {l['p50'] / 1000:.3f} ms  "
      f"p99 {l['p99'] / 1000:.3f} ms  non-2xx {r['non_2xx']}  errors {r['errors']}  "
      f"cpu {r['cpu_us_per_req'] or 0:.1f} us/req", file=sys.stderr)
EOF
}

for threads in $THREADS; do
  up_cpus=""
  if [ -n "${BENCH_PROXY_CPU_BASE:-}" ]; then
    proxy_cpus="$BENCH_PROXY_CPU_BASE-$((BENCH_PROXY_CPU_BASE + threads - 1))"
    side_cpus="$CLIENT_CPUS"
    up_cpus="$UPSTREAM_CPUS"
  elif [ "$threads" = 1 ] && [ "${BENCH_PIN:-1}" = 1 ]; then
    proxy_cpus=0
    side_cpus=1
    up_cpus=1
  else
    proxy_cpus=""
    side_cpus=""
  fi
  up_port="$(free_port)"
  start_upstream "$up_port" "$up_cpus"
  up_pid="$SPAWNED"
  read -r -a up_all <<<"$(group_pids "$up_pid")"

  nginx_port="$(free_port)"
  start_nginx_proxy "$nginx_port" "$up_port" "$threads" "$proxy_cpus"
  nginx_pid="$SPAWNED"
  read -r -a nginx_all <<<"$(group_pids "$nginx_pid")"

  pal_port="$(free_port)"
  pal_admin="$(free_port)"
  read -r -a pal_extra <<<"${BENCH_PALISADE_ARGS:-}"
  start_palisade_proxy "palisade-$threads" "$pal_port" "$pal_admin" "$threads" "$proxy_cpus" \
    --upstream "http://127.0.0.1:$up_port" "${pal_extra[@]}"
  pal_group="$SPAWNED"
  pal_pid="$(pgrep -g "$pal_group" -x palisade)"
  curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
    "http://127.0.0.1:$pal_admin/v1/fences/default" >/dev/null
  log "$threads thread(s): upstream :$up_port, nginx :$nginx_port (pids ${nginx_all[*]}), palisade :$pal_port (pid $pal_pid, $(awk '/^Threads:/ {print $2}' "/proc/$pal_pid/status") threads)"

  targets="nginx palisade"
  [ "$DIRECT" = 1 ] && targets="direct $targets"
  if [ "$HAPROXY" = 1 ]; then
    hap_port="$(free_port)"
    start_haproxy "$hap_port" "$up_port" "$threads" "$proxy_cpus"
    hap_pid="$SPAWNED"
    targets="${targets% palisade} haproxy palisade"
  fi
  if [ -n "${BASELINE_BIN:-}" ]; then
    before_port="$(free_port)"
    before_admin="$(free_port)"
    read -r -a before_extra <<<"${BASELINE_ARGS:-}"
    PALISADE="$BASELINE_BIN" start_palisade_proxy "before-$threads" "$before_port" "$before_admin" \
      "$threads" "$proxy_cpus" --upstream "http://127.0.0.1:$up_port" "${before_extra[@]}"
    before_group="$SPAWNED"
    before_pid="$(pgrep -g "$before_group" -x "$(basename "$BASELINE_BIN")")"
    curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
      "http://127.0.0.1:$before_admin/v1/fences/default" >/dev/null
    targets="${targets% palisade} before palisade"
    log "baseline: $BASELINE_BIN on :$before_port (pid $before_pid)"
  fi
  for round in $(seq "$ROUNDS"); do
    log "round $round of $ROUNDS, $threads thread(s)"
    ROUND="$round"
    # Alternate the order every round, so a drift in the machine's speed hits all alike.
    if [ $((round % 2)) = 1 ]; then
      order="$targets"
    else
      order="$(echo "$targets" | tr ' ' '\n' | tac | tr '\n' ' ')"
    fi
    for method in $METHODS; do
      for target in $order; do
        case "$target" in
          before) one_run before "$threads" "$method" "http://127.0.0.1:$before_port" "$side_cpus" "$before_pid" ;;
          direct) one_run direct "$threads" "$method" "http://127.0.0.1:$up_port" "$side_cpus" "${up_all[@]}" ;;
          nginx) one_run nginx "$threads" "$method" "http://127.0.0.1:$nginx_port" "$side_cpus" "${nginx_all[@]}" ;;
          haproxy) one_run haproxy "$threads" "$method" "http://127.0.0.1:$hap_port" "$side_cpus" "$hap_pid" ;;
          palisade) one_run palisade "$threads" "$method" "http://127.0.0.1:$pal_port" "$side_cpus" "$pal_pid" ;;
        esac
      done
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
  [ -n "${BASELINE_BIN:-}" ] && stop "$before_group"
  stop "$nginx_pid"
  [ "$HAPROXY" = 1 ] && stop "$hap_pid"
  stop "$up_pid"
done

python3 - "$RESULTS" "$BENCH_WORK/io.jsonl" "$(nproc)" "${BASELINE_NAME:-before}" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# The baseline runs as "before"; the tables give it BASELINE_NAME.
name = lambda target: sys.argv[4] if target == "before" else target
io = [json.loads(l) for l in open(sys.argv[2])]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
targets = [t for t in ("direct", "nginx", "haproxy", "before", "palisade") if any(r["target"] == t for r in rows)]
threads = sorted({r["threads"] for r in rows})
methods = [m for m in ("PUT", "GET") if any(r.get("method", "PUT") == m for r in rows)]
for r in rows:
    r.setdefault("method", "PUT")
keys = [(t, m) for t in threads for m in methods]
print(f"\nproxy benchmark: {sys.argv[3]} cores, {rows[0]['connections']} connections; "
      f"PUT: {next((r['body_bytes'] for r in rows if r['method'] == 'PUT'), 0)} B bodies with an equal token; "
      f"GET: 1 KiB answers, no token; medians of {len(rows) // len(targets) // len(keys)} rounds\n")
print("| threads | method | target | req/s | p50 ms | p99 ms | CPU µs/req | user | system | non-2xx | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
summary = {}
for t, meth in keys:
    for target in targets:
        rs = [r for r in rows if r["threads"] == t and r["method"] == meth and r["target"] == target]
        m = dict(rps=med([r["rps"] for r in rs]), p50=med([r["latency_us"]["p50"] for r in rs]) / 1000,
                 p99=med([r["latency_us"]["p99"] for r in rs]) / 1000,
                 cpu=med([r["cpu_us_per_req"] for r in rs]),
                 user=med([r["user_us_per_req"] for r in rs]),
                 system=med([r["system_us_per_req"] for r in rs]),
                 non2xx=sum(r["non_2xx"] for r in rs), errors=sum(r["errors"] for r in rs))
        summary[(t, meth, target)] = m
        cpu = "| | " if target == "direct" else f"{m['cpu']:.1f} | {m['user']:.1f} | {m['system']:.1f}"
        print(f"| {t} | {meth} | {name(target)} | {m['rps']:.0f} | {m['p50']:.3f} | {m['p99']:.3f} | {cpu} | {m['non2xx']} | {m['errors']} |")

def per_round(t, meth, a, b, key):
    # The ratio within each round (both measured back to back), then its median.
    out = []
    same = lambda r, rnd, target: (r["threads"] == t and r["method"] == meth and r["round"] == rnd
                                   and r["target"] == target)
    for rnd in sorted({r["round"] for r in rows if r["threads"] == t}):
        x = [r[key] for r in rows if same(r, rnd, a)]
        y = [r[key] for r in rows if same(r, rnd, b)]
        if x and y and x[0] and y[0]:
            out.append(x[0] / y[0])
    return med(out)

pairs = [("palisade", "nginx")] + ([("haproxy", "nginx")] if "haproxy" in targets else [])
pairs += [("before", "nginx"), ("palisade", "before")] if "before" in targets else []
for a, b in pairs:
    print(f"\n| threads | method | {name(a)}/{name(b)} req/s | p50 | p99 | CPU per request (medians) | CPU per request (median of per-round ratios) |")
    print("|---|---|---|---|---|---|---|")
    for t, meth in keys:
        p, n = summary[(t, meth, a)], summary[(t, meth, b)]
        print(f"| {t} | {meth} | {p['rps'] / n['rps']:.2f} | {p['p50'] / n['p50']:.2f} | {p['p99'] / n['p99']:.2f} | "
              f"{p['cpu'] / n['cpu']:.2f} | {per_round(t, meth, a, b, 'cpu_us_per_req'):.2f} |")
print("\n| threads | equal-token requests | write_bytes | syscw | advancing requests (control) | write_bytes | syscw |")
print("|---|---|---|---|---|---|---|")
for r in io:
    print(f"| {r['threads']} | {r['equal_requests']} | {r['equal_write_bytes']} | {r['equal_syscw']} | "
          f"{r['advance_requests']} | {r['advance_write_bytes']} | {r['advance_syscw']} |")
EOF
