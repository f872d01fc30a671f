#!/usr/bin/env bash
# Named leaderships against etcd, side by side in one run: a 3-node Palisade cluster
# (`palisade node --api`, default settings) and a 3-member etcd cluster (default
# settings), both on loopback, both driven by `palisade bench scopes` (one Rust client,
# HTTP/1.1 JSON to both: Palisade's node API, etcd's v3 gateway, always to the leader).
# etcd is driven the way its Go `concurrency` package campaigns: a lease kept alive, a
# transaction that puts `prefix/<lease>` if its create revision is 0, then a wait (range
# sorted by create revision, and a watch) until that key is the oldest under the prefix.
#
# Three measures, each target in turn, the order alternating from round to round:
#   handover   BENCH_CONTENDERS (100) sessions wait on one scope; the holder resigns,
#              BENCH_HANDOVERS (50) times: the time from the resignation's answer
#              (Palisade: POST /v1/scopes/{scope}/resign; etcd: the delete of the
#              holder's key) until the next contender's campaign answers (Palisade: its
#              pending campaign long poll answers 200; etcd: its watch saw the delete and
#              its range found no older key). The resigned holder campaigns again.
#   keepalive  BENCH_SESSIONS (10000) sessions (etcd: leases) of BENCH_TTL_MS (5000),
#              each kept alive every BENCH_INTERVAL_MS (1000), spread over the interval,
#              from BENCH_KA_WORKERS (256) connections; each session is opened at its
#              first turn, within the warm-up, BENCH_WARMUP (10 s). Reported: the three
#              server processes' CPU (utime + stime from /proc/PID/stat) over
#              BENCH_DURATION (20 s), per second and per 1,000 keepalives answered, the
#              keepalives sent and answered per second (those sent in the window), and
#              the load generator's own CPU.
#   grants     BENCH_GRANT_CONCURRENCY ("1 16") workers, each acquiring and releasing
#              its own scopes in a loop for BENCH_GRANT_DURATION (10 s) (Palisade:
#              campaign + resign; etcd: a create-if-absent transaction + a delete).
# Before the rounds, each cluster's idle CPU over BENCH_IDLE (10 s).
#
# After the rounds, not timed: the sync and write system calls per grant of each
# cluster's three processes (strace -c over a 3 s one-worker grants run; BENCH_STRACE=0
# skips it).
#
# Environment (defaults above, and): BENCH_ROUNDS (3), BENCH_DIR (/var/tmp), BENCH_KEEP
# (0), BENCH_QUIET_WAIT (0), BENCH_NO_BUILD (0). Nothing is pinned: the two clusters and
# the generator share the machine's cores, and the generator's CPU is reported.
# Default run time: about 8 minutes plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ROUNDS="${BENCH_ROUNDS:-3}"
CONTENDERS="${BENCH_CONTENDERS:-100}"
HANDOVERS="${BENCH_HANDOVERS:-50}"
SESSIONS="${BENCH_SESSIONS:-10000}"
TTL_MS="${BENCH_TTL_MS:-5000}"
INTERVAL_MS="${BENCH_INTERVAL_MS:-1000}"
KA_WORKERS="${BENCH_KA_WORKERS:-256}"
DURATION="${BENCH_DURATION:-20}"
WARMUP="${BENCH_WARMUP:-10}"
GRANT_CONCURRENCY="${BENCH_GRANT_CONCURRENCY:-1 16}"
GRANT_DURATION="${BENCH_GRANT_DURATION:-10}"
IDLE="${BENCH_IDLE:-10}"

need etcd etcd-server
need etcdctl etcd-client
need python3 python3
need curl curl
need strace strace
build_palisade
make_workdir
machine_report
log "etcd: $(etcd --version | head -1); palisade: $PALISADE built $(date -r "$PALISADE" '+%F %H:%M')"
wait_quiet
start_results

# The Palisade cluster: three nodes, their APIs, default settings.
pal_groups=() pal_pids=() pal_api=() peers=""
for i in 1 2 3; do
  raft_port="$(free_port)"
  pal_api+=("$(free_port)")
  peers+="${peers:+,}$i=127.0.0.1:$raft_port"
done
for i in 1 2 3; do
  spawn "palisade-$i" "$PALISADE" node --id "$i" --peers "$peers" \
    --api "127.0.0.1:${pal_api[i - 1]}" --data-dir "$BENCH_WORK/palisade-$i-data"
  pal_groups+=("$SPAWNED")
done
for i in 1 2 3; do
  wait_for_line "$BENCH_WORK/palisade-$i.out" "listening on"
  # spawn runs the command itself (setsid execs it), so the group's leader is the node.
  pal_pids+=("${pal_groups[i - 1]}")
done
pal_endpoints="$(printf 'http://127.0.0.1:%s,' "${pal_api[@]}")"
pal_endpoints="${pal_endpoints%,}"
leader_found=""
for _ in $(seq 300); do
  for i in 1 2 3; do
    view="$(curl -s --max-time 1 "http://127.0.0.1:${pal_api[i - 1]}/v1/leader" || true)"
    if grep -q '"role":"leader"' <<<"$view" && grep -q '"token":[0-9]' <<<"$view"; then
      leader_found="$i"
      break 2
    fi
  done
  sleep 0.1
done
[ -n "$leader_found" ] || die "no Palisade leader with a token within 30 s"
log "palisade: nodes ${pal_pids[*]}, leader node $leader_found"

# The etcd cluster: three members, default settings.
etcd_groups=() etcd_client=() etcd_peer=() initial=""
for i in 1 2 3; do
  etcd_client+=("$(free_port)")
  etcd_peer+=("$(free_port)")
  initial+="${initial:+,}e$i=http://127.0.0.1:${etcd_peer[-1]}"
done
for i in 1 2 3; do
  spawn "etcd-$i" etcd --name "e$i" --data-dir "$BENCH_WORK/etcd-$i-data" \
    --listen-client-urls "http://127.0.0.1:${etcd_client[i - 1]}" \
    --advertise-client-urls "http://127.0.0.1:${etcd_client[i - 1]}" \
    --listen-peer-urls "http://127.0.0.1:${etcd_peer[i - 1]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer[i - 1]}" \
    --initial-cluster "$initial" --initial-cluster-state new \
    --initial-cluster-token "bench-$$" --logger zap --log-level warn
  etcd_groups+=("$SPAWNED")
done
etcd_endpoints="$(printf 'http://127.0.0.1:%s,' "${etcd_client[@]}")"
etcd_endpoints="${etcd_endpoints%,}"
for _ in $(seq 300); do
  etcdctl --endpoints "$etcd_endpoints" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
etcdctl --endpoints "$etcd_endpoints" endpoint health >/dev/null || die "etcd is not healthy"
etcd_pids=("${etcd_groups[@]}")
log "etcd: members ${etcd_pids[*]}"

# record TARGET MEASURE ROUND JSON [EXTRA]: appends one result line and logs a summary.
record() {
  python3 - "$@" >>"$RESULTS" <<'EOF'
import json, sys
target, measure, round_, r = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
r.update(target=target, measure=measure, round=round_, **json.loads(sys.argv[5] if len(sys.argv) > 5 else "{}"))
print(json.dumps(r))
if measure == "handover":
    a = r["after_resign_returned_ms"]
    s = f"median {a['median']:.2f} ms  p99 {a['p99']:.2f} ms  ({a['count']} handovers)"
elif measure == "keepalive":
    c = r["cpu"]
    s = (f"{r['answered_per_s']:.0f}/s answered of {r['wanted_per_s']:.0f} wanted, errors {r['errors']}, "
         f"sent over 100 ms late {r['sent_late_100ms']}, opened in the window {r['opens_in_window']}, "
         f"servers {c['servers_cpu_per_s']:.3f} CPU-s/s ({c['servers_cpu_ms_per_1000_ops']:.1f} ms per 1,000), "
         f"generator {c['generator_cpu_per_s']:.3f} CPU-s/s, p99 {r['latency_ms']['p99']:.2f} ms")
else:
    c = r["cpu"]
    s = (f"{r['workers']} workers: {r['grants_per_s']:.0f} grants/s, acquire p50 "
         f"{r['acquire_ms']['p50']:.2f} ms p99 {r['acquire_ms']['p99']:.2f} ms, servers "
         f"{c['servers_cpu_ms_per_1000_ops'] or 0:.1f} CPU-ms per 1,000")
print(f"  {target:<8} {measure:<9} {s}", file=sys.stderr)
EOF
}

# run_bench TARGET MEASURE ROUND [FLAGS...]: one measure against one cluster.
run_bench() {
  local target="$1" measure="$2" round="$3" endpoints pids out
  shift 3
  if [ "$target" = palisade ]; then
    endpoints="$pal_endpoints"
    pids="$(IFS=,; echo "${pal_pids[*]}")"
  else
    endpoints="$etcd_endpoints"
    pids="$(IFS=,; echo "${etcd_pids[*]}")"
  fi
  out="$("$PALISADE" bench scopes --against "$target" --measure "$measure" \
    --endpoints "$endpoints" --pid "$pids" --tag "r$round-$measure-$RANDOM" --ttl-ms "$TTL_MS" \
    --json "$@" 2>"$BENCH_WORK/bench-last.err")" ||
    die "bench scopes $target $measure failed: $(tail -3 "$BENCH_WORK/bench-last.err")"
  printf '%s\n' "$out"
}

# Idle CPU of each cluster (ticks and heartbeats only).
for target in palisade etcd; do
  if [ "$target" = palisade ]; then pids=("${pal_pids[@]}"); else pids=("${etcd_pids[@]}"); fi
  c0="$(cpu_ticks "${pids[@]}")"
  sleep "$IDLE"
  c1="$(cpu_ticks "${pids[@]}")"
  python3 -c "import json,sys; print(json.dumps(dict(target=sys.argv[1], measure='idle', cpu_per_s=int(sys.argv[2]) / int(sys.argv[3]) / float(sys.argv[4]))))" \
    "$target" "$((c1 - c0))" "$TICK_HZ" "$IDLE" >>"$RESULTS"
  log "  $target idle: $(tail -1 "$RESULTS")"
done

for round in $(seq "$ROUNDS"); do
  log "round $round of $ROUNDS"
  if [ $((round % 2)) = 1 ]; then order="palisade etcd"; else order="etcd palisade"; fi
  # (An assignment of a failed command substitution stops the script; a command's
  # argument would not.)
  for target in $order; do
    out="$(run_bench "$target" handover "$round" --contenders "$CONTENDERS" --handovers "$HANDOVERS")"
    record "$target" handover "$round" "$out"
  done
  for target in $order; do
    out="$(run_bench "$target" keepalive "$round" --sessions "$SESSIONS" \
      --interval-ms "$INTERVAL_MS" --concurrency "$KA_WORKERS" --duration "$DURATION" --warmup "$WARMUP")"
    record "$target" keepalive "$round" "$out"
  done
  for conc in $GRANT_CONCURRENCY; do
    for target in $order; do
      out="$(run_bench "$target" grants "$round" --concurrency "$conc" \
        --duration "$GRANT_DURATION" --warmup 2)"
      record "$target" grants "$round" "$out"
    done
  done
done

# Anatomy, not timed: the durable writes of a grant. strace counts the sync and write
# calls of all three server processes over a short one-worker grants run.
if [ "${BENCH_STRACE:-1}" = 1 ]; then
  for target in palisade etcd; do
    if [ "$target" = palisade ]; then pids=("${pal_pids[@]}"); else pids=("${etcd_pids[@]}"); fi
    trace_args=()
    for p in "${pids[@]}"; do trace_args+=(-p "$p"); done
    strace -f -c -o "$BENCH_WORK/strace-$target.txt" \
      -e trace=fsync,fdatasync,sync_file_range,write,pwrite64,writev "${trace_args[@]}" \
      2>"$BENCH_WORK/strace-$target.err" &
    tracer=$!
    sleep 1
    out="$(run_bench "$target" grants 0 --concurrency 1 --duration 3 --warmup 0)"
    kill -INT "$tracer"
    wait "$tracer" || true
    python3 - "$target" "$out" "$BENCH_WORK/strace-$target.txt" >>"$RESULTS" <<'PY'
import json, sys
target, r, path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
calls = {}
for line in open(path):
    f = line.split()
    if len(f) >= 5 and f[-1] in ("fsync", "fdatasync", "sync_file_range", "write", "pwrite64", "writev"):
        calls[f[-1]] = int(f[3])
print(json.dumps(dict(target=target, measure="strace", grants=r["grants"], calls=calls)))
PY
  done
fi

python3 - "$RESULTS" "$(nproc)" <<'EOF'
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
def pick(target, measure, **kw):
    return [r for r in rows if r["target"] == target and r["measure"] == measure
            and all(r.get(k) == v for k, v in kw.items())]
def pct(xs, p):
    # Nearest rank.
    xs = sorted(xs)
    return xs[min(len(xs), max(1, math.ceil(p * len(xs)))) - 1] if xs else float("nan")
rounds = max(r.get("round", 0) for r in rows)
print(f"\nnamed leaderships against etcd: {sys.argv[2]} cores, {rounds} rounds; "
      "Palisade / etcd ratios (lower is better except for rates)\n")
print("| measure | Palisade | etcd | Palisade / etcd |")
print("|---|---|---|---|")
def line(name, p, e, fmt="{:.2f}"):
    ratio = p / e if e else float("nan")
    print(f"| {name} | {fmt.format(p)} | {fmt.format(e)} | {ratio:.2f} |")
# Handover: every handover of every round pooled.
h = {t: [x for r in pick(t, "handover") for x in r["samples_ms"]] for t in ("palisade", "etcd")}
line(f"handover after resign, median ms ({len(h['palisade'])} and {len(h['etcd'])} handovers)",
     med(h["palisade"]), med(h["etcd"]), "{:.3f}")
line("handover after resign, p99 ms", pct(h["palisade"], 0.99), pct(h["etcd"], 0.99), "{:.3f}")
hs = {t: [x for r in pick(t, "handover") for x in r["samples_sent_ms"]] for t in ("palisade", "etcd")}
line("handover from the resign call's start, median ms", med(hs["palisade"]), med(hs["etcd"]), "{:.3f}")
line("handover from the resign call's start, p99 ms", pct(hs["palisade"], 0.99), pct(hs["etcd"], 0.99), "{:.3f}")
rc = {t: [x["resign_call_ms"]["median"] for x in pick(t, "handover")] for t in ("palisade", "etcd")}
line("resign call itself, median of the runs' medians, ms", med(rc["palisade"]), med(rc["etcd"]), "{:.3f}")
for t in ("palisade", "etcd"):
    first = sum(r["granted_before_resign_returned"] for r in pick(t, "handover"))
    if first:
        print(f"| ({t}: {first} grants answered before the resignation did; counted as negative) | | | |")
k = {t: pick(t, "keepalive") for t in ("palisade", "etcd")}
f = lambda t, g: med([g(r) for r in k[t]])
line("keepalives sent per second (median)", f("palisade", lambda r: r["sent_per_s"]),
     f("etcd", lambda r: r["sent_per_s"]), "{:,.0f}")
line("keepalives answered per second (median)", f("palisade", lambda r: r["answered_per_s"]),
     f("etcd", lambda r: r["answered_per_s"]), "{:,.0f}")
line("servers' CPU, CPU-seconds per second (median)", f("palisade", lambda r: r["cpu"]["servers_cpu_per_s"]),
     f("etcd", lambda r: r["cpu"]["servers_cpu_per_s"]), "{:.3f}")
line("servers' CPU per 1,000 keepalives, ms", f("palisade", lambda r: r["cpu"]["servers_cpu_ms_per_1000_ops"]),
     f("etcd", lambda r: r["cpu"]["servers_cpu_ms_per_1000_ops"]), "{:.1f}")
line("keepalive latency p50 ms", f("palisade", lambda r: r["latency_ms"]["p50"]),
     f("etcd", lambda r: r["latency_ms"]["p50"]), "{:.3f}")
line("keepalive latency p99 ms", f("palisade", lambda r: r["latency_ms"]["p99"]),
     f("etcd", lambda r: r["latency_ms"]["p99"]), "{:.3f}")
line("generator's CPU, CPU-seconds per second", f("palisade", lambda r: r["cpu"]["generator_cpu_per_s"]),
     f("etcd", lambda r: r["cpu"]["generator_cpu_per_s"]), "{:.3f}")
errors = {t: sum(r["errors"] for r in k[t]) for t in k}
late = {t: sum(r["sent_late_100ms"] for r in k[t]) for t in k}
print(f"| keepalive errors; sent over 100 ms late | {errors['palisade']}; {late['palisade']} | {errors['etcd']}; {late['etcd']} | |")
idle = {t: med([r["cpu_per_s"] for r in pick(t, "idle")]) for t in ("palisade", "etcd")}
line("idle cluster, CPU-seconds per second", idle["palisade"], idle["etcd"], "{:.3f}")
for w in sorted({r["workers"] for r in rows if r["measure"] == "grants"}):
    g = {t: pick(t, "grants", workers=w) for t in ("palisade", "etcd")}
    gm = lambda t, fn: med([fn(r) for r in g[t]])
    line(f"grants per second, {w} worker{'s' if w > 1 else ''} (median)", gm("palisade", lambda r: r["grants_per_s"]),
         gm("etcd", lambda r: r["grants_per_s"]), "{:,.0f}")
    line(f"acquire latency p50 ms, {w} worker{'s' if w > 1 else ''}", gm("palisade", lambda r: r["acquire_ms"]["p50"]),
         gm("etcd", lambda r: r["acquire_ms"]["p50"]), "{:.3f}")
    line(f"servers' CPU per 1,000 grants, ms, {w} worker{'s' if w > 1 else ''}",
         gm("palisade", lambda r: r["cpu"]["servers_cpu_ms_per_1000_ops"] or float("nan")),
         gm("etcd", lambda r: r["cpu"]["servers_cpu_ms_per_1000_ops"] or float("nan")), "{:.1f}")
st = {r["target"]: r for r in rows if r["measure"] == "strace"}
if st:
    names = ("fsync", "fdatasync", "sync_file_range", "write", "pwrite64", "writev")
    print("\nsystem calls per grant (acquire + release), all three servers, strace -c over a one-worker run:\n")
    print("| target | grants | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for t in ("palisade", "etcd"):
        if t in st and st[t]["grants"]:
            g = st[t]["grants"]
            print(f"| {t} | {g} | " + " | ".join(f"{st[t]['calls'].get(n, 0) / g:.1f}" for n in names) + " |")
print("\nper round (handover median ms; keepalive servers' CPU-s/s; grants/s by workers):")
for r_ in range(1, rounds + 1):
    parts = []
    for t in ("palisade", "etcd"):
        hv = [r["after_resign_returned_ms"]["median"] for r in pick(t, "handover", round=r_)]
        kv = [r["cpu"]["servers_cpu_per_s"] for r in pick(t, "keepalive", round=r_)]
        gv = [f"{r['workers']}:{r['grants_per_s']:.0f}" for r in pick(t, "grants", round=r_)]
        parts.append(f"{t} {hv[0] if hv else float('nan'):.3f} / {kv[0] if kv else float('nan'):.3f} / {' '.join(gv)}")
    print(f"  round {r_}: " + "; ".join(parts))
EOF
