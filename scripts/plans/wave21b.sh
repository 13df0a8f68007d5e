# Wave 21's second part (issue 33), the same lease and machine as wave21.sh, whose $W it reuses: speedrun-latest's
# start on a fresh machine from the artifact file of wave21.sh's cold-val start (validation's helper alone, the
# default since b086d35: does its start still give a complete warm start? wave21.sh's fresh-both, after the backward
# helper, took 46.5 s); then a second pair of cold starts, validation's helper against none, in the other order.
# Ran on 2026-12-06 at 0c17fa3 (docs/experiments.md "Wave 21"); its --train.compile_backward_ahead=off is
# gone since (the backward helper was withdrawn): drop it to rerun on a later tree.
# Run after wave21.sh with the same OUT_DIR: setsid scripts/lease.sh /tmp/w21 scripts/plans/wave21b.sh ...
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
artifacts_only "$W/cc-val" "$W/cc-val-fresh"
phase fresh-val 240 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/cc-val-fresh"
phase cold-none2 420 $PY -m speedgpt bench $LATEST --train.compile_validation_ahead=off \
    --train.compile_backward_ahead=off --train.compile_cache="$W/cc-none2"
phase cold-val2 420 $PY -m speedgpt bench $LATEST --train.compile_backward_ahead=off --train.compile_cache="$W/cc-val2"
true
