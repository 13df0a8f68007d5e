# Wave 21's third part (issue 33), a second lease of the same session: one cold start of speedrun-latest with the
# validation helper (the default), on this tree, whose helper line now gives the helper's exit time (7776e9e) and
# whose helper log gives its setup time (1beb4ed): how much slack the helper leaves the trainer. ~5 device-minutes
# with the start; nothing in .carry. Ran on 2026-12-06 at d45af91.
#   setsid scripts/lease.sh /tmp/w21c scripts/plans/wave21c.sh > /tmp/w21c.log 2>&1 < /dev/null &
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
phase cold-val 420 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/cc-val"
phase cold-val-log 10 bash -c "cp \$(ls -td /tmp/speedgpt-bench-*/ | head -1)validation-ahead.log $W/logs/helper.log"
# the pair's other arm, the helper off (on 2026-12-06 run as a call of its own right after the phases above, in the
# same lease: 80.5 against 102.6 s, docs/experiments.md "Wave 21")
phase cold-none 420 $PY -m speedgpt bench $LATEST --train.compile_validation_ahead=off --train.compile_cache="$W/cc-none"
true
