#!/usr/bin/env bash
# Failover of a fleet, with 1 and with 3 proxies, in one run (and, as the baseline, with
# today's single standalone proxy; BENCH_BASELINE=0 leaves it out): a 3-node palisade
# cluster with leases on (`--lease-ms`, announcing to every proxy) and the proxies in
# fleet mode (`--cluster`), all in front of one nginx upstream (`return 200`). Each trial
# (tests/bench/fleet_failover.py) pauses the leader with SIGSTOP and times, from the signal:
# a new leader is elected; its token is released (its leader view shows it: every proxy
# acknowledged the term, or the lease wait passed); a write carrying that token is
# admitted through a proxy (2xx from the upstream). Then SIGCONT, let the fleet settle,
# and repeat after a random extra wait of up to lease_ms / 3, so that the pause falls at
# a random moment of the proxies' renewal cycle. Blocks of trials alternate between the
# configurations, each block on a fresh cluster; the report gives medians and maxima
# over all trials.
#
# Heartbeat 100 ms and election timeout 1000 ms (randomized up to twice that), as in
# failover.sh. The nodes run on CPU 0 and the proxies, the upstream and the driver on
# CPU 1 (taskset), when there are 2 CPUs.
#
# Environment (defaults): BENCH_TRIALS (10 per configuration), BENCH_BLOCKS (2),
# BENCH_BASELINE (1), BENCH_LEASE_MS (3000), BENCH_SETTLE_MS (1000), BENCH_POLL_MS (10),
# BENCH_DIR (/var/tmp), BENCH_KEEP (0), BENCH_QUIET_WAIT (0). Default run time: about 2
# minutes plus the build.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

TRIALS="${BENCH_TRIALS:-10}"
BLOCKS="${BENCH_BLOCKS:-2}"
LEASE_MS="${BENCH_LEASE_MS:-3000}"
SETTLE_MS="${BENCH_SETTLE_MS:-1000}"
POLL_MS="${BENCH_POLL_MS:-10}"
# Longest one block may take, in seconds: a trial takes about 3 s, plus the lease wait
# when a proxy does not acknowledge.
BLOCK_BUDGET_S=$((TRIALS * (6 + LEASE_MS / 1000) / BLOCKS + 30))

bench_start
need_fleet
name_flag=()
"$PALISADE" proxy --help | grep -q -- '--fleet-name' && name_flag=(--fleet-name)

split_cpus
cpu_flags=()
[ -n "$MAIN_CPUS" ] && cpu_flags=(--node-cpus "$MAIN_CPUS" --proxy-cpus "$SIDE_CPUS")

HERE="$(cd "$(dirname "$0")" && pwd)"
up_port="$(free_port)"
start_upstream "$up_port" "$SIDE_CPUS"
per_block=$(((TRIALS + BLOCKS - 1) / BLOCKS))
# Configurations, as MODE:PROXIES: "fleet" (leases on, proxies with --cluster), and
# "alone" (today's single standalone proxy, nodes without --lease-ms: the baseline the
# fleet's figures compare with, as failover.sh measures it).
CONFIGS=(fleet:1 fleet:3)
[ "${BENCH_BASELINE:-1}" = 1 ] && CONFIGS=(alone:1 "${CONFIGS[@]}")

for block in $(seq "$BLOCKS"); do
  # Alternate the order, so no configuration always runs on a machine warmed by another.
  order=()
  if [ $((block % 2)) = 1 ]; then
    order=("${CONFIGS[@]}")
  else
    for ((i = ${#CONFIGS[@]} - 1; i >= 0; i--)); do order+=("${CONFIGS[i]}"); done
  fi
  for config in "${order[@]}"; do
    mode="${config%:*}" n="${config#*:}" tag="${config/:/-}-$block"
    lease="$LEASE_MS"
    [ "$mode" = alone ] && lease=0
    log "block $block of $BLOCKS: $mode, $n proxies, $per_block trials"
    mkdir -p "$BENCH_WORK/$tag"
    spawn "$tag" timeout -s TERM -k 10 "$((BLOCK_BUDGET_S + 30))" \
      "${PIN_SIDE[@]}" python3 "$HERE/fleet_failover.py" --palisade "$PALISADE" \
      --dir "$BENCH_WORK/$tag" --upstream "http://127.0.0.1:$up_port" \
      --proxies "$n" --trials "$per_block" --lease-ms "$lease" --poll-ms "$POLL_MS" \
      --settle-ms "$SETTLE_MS" --budget-s "$BLOCK_BUDGET_S" "${name_flag[@]}" "${cpu_flags[@]}"
    wait "$SPAWNED" || die "block $block, $config failed: $(tail -5 "$BENCH_WORK/$tag.err")"
    sed 's/^/  /' "$BENCH_WORK/$tag.err" >&2
  done
done

python3 - "$BENCH_WORK" "$BLOCKS" "$(nproc)" "$LEASE_MS" "${CONFIGS[@]}" <<'EOF'
import json, statistics, sys
work, blocks, cores, lease = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
configs = [c.split(":") for c in sys.argv[5:]]
print(f"\nfleet failover: {cores} cores, 3 nodes with --lease-ms {lease}, heartbeat 100 ms, "
      f"election timeout 1000 ms, leader paused with SIGSTOP\n")
print("| proxies | moment (from SIGSTOP) | trials | median ms | min ms | max ms |")
print("|---|---|---|---|---|---|")
med = {}
for mode, n in configs:
    trials = [t for b in range(1, blocks + 1) for t in json.load(open(f"{work}/{mode}-{n}-{b}.out"))["trials"]]
    n = f"{n} fleet" if mode == "fleet" else f"{n} standalone"
    for key, name in (("elected_ms", "new leader elected"), ("released_ms", "its token released"),
                      ("admitted_ms", "a write with it admitted at a proxy")):
        v = [t[key] for t in trials if t[key] is not None]
        if not v:
            print(f"| {n} | {name} | 0 | - | - | - |")
            continue
        med[(n, key)] = statistics.median(v)
        print(f"| {n} | {name} | {len(v)} | {med[(n, key)]:.0f} | {min(v):.0f} | {max(v):.0f} |")
    refusals = {}
    for t in trials:
        for k, c in t["refusals"].items():
            refusals[k] = refusals.get(k, 0) + c
    print(f"| {n} | answers before the admitted write | {sum(refusals.values())} | "
          f"{', '.join(f'{k}: {c}' for k, c in sorted(refusals.items())) or 'none'} | | |")
    causes = {}
    for t in trials:
        for k, c in t.get("released_by", {}).items():
            causes[k] = causes.get(k, 0) + c
    if causes:
        print(f"| {n} | tokens released, by cause | {sum(causes.values()):.0f} | "
              f"{', '.join(f'{k}: {c:.0f}' for k, c in sorted(causes.items()))} | | |")
def ratio(a, b):
    if (a, "admitted_ms") in med and (b, "admitted_ms") in med:
        print(f"ratio of medians, write admitted, {a} / {b}: {med[(a, 'admitted_ms')] / med[(b, 'admitted_ms')]:.2f}")
print()
ratio("3 fleet", "1 fleet")
ratio("1 fleet", "1 standalone")
EOF
