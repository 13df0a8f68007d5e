# Issue 34: speedrun-latest's 4-GPU step with Adam every other step and no Adam collective between its steps (this
# tree) against 405e6b0 (Adam's ~1 GB of gradients reduce-scattered every step, the embeddings' last in the
# backward, and only stashed on the steps Adam waits). About 12 device-minutes on 4 x H100 with the machine's start:
# two cold compiles (~4 min each) and 6 timed steps per stage. Run from the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w34 scripts/plans/adam_every_comm.sh > /tmp/w34.log 2>&1 < /dev/null &
# The 405e6b0 tree travels in .carry (git-ignored; the device copy has no .git): `mkdir -p .carry/tree-405e6b0 &&
# git archive 405e6b0 | tar -x -C .carry/tree-405e6b0`, and the call names .carry in carry.
# Then: grep -H -A5 "per stage\|comm_wait_ms" /tmp/w34/logs/bench-*.log (each stage's ms/step, bench timing steps
# where Adam waits and steps where it updates alike, and every rank's exposed wait on collectives).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
OLD=$PWD/.carry/tree-405e6b0
phase old-tree 30 test -f $OLD/speedgpt/__main__.py
phase bench-old 540 bash -c "cd $OLD && PYTHONPATH=$OLD $TR -m speedgpt bench --preset speedrun-latest --per-stage \
    --steps 6 --data.train_files=$DATA"
phase bench-new 540 $TR -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --data.train_files="$DATA"
