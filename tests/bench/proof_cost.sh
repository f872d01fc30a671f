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

cost_settings 9 5

bench_start

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

split_cpus
start_results

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
spawn node "${PIN_SIDE[@]}" "$PALISADE" node --id 1 --peers "1=127.0.0.1:$node_raft" \
  --api "127.0.0.1:$node_api" --data-dir "$BENCH_WORK/node-data" \
  --token-key "$BENCH_WORK/keys/token.key"
node_group="$SPAWNED"
view="$(leader_view "$node_api" '"proof":"' 10)"
read -r TOKEN PROOF < <(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(v["token"], v["proof"])' "$view") ||
  die "no token and proof from the node: $view"
stop "$node_group"
log "token $TOKEN, proof ${PROOF:0:12}..."

up_port="$(free_port)"
start_upstream "$up_port" "$SIDE_CPUS"
up_pid="$SPAWNED"

# start NAME FLAGS...: a proxy in front of the upstream with its fence at TOKEN; sets
# STARTED_PID and STARTED_PORT (not printed: a subshell would lose the spawned group).
start() {
  local name="$1" admin
  shift
  STARTED_PORT="$(free_port)"
  admin="$(free_port)"
  start_palisade_proxy "$name" "$STARTED_PORT" "$admin" 1 "$MAIN_CPUS" \
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
    "${PIN_SIDE[@]}" env PALISADE_WORKER_THREADS=1 "$PALISADE" bench \
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
    "${PIN_SIDE[@]}" wrk -t 1 -c "$CONNECTIONS" -d "${2}s" -s "$BENCH_WORK/put.lua" \
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
  record_run "$target" "$((after - before))" "$out" "$(printf '%-10s' "$target")"
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

printf '\nproof cost (%s): %s cores, %s rounds of %s s, %s connections, PUT %s B, equal token with its proof; proxies 1 thread each\n\n' \
  "$LOADGEN" "$(nproc)" "$ROUNDS" "$DURATION" "$CONNECTIONS" "$BODY_BYTES"
cost_table proofs-off proofs-on "proofs on / off" "+3%"
stop "$up_pid"
