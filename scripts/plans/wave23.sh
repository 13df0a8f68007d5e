# Wave 23 (issues 33, 32), one GPU: what wave 22 left owed, in priority order (~30 device-minutes with the start: the
# last phase is cut where the budget ends; nothing in .carry).
#   setsid scripts/lease.sh /tmp/w23 scripts/plans/wave23.sh > /tmp/w23.log 2>&1 < /dev/null &
# then poll /tmp/w23/progress in calls of at most ~540 s, one right after another, each ending with
# `scripts/lease.sh /tmp/w23 collect $OUT/w23.tgz`.
# 1. The FP8 casts without a clamp (d5a4229) compiled by Triton against a clamped cast, bit for bit (~1 min; wave
#    22b's try stopped on the check's own empty rows, mended in 04c30ad).
# 2. Issue 32's next screen of K: 32,768 open documents against the preset's 8,192 (wave 22: 8,192 beat 1,024 by
#    11.1 s to the target, p = 0.0004), 2 paired seeds, runs one after another (~17 min).
# 3. speedrun-124m with 8,192 open documents against its preset's 1,024 (~17 min: cut by the budget unless phase 2
#    ran short; it resumes where it stopped in the next lease: `ab` keeps finished runs in its --out).
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase gpucheck-cast 120 $PY scripts/gpu_check.py cast
phase mixk32 1700 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=32768" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk32" $C --train.compile_cache="$W/cc"
phase mixk124 1700 $PY -m speedgpt ab --preset speedrun-124m --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk124" $C --train.compile_cache="$W/cc"
true
