#!/usr/bin/env bash
# Builds `palisade` with profile-guided optimisation (PGO), trained on the proxy's data
# path, and leaves it at target/pgo/palisade (PGO_OUT).
#
# Three steps, each in a target directory of its own, so the plain release build
# (target/release) is untouched:
#   1. an instrumented release build (target/pgo-generate), which counts the branches and
#      calls it takes and writes them out as it exits;
#   2. training: that binary as a proxy in front of one nginx upstream, loaded by the
#      same binary's `palisade bench` (whose counts are kept apart and thrown away) with
#      each workload below for PGO_TRAIN_SECONDS, at 1 and at 2 worker threads, then
#      stopped with SIGTERM (a proxy killed with SIGKILL writes no counts);
#   3. the counts merged with `llvm-profdata` (from rustup's `llvm-tools` component,
#      which matches rustc's LLVM; installed here if missing), and a release build
#      (target/pgo-use) that lays out and inlines the code by them.
#
# The workloads are what the proxy does most, so that the paths it takes rarely are not
# laid out as cold by omission: 1 KiB PUTs with an equal token, 1 KiB GETs (unfenced
# reads), 64 KiB PUTs (the streaming path), and PUTs with a stale token (refused, 409).
# Only the target is built with the counts (`--target`): build scripts and proc macros
# are not instrumented.
#
# Environment (defaults): PGO_TRAIN_SECONDS (4), PGO_OUT (target/pgo/palisade),
# PGO_KEEP_PROFILE (none: a path to copy the merged profile to), BENCH_DIR (/var/tmp),
# BENCH_KEEP (0).
# RUSTFLAGS is set by this script (to the counts' flags), so one of the caller's is not
# passed on.
# Run time: about 20 minutes on 2 cores: the instrumented build about 11, the training 1,
# the optimised build about 8.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

need nginx nginx
need curl curl
need python3 python3
TRAIN_SECONDS="${PGO_TRAIN_SECONDS:-4}"
OUT="${PGO_OUT:-$BENCH_ROOT/target/pgo/palisade}"
HOST="$(rustc -vV | awk '/^host:/ {print $2}')"
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata"
if [ ! -x "$PROFDATA" ]; then
  log "installing rustup's llvm-tools (llvm-profdata)"
  rustup component add llvm-tools >&2 || die "cannot install llvm-tools"
  [ -x "$PROFDATA" ] || die "no llvm-profdata at $PROFDATA"
fi
make_workdir
COUNTS="$BENCH_WORK/counts"
mkdir -p "$COUNTS"

log "instrumented build (target/pgo-generate)"
(cd "$BENCH_ROOT" && RUSTFLAGS="-Cprofile-generate=$COUNTS" cargo build --release --quiet \
  -p palisade-cli --bin palisade --target "$HOST" --target-dir target/pgo-generate) ||
  die "the instrumented build failed"
PALISADE="$BENCH_ROOT/target/pgo-generate/$HOST/release/palisade"

up_port="$(free_port)"
start_upstream "$up_port"
TOKEN=1
# train THREADS: one proxy with THREADS worker threads, through every workload.
train() {
  local threads="$1" port admin
  port="$(free_port)"
  admin="$(free_port)"
  LLVM_PROFILE_FILE="$COUNTS/proxy-%p.profraw" \
    start_palisade_proxy "proxy-$threads" "$port" "$admin" "$threads" "" \
    --upstream "http://127.0.0.1:$up_port"
  local group="$SPAWNED"
  curl -s --fail -X POST -H "Content-Type: application/json" --data "{\"token\":$TOKEN}" \
    "http://127.0.0.1:$admin/v1/fences/default" >/dev/null || die "cannot set the fence"
  local client=(env "LLVM_PROFILE_FILE=$BENCH_WORK/client-%p.profraw" PALISADE_WORKER_THREADS=1
    "$PALISADE" bench --connections 32 --duration "$TRAIN_SECONDS" --json)
  local workload out
  for workload in "PUT 1024 $TOKEN" "GET 0 -" "PUT 65536 $TOKEN" "PUT 1024 0"; do
    read -r method bytes token <<<"$workload"
    local what=(--url "http://127.0.0.1:$port/bench" --method PUT --body-bytes "$bytes"
      --token "$token")
    [ "$method" = GET ] && what=(--url "http://127.0.0.1:$port/get/bench" --method GET
      --body-bytes 0)
    out="$("${client[@]}" "${what[@]}")" || die "the $workload workload failed"
    log "$threads thread(s), $method of $bytes B, token $token: $(python3 -c \
      'import json,sys; r=json.loads(sys.argv[1]); print(r["answered"], "answered,", r["non_2xx"], "not 2xx,", r["errors"], "errors")' \
      "$out")"
  done
  stop "$group"
}
train 1
train 2
shopt -s nullglob
raw=("$COUNTS"/proxy-*.profraw)
[ "${#raw[@]}" -ge 2 ] || die "the proxies wrote ${#raw[@]} count files, not 2: did they exit cleanly?"
"$PROFDATA" merge -o "$BENCH_WORK/palisade.profdata" "${raw[@]}" ||
  die "llvm-profdata could not merge the counts"
log "merged ${#raw[@]} count files: $(du -h "$BENCH_WORK/palisade.profdata" | cut -f1)"
[ -n "${PGO_KEEP_PROFILE:-}" ] && cp "$BENCH_WORK/palisade.profdata" "$PGO_KEEP_PROFILE"

log "optimised build (target/pgo-use)"
(cd "$BENCH_ROOT" && RUSTFLAGS="-Cprofile-use=$BENCH_WORK/palisade.profdata" cargo build \
  --release --quiet -p palisade-cli --bin palisade --target "$HOST" --target-dir target/pgo-use) ||
  die "the optimised build failed"
mkdir -p "$(dirname "$OUT")"
cp "$BENCH_ROOT/target/pgo-use/$HOST/release/palisade" "$OUT"
log "built $OUT"
