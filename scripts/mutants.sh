#!/usr/bin/env bash
# Plants each bug of scripts/mutants/*.patch, one at a time, in a scratch worktree of HEAD and
# runs the bug-hunting battery against it, step by step with a time limit each, stopping at the
# first step that fails. Prints, per mutant, which step caught it and after how many seconds,
# or MISSED. Not part of CI: a full run builds the battery once per mutant (minutes each).
#
#   scripts/mutants.sh                 # every mutant
#   scripts/mutants.sh double-apply    # the named ones
#   STEP_TIMEOUT=300 scripts/mutants.sh
#
# The battery, in order (cheapest first):
#   1. protocol unit tests     cargo test -p meridian-protocols
#   2. simulator scenarios     cargo test -p meridian-sim --lib
#   3. swarms                  meridian sim --seeds ... --faults, for list-append, bank and
#                              scan-count on 3 shards x 1 replica (300 seeds each) and bank on
#                              3 shards x 3 replicas (100 seeds)
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
step_timeout=${STEP_TIMEOUT:-240}
scratch=${MUTANTS_DIR:-/tmp/meridian-mutants}
export CARGO_TARGET_DIR=${MUTANTS_TARGET:-/tmp/meridian-mutants-target}

mutants=("$@")
if [ ${#mutants[@]} -eq 0 ]; then
  for patch in scripts/mutants/*.patch; do mutants+=("$(basename "$patch" .patch)"); done
fi

rm -rf "$scratch"
git worktree prune
git worktree add --detach "$scratch" HEAD >/dev/null 2>&1 || { echo "cannot create $scratch"; exit 2; }
trap 'git -C "$repo" worktree remove --force "$scratch" >/dev/null 2>&1' EXIT

swarm() { # workload replicas keys seeds
  "$CARGO_TARGET_DIR/release/meridian" sim --workload "$1" --shards 3 --replicas "$2" \
    --network metro --keys-per-shard "$3" --seeds "$4" --faults --jobs 2
}

results=()
for name in "${mutants[@]}"; do
  patch="$repo/scripts/mutants/$name.patch"
  if [ ! -f "$patch" ]; then echo "no such mutant: $name"; exit 2; fi
  (cd "$scratch" && git checkout -q -- . && git apply "$patch") || { echo "$name: patch does not apply"; exit 2; }
  echo "== $name: building"
  (cd "$scratch" && cargo build -q --release -p meridian && cargo test -q --no-run -p meridian-protocols -p meridian-sim) \
    >/dev/null 2>&1 || { results+=("$name: does not build"); continue; }
  verdict="MISSED"
  started=$(date +%s)
  steps=(
    "protocol unit tests|cargo test -q -p meridian-protocols"
    "simulator scenarios|cargo test -q -p meridian-sim --lib"
    "list-append swarm|swarm list-append 1 4 0..300"
    "bank swarm|swarm bank 1 4 0..300"
    "scan-count swarm|swarm scan-count 1 2 0..300"
    "replicated bank swarm|swarm bank 3 16 0..100"
  )
  for step in "${steps[@]}"; do
    label=${step%%|*}; command=${step#*|}
    echo "   $label"
    (cd "$scratch" && export -f swarm && timeout "$step_timeout" bash -c "$command") >"/tmp/mutant-$name.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      how="caught"; [ $rc -eq 124 ] && how="caught (step timed out after ${step_timeout} s)"
      verdict="$how by $label after $(( $(date +%s) - started )) s (log: /tmp/mutant-$name.log)"
      break
    fi
  done
  results+=("$name: $verdict")
done
echo
printf '%s\n' "${results[@]}"
