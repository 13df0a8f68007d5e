#!/usr/bin/env bash
# Train several variants of one preset, one after another, for an A/B at equal steps/time; then
# compare them with `speedgpt report RUN_DIR ... --markdown` (the first run is the baseline).
#
#   scripts/ab_runs.sh OUT_DIR "NAME:--sec.key=value --sec.key2=value" ["NAME2:..." ...]
#
# Environment: PRESET (default speedrun-124m), BASE (overrides every run gets, e.g. the data and
# --train.steps), TIMEOUT (seconds per run, default 600). Each run's metrics.jsonl, config.toml and
# log are kept in OUT_DIR/NAME; checkpoints are written under /tmp and dropped.
set -u
out=$1; shift
mkdir -p "$out"
for spec in "$@"; do
  name=${spec%%:*}; overrides=${spec#*:}
  [ "$overrides" = "$spec" ] && overrides=""
  work=$(mktemp -d)
  echo "== $name: ${BASE:-} $overrides" | tee "$out/$name.log"
  # shellcheck disable=SC2086  # overrides are words on purpose
  timeout "${TIMEOUT:-600}" python3 -m speedgpt train --preset "${PRESET:-speedrun-124m}" ${BASE:-} $overrides \
    --run.name="$name" --run.dir="$work/$name" >> "$out/$name.log" 2>&1
  echo "exit $?" >> "$out/$name.log"
  mkdir -p "$out/$name"
  cp "$work/$name"/*.jsonl "$work/$name"/*.toml "$out/$name/" 2>/dev/null
  grep -E "val|compile|tok/s" "$out/$name.log" | tail -4
  rm -rf "$work"
done
