# Wave 20 (issue 33) on one GPU: speedrun-latest's cold start with its validation graph compiled ahead by a helper
# process (train.compile_validation_ahead, default auto: on for a cold start of one CUDA process), against the same tree
# with it off, alone on the machine one after the other, a new compile cache folder each; then the same pair for
# speedrun-124m (~11 device-minutes with the start). Wave 18's loss-b start: validation's graph took 33.3 s of compiling
# (35.7 s in all) of 134.4 s. Ran on 2026-12-06 up to cold-off (111.8 against 122.5 s, docs/experiments.md "Wave 20");
# the speedrun-124m pair is owed.
# From the repository root of the device copy (nothing travels in .carry):
#   setsid scripts/lease.sh /tmp/w20 scripts/plans/wave20.sh > /tmp/w20.log 2>&1 < /dev/null &
# and poll `/tmp/w20/progress` in calls of at most ~540 s, one right after another, each ending with
# `scripts/lease.sh /tmp/w20 collect $OUT/w20.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA --train.compile_precompile=true"
# bench prints no start log: its compile_fx_cache_hits say whether validation's graph came from the helper (1/3
# against 0/3), and the helper's own log stays in bench's run folder (/tmp/speedgpt-bench-*/validation-ahead.log)
phase cold-ahead 420 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/cca"
phase helper-log 10 bash -c \
    "cp \$(ls -td /tmp/speedgpt-bench-*/ | head -1)validation-ahead.log $W/logs/helper.log"
phase cold-off 420 $PY -m speedgpt bench $LATEST --train.compile_validation_ahead=off --train.compile_cache="$W/cco"
# speedrun-124m (its cold bar: <= 60 s; wave 19: 65.1 s without the helper)
S124="--preset speedrun-124m --steps 6 --data.train_files=$DATA"
phase cold-124-ahead 300 $PY -m speedgpt bench $S124 --train.compile_cache="$W/cc124a"
phase cold-124-off 300 $PY -m speedgpt bench $S124 --train.compile_validation_ahead=off \
    --train.compile_cache="$W/cc124o"
true
