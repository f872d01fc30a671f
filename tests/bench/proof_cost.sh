#!/usr/bin/env bash
# The cost of token proofs: proxy CPU per request with proofs checked (`--token-pub`)
# versus not, in one run. Two palisade proxies in front of the same trivial upstream
# (nginx `return 200`), identical but for `--token-pub`, both with their fence at the same
# token; every request (1 KiB PUT) carries that equal token and the same real proof (the
# leader view of a one-node cluster started with `--token-key`), so both proxies read the
# same bytes and only one verifies (once, then its cache answers). Rounds alternate the
# order; the proxies' CPU time comes from /proc/PID/stat (utime + stime) around each
# measured run. The report gives the medians of CPU per request and their ratio; the goal
# is a ratio under 1.03.
#
# Each proxy runs 1 runtime thread pinned to CPU 0; the upstream, the node and the load
# generator (`palisade bench`) share CPU 1 (taskset), so the proxies never compete with
# them. On a machine with one CPU nothing is pinned.
#
# Environment (defaults): BENCH_ROUNDS (9), BENCH_DURATION (5 s), BENCH_WARMUP (1 s),
# BENCH_CONNECTIONS (32), BENCH_BODY_BYTES (1024), BENCH_DIR (/var/tmp), BENCH_KEEP (0),
# BENCH_QUIET_WAIT (0 s). Default run time: about 2 minutes plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ROUNDS="${BENCH_ROUNDS:-9}"
DURATION="${BENCH_DURATION:-5}"
WARMUP="${BENCH_WARMUP:-1}"
CONNECTIONS="${BENCH_CONNECTIONS:-32}"
BODY_BYTES="${BENCH_BODY_BYTES:-1024}"

need nginx nginx
need taskset util-linux
need python3 python3
need curl curl
build_palisade
make_workdir
machine_report
wait_quiet

# The load generator: `palisade bench` when it can send the proof header (a dedicated
# flag, or a generic header flag); otherwise wrk (Debian's package) with a Lua script that
# sends the same request and prints the same JSON fields, and says so.
bench_help="$("$PALISADE" bench --help)"
LOADGEN=palisade
if grep -q -- '--proof' <<<"$bench_help"; then
  proof_args() { printf '%s\n' --proof "$1"; }
elif grep -q -- '--header' <<<"$bench_help"; then
  proof_args() { printf '%s\n' --header "Fencing-Token-Proof: $1"; }
else
  log "palisade bench cannot send a Fencing-Token-Proof header (no --proof or --header); using wrk"
  LOADGEN=wrk
  need wrk wrk
fi

if [ "$(nproc)" -ge 2 ]; then
  proxy_cpus=0
  side_cpus=1
  pin_side=(taskset -c "$side_cpus")
else
  proxy_cpus=""
  pin_side=()
fi

TICK_HZ="$(getconf CLK_TCK)"
RESULTS="$BENCH_WORK/results.jsonl"
: >"$RESULTS"

# The signing key (from `palisade keys generate`; openssl's Ed25519 PKCS#8 and SPKI PEM
# files are the same formats, for a binary that lacks the command), and the real proof of
# a token: a one-node cluster elects itself and its leader view carries token and proof.
if "$PALISADE" keys generate --help >/dev/null 2>&1; then
  "$PALISADE" keys generate --out "$BENCH_WORK/keys" >/dev/null
else
  log "this palisade has no 'keys generate'; making the key with openssl"
  mkdir -p "$BENCH_WORK/keys"
  openssl genpkey -algorithm ed25519 -out "$BENCH_WORK/keys/token.key"
  openssl pkey -in "$BENCH_WORK/keys/token.key" -pubout -out "$BENCH_WORK/keys/token.pub"
fi
node_raft="$(free_port)"
node_api="$(free_port)"
spawn node "${pin_side[@]}" "$PALISADE" node --id 1 --peers "1=127.0.0.1:$node_raft" \
  --api "127.0.0.1:$node_api" --data-dir "$BENCH_WORK/node-data" \
  --token-key "$BENCH_WORK/keys/token.key"
node_group="$SPAWNED"
view=""
for _ in $(seq 100); do
  view="$(curl -s --max-time 1 "http://127.0.0.1:$node_api/v1/leader" || true)"
  grep -q '"proof":"' <<<"$view" && break
  sleep 0.1
done
read -r TOKEN PROOF < <(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(v["token"], v["proof"])' "$view") ||
  die "no token and proof from the node: $view"
stop "$node_group"
log "token $TOKEN, proof ${PROOF:0:12}..."

up_port="$(free_port)"
start_upstream "$up_port" "${side_cpus:-}"
up_pid="$SPAWNED"

# start NAME FLAGS...: a proxy in front of the upstream with its fence at TOKEN; sets
# STARTED_PID and STARTED_PORT (not printed: a subshell would lose the spawned group).
start() {
  local name="$1" admin
  shift
  STARTED_PORT="$(free_port)"
  admin="$(free_port)"
  start_palisade_proxy "$name" "$STARTED_PORT" "$admin" 1 "$proxy_cpus" \
    --upstream "http://127.0.0.1:$up_port" "$@"
  STARTED_PID="$(pgrep -g "$SPAWNED" -x palisade)"
  curl -s --fail -X POST -H "Content-Type: application/json" \
    --data "{\"token\":$TOKEN,\"proof\":\"$PROOF\"}" \
    "http://127.0.0.1:$admin/v1/fences/default" >/dev/null || die "cannot set the fence of $name"
}
start proofs-off
off_pid="$STARTED_PID" off_port="$STARTED_PORT"
start proofs-on --token-pub "$BENCH_WORK/keys/token.pub"
on_pid="$STARTED_PID" on_port="$STARTED_PORT"
grep -q "token-pub\|proof" "$BENCH_WORK/proofs-off.err" &&
  log "proofs-off warns: $(grep -m1 "token-pub\|proof" "$BENCH_WORK/proofs-off.err")"
log "proofs off: pid $off_pid :$off_port; proofs on: pid $on_pid :$on_port"

# load PORT SECONDS: one run of the load generator against a proxy; prints its JSON
# report (at least answered, rps, non_2xx, errors).
if [ "$LOADGEN" = palisade ]; then
  mapfile -t proof_flag < <(proof_args "$PROOF")
  load() {
    "${pin_side[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
      --url "http://127.0.0.1:$1/bench" --method PUT --body-bytes "$BODY_BYTES" \
      --token "$TOKEN" "${proof_flag[@]}" --connections "$CONNECTIONS" --json --duration "$2"
  }
else
  cat >"$BENCH_WORK/put.lua" <<LUA
wrk.method = "PUT"
wrk.body = string.rep("x", $BODY_BYTES)
wrk.headers["Fencing-Token"] = "$TOKEN"
wrk.headers["Fencing-Token-Proof"] = "$PROOF"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"answered": %d, "rps": %.1f, "non_2xx": %d, "errors": %d}\\n',
    summary.requests, summary.requests / (summary.duration / 1e6), e.status,
    e.connect + e.read + e.write + e.timeout))
end
LUA
  load() {
    "${pin_side[@]}" wrk -t 1 -c "$CONNECTIONS" -d "${2}s" -s "$BENCH_WORK/put.lua" \
      "http://127.0.0.1:$1/bench" | tail -1
  }
fi

# one_run TARGET PORT PID: one measured run; appends a JSON line.
one_run() {
  local target="$1" port="$2" pid="$3" before after out
  load "$port" "$WARMUP" >/dev/null
  before="$(cpu_ticks "$pid")"
  out="$(load "$port" "$DURATION")"
  after="$(cpu_ticks "$pid")"
  python3 - "$target" "$((after - before))" "$TICK_HZ" "$out" >>"$RESULTS" <<'EOF'
import json, sys
target, ticks, hz, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = json.loads(out)
r.update(target=target, cpu_ticks=ticks,
         cpu_us_per_req=(ticks / hz * 1e6 / r["answered"]) if r["answered"] else None)
print(json.dumps(r))
print(f"  {target:<10} {r['rps']:>9.0f} req/s  non-2xx {r['non_2xx']}  errors {r['errors']}  "
      f"cpu {r['cpu_us_per_req'] or 0:.2f} us/req", file=sys.stderr)
EOF
}

for round in $(seq "$ROUNDS"); do
  log "round $round of $ROUNDS"
  if [ $((round % 2)) = 1 ]; then order="off on"; else order="on off"; fi
  for target in $order; do
    case "$target" in
      off) one_run proofs-off "$off_port" "$off_pid" ;;
      on) one_run proofs-on "$on_port" "$on_pid" ;;
    esac
  done
done

python3 - "$RESULTS" "$(nproc)" "$ROUNDS" "$DURATION" "$CONNECTIONS" "$BODY_BYTES" "$LOADGEN" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cores, rounds, duration, conns, body, loadgen = sys.argv[2:8]
def med(xs):
    return statistics.median([x for x in xs if x is not None])
print(f"\nproof cost ({loadgen}): {cores} cores, {rounds} rounds of {duration} s, {conns} connections, "
      f"PUT {body} B, equal token with its proof; proxies 1 thread each\n")
print("| proxy | req/s | CPU µs/req (median) | min | max | non-2xx | errors |")
print("|---|---|---|---|---|---|---|")
m = {}
for t in ("proofs-off", "proofs-on"):
    rs = [r for r in rows if r["target"] == t]
    cpu = [r["cpu_us_per_req"] for r in rs]
    m[t] = med(cpu)
    print(f"| {t} | {med([r['rps'] for r in rs]):.0f} | {m[t]:.2f} | {min(cpu):.2f} | {max(cpu):.2f} | "
          f"{sum(r['non_2xx'] for r in rs)} | {sum(r['errors'] for r in rs)} |")
ratio = m["proofs-on"] / m["proofs-off"]
print(f"\nCPU per request, proofs on / off, ratio of the medians: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); goal under +3%")
# Each round ran both proxies back to back, so the ratio within a round cancels most of
# the machine's drift between rounds.
on = [r["cpu_us_per_req"] for r in rows if r["target"] == "proofs-on"]
off = [r["cpu_us_per_req"] for r in rows if r["target"] == "proofs-off"]
paired = [a / b for a, b in zip(on, off)]
print(f"median of the per-round ratios: {statistics.median(paired):.3f} "
      f"(rounds: {', '.join(f'{p:.3f}' for p in paired)})")
EOF
stop "$up_pid"
