# Wave 24 (issues 33, 32), one GPU, in priority order (~28 device-minutes with the start). The last phase may be cut
# where the budget ends: collect before it does; a seed counts as a pair only where both its runs finished (a new
# machine does not have the half-done ones: rerun what is missing with --seed-base).
# 1. YaRN's rotary tables made outside the compiled graph (issue 33): speedrun-latest's bench cold in a new cache
#    folder each, main against b073e6b (the tables made in the graph), two pairs in alternating order, each alone on
#    the GPU: compile + warmup (wave 23: 105.3 s cold, its six slowest kernels 10-13 s each, all with an inlined cos
#    and sin) and the step time per stage (no change may slow steps). b073e6b's tree travels in .carry (git-ignored;
#    `mkdir -p .carry/tree-b073e6b && git archive b073e6b | tar -x -C .carry/tree-b073e6b`), named in `carry` on the
#    first call only.
# 2. Issue 32: speedrun-124m with 8,192 open documents against its preset's 1,024, seeds 1338 and 1339 (wave 23 ran
#    the 1337 pair: 171.8 against 179.1 s to 0.8214), runs one after another (~14 min).
#   mkdir -p /tmp/w24; setsid scripts/lease.sh /tmp/w24 scripts/plans/wave24.sh > /tmp/w24.log 2>&1 < /dev/null &
# then poll in calls of at most ~540 s, one right after another, the last ending with
# `scripts/lease.sh /tmp/w24 collect $OUT/w24.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
OLD=$PWD/.carry/tree-b073e6b
SL="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
phase cold-new1 330 $PY -m speedgpt bench $SL --train.compile_cache="$W/cc-new1"
phase cold-old1 330 bash -c "cd $OLD && PYTHONPATH=$OLD $PY -m speedgpt bench $SL --train.compile_cache=$W/cc-old1"
phase cold-old2 330 bash -c "cd $OLD && PYTHONPATH=$OLD $PY -m speedgpt bench $SL --train.compile_cache=$W/cc-old2"
phase cold-new2 330 $PY -m speedgpt bench $SL --train.compile_cache="$W/cc-new2"
phase mixk124b 1200 $PY -m speedgpt ab --preset speedrun-124m --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --seed-base 1338 --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk124b" $C --train.compile_cache="$W/cc"
true
