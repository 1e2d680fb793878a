#!/usr/bin/env bash
# Interleaved A/B rounds of `meridian bench` builds: each round runs every binary once, in
# turn, so that the machine's drift hits all of them alike. Prints one line per run: round,
# label, committed txn/s, and CPU time (user + system) per transaction in microseconds.
#
#   scripts/ab.sh ROUNDS "BENCH ARGS" label=path/to/meridian ...
#   scripts/ab.sh 5 "--shards 1 --replicas 1 --regions 1 --network lan --clients 64 --duration 8 --warmup 2" \
#       old=/tmp/meridian-old new=target/release/meridian
set -uo pipefail
rounds=$1; shift; args=$1; shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
duration=$(sed -E 's/.*--duration ([0-9.]+).*/\1/' <<<"$args")
warmup=$(sed -E 's/.*--warmup ([0-9.]+).*/\1/' <<<"$args")
for round in $(seq 1 "$rounds"); do
  for pair in "$@"; do
    label=${pair%%=*}; bin=${pair#*=}
    text=$( { /usr/bin/time -f "TIME %U %S" "$bin" bench $args --quiet --out "$out"; } 2>&1 )
    tps=$(awk '/^[a-z0-9-]+ +[a-z0-9-]+ +[0-9]+x[0-9]+/{print $6; exit}' <<<"$text")
    cpu=$(awk '/^TIME/{print $2 + $3}' <<<"$text")
    per=$(awk -v c="$cpu" -v t="$tps" -v d="$duration" -v w="$warmup" \
      'BEGIN { if (t > 0) printf "%.1f", c / (t * (d + w)) * 1e6; else print "-" }')
    echo "$round $label $tps $per"
  done
done
