# Wave 21 (issue 33) on one GPU: the cold starts with both compile helpers (train.compile_backward_ahead and
# train.compile_validation_ahead, default auto: training's backward graph and validation's compiled in helper
# processes while the trainer compiles the forward), against validation's helper alone (wave 20's 111.8 s) and none
# (122.5 s), for speedrun-latest (bar <= 90 s on one H100) and speedrun-124m (bar <= 60 s); then speedrun-latest's
# start on a fresh machine from the both-helpers start's artifact file alone (the warm bar, <= 20 s: the artifacts
# of a start that took its backward from a helper). Each cold phase alone on the machine, a new compile cache folder
# each. ~15 device-minutes with the start; nothing in .carry.
# Ran in full on 2026-12-06 at 0c17fa3 (docs/experiments.md "Wave 21"). The backward helper was withdrawn after it
# (its key train.compile_backward_ahead is gone): to rerun this plan, check out 0c17fa3.
# From the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w21 scripts/plans/wave21.sh > /tmp/w21.log 2>&1 < /dev/null &
# and poll `/tmp/w21/progress` in calls of at most ~540 s, one right after another, each ending with
# `scripts/lease.sh /tmp/w21 collect $OUT/w21.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
# bench prints each helper's line (how long the warmup waited for it) and the compile table's fx / aot cache hits;
# the helpers' own logs stay in bench's run folder (/tmp/speedgpt-bench-*/PART-ahead.log)
# phase NAME-logs: the newest bench folder's helper logs into $W/logs
LOGS='d=$(ls -td /tmp/speedgpt-bench-*/ | head -1); for p in backward validation; do
    [ -f "$d$p-ahead.log" ] && cp "$d$p-ahead.log" "$W/logs/$0-$p-helper.log"; done; true'
NOBW=--train.compile_backward_ahead=off
NOVAL=--train.compile_validation_ahead=off
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
phase cold-both 420 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/cc-both"
phase cold-both-logs 10 env W="$W" bash -c "$LOGS" cold-both
phase cold-val 420 $PY -m speedgpt bench $LATEST $NOBW --train.compile_cache="$W/cc-val"
phase cold-val-logs 10 env W="$W" bash -c "$LOGS" cold-val
phase cold-none 420 $PY -m speedgpt bench $LATEST $NOBW $NOVAL --train.compile_cache="$W/cc-none"
S124="--preset speedrun-124m --steps 6 --data.train_files=$DATA"
phase cold-124-both 300 $PY -m speedgpt bench $S124 --train.compile_cache="$W/cc-124-both"
phase cold-124-both-logs 10 env W="$W" bash -c "$LOGS" cold-124-both
phase cold-124-val 300 $PY -m speedgpt bench $S124 $NOBW --train.compile_cache="$W/cc-124-val"
phase cold-124-none 300 $PY -m speedgpt bench $S124 $NOBW $NOVAL --train.compile_cache="$W/cc-124-none"
artifacts_only "$W/cc-both" "$W/cc-both-fresh"
phase fresh-both 240 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/cc-both-fresh"
true
