#!/usr/bin/env bash
# Fence advances, side by side with etcd: every request to the palisade proxy carries a
# higher token (`palisade bench --advance-share 1`), so each one is made durable (redb
# commit, fsynced) before it is forwarded to a trivial upstream (nginx `return 200`).
# Beside it, in the same run, a single-node etcd (which fsyncs its WAL by default) takes
# 1 KiB puts through its HTTP gateway (`POST /v3/kv/put`), from the same load generator.
# Rounds alternate palisade and etcd; the report gives medians. Then a syscall count
# (strace -c, not timed) of what one advance and one etcd put cost in writes and fsyncs.
#
# Scopes: by default each connection raises its own scope (`palisade bench --scopes N`,
# as independent writers would), so concurrent raises can share one commit (group
# commit); BENCH_SCOPES=one sends every connection's raises to one scope, where they race
# and the lower ones are refused 409.
#
# Environment (defaults): BENCH_CONCURRENCY ("1 8": connections per run), BENCH_SCOPES
# (per-connection), BENCH_ROUNDS
# (5), BENCH_DURATION (3 s), BENCH_WARMUP (1 s), BENCH_BODY_BYTES (1024), BENCH_DIR
# (/var/tmp: the data directories must be on a disk), BENCH_KEEP (0), BENCH_QUIET_WAIT (0).
# Default run time: about 2 minutes plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

CONCURRENCY="${BENCH_CONCURRENCY:-1 8}"
ROUNDS="${BENCH_ROUNDS:-5}"
DURATION="${BENCH_DURATION:-3}"
WARMUP="${BENCH_WARMUP:-1}"
BODY_BYTES="${BENCH_BODY_BYTES:-1024}"
SCOPES="${BENCH_SCOPES:-per-connection}"
case "$SCOPES" in per-connection | one) ;; *) die "BENCH_SCOPES must be per-connection or one" ;; esac

need nginx nginx
need etcd etcd-server
need etcdctl etcd-client
need strace strace
need python3 python3
build_palisade
make_workdir
machine_report
wait_quiet

RESULTS="$BENCH_WORK/results.jsonl"
: >"$RESULTS"

up_port="$(free_port)"
start_upstream "$up_port"
pal_port="$(free_port)"
pal_admin="$(free_port)"
start_palisade_proxy palisade "$pal_port" "$pal_admin" "$(nproc)" "" \
  --upstream "http://127.0.0.1:$up_port" --client-scopes
pal_pid="$(pgrep -g "$SPAWNED" -x palisade)"

etcd_client="$(free_port)"
etcd_peer="$(free_port)"
spawn etcd etcd --name bench --data-dir "$BENCH_WORK/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$etcd_client" \
  --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "bench=http://127.0.0.1:$etcd_peer" \
  --logger zap --log-level warn
etcd_pid="$(pgrep -g "$SPAWNED" -x etcd)"
for _ in $(seq 100); do
  etcdctl --endpoints "127.0.0.1:$etcd_client" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
etcdctl --endpoints "127.0.0.1:$etcd_client" endpoint health >/dev/null || die "etcd is not healthy"

# The etcd put: key "bench", a value of BODY_BYTES bytes, base64 as the gateway wants.
python3 - "$BODY_BYTES" >"$BENCH_WORK/put.json" <<'EOF'
import base64, json, sys
print(json.dumps({"key": base64.b64encode(b"bench").decode(),
                  "value": base64.b64encode(b"x" * int(sys.argv[1])).decode()}))
EOF

pal_metrics="http://127.0.0.1:$pal_admin/metrics"
# fence: the highest fence of any scope (the token counter starts above it).
fence() {
  curl -s "http://127.0.0.1:$pal_admin/v1/fences" |
    python3 -c 'import json,sys; print(max([f["token"] for f in json.load(sys.stdin)["fences"]] or [0]))'
}

# run_palisade CONNECTIONS SECONDS [--json]: a run where every request advances a fence.
run_palisade() {
  local scopes=(--scope adv)
  [ "$SCOPES" = per-connection ] && scopes+=(--scopes "$1")
  "$PALISADE" bench --url "http://127.0.0.1:$pal_port/advance" --method PUT \
    --body-bytes "$BODY_BYTES" --token "$(fence)" --advance-share 1 "${scopes[@]}" \
    --connections "$1" --duration "$2" "${@:3}"
}
run_etcd() {
  "$PALISADE" bench --url "http://127.0.0.1:$etcd_client/v3/kv/put" --method POST \
    --body-file "$BENCH_WORK/put.json" --content-type application/json \
    --connections "$1" --duration "$2" "${@:3}"
}

# record TARGET CONNECTIONS ADVANCES JSON: appends one result line and prints a summary.
record() {
  python3 - "$@" >>"$RESULTS" <<'EOF'
import json, sys
target, conns, advances, r = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
commits = int(sys.argv[5]) if len(sys.argv) > 5 else None
# Durable operations per second: fence advances (from the proxy's counter) for palisade,
# successful puts for etcd.
durable = int(advances) / r["seconds"] if advances != "-" else r["ok_rps"]
r.update(target=target, conns=conns, durable_per_s=durable,
         advances_per_commit=(int(advances) / commits) if commits else None)
print(json.dumps(r))
l = r["latency_us"]
print(f"  {target:<9} {conns:>2} conn  {durable:>7.0f} durable/s  {r['rps']:>7.0f} req/s  "
      f"p50 {l['p50'] / 1000:.3f} ms  p99 {l['p99'] / 1000:.3f} ms  non-2xx {r['non_2xx']}  "
      f"errors {r['errors']}", file=sys.stderr)
EOF
}

for round in $(seq "$ROUNDS"); do
  log "round $round of $ROUNDS"
  if [ $((round % 2)) = 1 ]; then order="palisade etcd"; else order="etcd palisade"; fi
  for conns in $CONCURRENCY; do
    for target in $order; do
      if [ "$target" = palisade ]; then
        run_palisade "$conns" "$WARMUP" >/dev/null
        a0="$(metric "$pal_metrics" palisade_proxy_fence_advances_total)"
        c0="$(metric "$pal_metrics" palisade_proxy_fence_commits_total)"
        out="$(run_palisade "$conns" "$DURATION" --json --pid "$pal_pid")"
        a1="$(metric "$pal_metrics" palisade_proxy_fence_advances_total)"
        c1="$(metric "$pal_metrics" palisade_proxy_fence_commits_total)"
        record palisade "$conns" "$((a1 - a0))" "$out" "$((c1 - c0))"
      else
        run_etcd "$conns" "$WARMUP" >/dev/null
        record etcd "$conns" - "$(run_etcd "$conns" "$DURATION" --json)"
      fi
    done
  done
done

# Anatomy, not timed: syscalls of 200 sequential advances and 200 etcd puts.
strace_count() {
  local pid="$1" out="$2"
  shift 2
  strace -f -c -o "$out" -e trace=fsync,fdatasync,sync_file_range,write,pwrite64,writev \
    -p "$pid" 2>"$out.err" &
  local tracer=$!
  sleep 1
  "$@" >/dev/null
  kill -INT "$tracer"
  wait "$tracer" || true
}
strace_count "$pal_pid" "$BENCH_WORK/strace-palisade.txt" \
  "$PALISADE" bench --url "http://127.0.0.1:$pal_port/advance" --method PUT \
  --body-bytes "$BODY_BYTES" --token "$(fence)" --advance-share 1 --connections 1 --requests 200
strace_count "$etcd_pid" "$BENCH_WORK/strace-etcd.txt" \
  "$PALISADE" bench --url "http://127.0.0.1:$etcd_client/v3/kv/put" --method POST \
  --body-file "$BENCH_WORK/put.json" --content-type application/json --connections 1 --requests 200

python3 - "$RESULTS" "$(nproc)" "$BENCH_WORK/strace-palisade.txt" "$BENCH_WORK/strace-etcd.txt" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
rounds = len(rows) // len({(r["target"], r["conns"]) for r in rows})
print(f"\nfence advance benchmark: {sys.argv[2]} cores, {rows[0]['body_bytes']} B bodies, "
      f"medians of {rounds} rounds\n")
print("| connections | target | durable ops/s | advances per commit | p50 ms | p99 ms | non-2xx | errors |")
print("|---|---|---|---|---|---|---|---|")
s = {}
for c in sorted({r["conns"] for r in rows}):
    for t in ("palisade", "etcd"):
        rs = [r for r in rows if r["conns"] == c and r["target"] == t]
        m = s[(c, t)] = dict(ops=med([r["durable_per_s"] for r in rs]),
                             p50=med([r["latency_us"]["p50"] for r in rs]) / 1000,
                             p99=med([r["latency_us"]["p99"] for r in rs]) / 1000)
        per_commit = [r["advances_per_commit"] for r in rs if r.get("advances_per_commit")]
        per_commit = f"{med(per_commit):.2f}" if per_commit else "-"
        print(f"| {c} | {t} | {m['ops']:.0f} | {per_commit} | {m['p50']:.3f} | {m['p99']:.3f} | "
              f"{sum(r['non_2xx'] for r in rs)} | {sum(r['errors'] for r in rs)} |")
print("\n| connections | palisade/etcd durable ops/s | p50 | p99 |")
print("|---|---|---|---|")
for c in sorted({r["conns"] for r in rows}):
    p, e = s[(c, "palisade")], s[(c, "etcd")]
    print(f"| {c} | {p['ops'] / e['ops']:.2f} | {p['p50'] / e['p50']:.2f} | {p['p99'] / e['p99']:.2f} |")
print("\nsyscalls per operation (strace -c over 200 sequential operations):\n")
print("| target | " + " | ".join(("fsync", "fdatasync", "write", "pwrite64", "writev")) + " |")
print("|---|---|---|---|---|---|")
for name, path in (("palisade advance", sys.argv[3]), ("etcd put", sys.argv[4])):
    calls = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[-1] in ("fsync", "fdatasync", "write", "pwrite64", "writev"):
            calls[f[-1]] = int(f[3])
    print(f"| {name} | " + " | ".join(f"{calls.get(k, 0) / 200:.1f}" for k in
                                       ("fsync", "fdatasync", "write", "pwrite64", "writev")) + " |")
EOF
