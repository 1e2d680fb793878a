#!/usr/bin/env bash
# PostgreSQL beside occ on the same workloads, clients and machine, one sitting: 1 shard x 1
# replica in memory against PostgreSQL with fsync off, then 1 shard x 3 replicas with fsync
# against PostgreSQL with fsync on, then PostgreSQL at repeatable read. Prints one table line
# per run, with whether its checks passed.
#
#   scripts/pg-compare.sh [CLIENTS] [DURATION_S]
set -uo pipefail
cd "$(dirname "$0")/.."
clients=${1:-32}
duration=${2:-10}
bin=target/release/meridian
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
workloads=(
  "ycsb-a|--workload ycsb-a --keys-per-shard 100000"
  "ycsb-b|--workload ycsb-b --keys-per-shard 100000"
  "smallbank|--workload smallbank"
  "tpcc 1 wh|--workload tpcc --warehouses-per-shard 1"
  "tpcc 4 wh|--workload tpcc --warehouses-per-shard 4"
)
setups=(
  "occ 1x1 memory|--protocol occ --replicas 1 --regions 1 --durability memory"
  "postgres fsync off|--protocol postgres --durability memory"
  "occ 1x3 fsync|--protocol occ --replicas 3 --regions 1 --durability fsync"
  "postgres fsync on|--protocol postgres --durability fsync"
  "postgres rr fsync off|--protocol postgres --pg-isolation repeatable-read --durability memory"
  "postgres rr fsync on|--protocol postgres --pg-isolation repeatable-read --durability fsync"
)
only=${ONLY:-}  # ONLY=tpcc runs the workloads whose label contains it
printf '%-10s %-24s %10s %8s %8s %8s %s\n' workload setup txn/s "p50 ms" "p99 ms" "abort %" checks
for w in "${workloads[@]}"; do
  [[ -n "$only" && "${w%%|*}" != *"$only"* ]] && continue
  for s in "${setups[@]}"; do
    report=$($bin bench ${w#*|} ${s#*|} --shards 1 --network lan --clients "$clients" \
      --duration "$duration" --warmup 2 --quiet --out "$out" 2>&1)
    status=$?
    read -r _ _ _ _ _ tps p50 p99 abort _ <<<"$(sed -n 2p <<<"$report")"
    checks=$([ $status -eq 0 ] && echo "pass" || echo "FAIL (exit $status)")
    printf '%-10s %-24s %10s %8s %8s %8s %s\n' "${w%%|*}" "${s%%|*}" "$tps" "$p50" "$p99" "$abort" "$checks"
  done
done
