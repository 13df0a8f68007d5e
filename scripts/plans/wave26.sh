# Wave 26 (issue 33), one GPU (~20 device-minutes with the start): an --extend resume starts warm. On 2026-12-06 a
# `train --resume RUN --train.steps=40 --extend` of speedrun-latest compiled 55.9 s cold (62.6 s compile + warmup)
# right after RUN had saved its artifacts: train.steps was in the compile cache's config digest, and with precompile
# each digest has an Inductor folder of its own. b1dceae takes the run's length out of the digest. Expected: the
# resume's compile + warmup near the warm start's 6-7 s (wave 25), dynamo's package installed, nothing traced.
# 1. speedrun-latest, 30 steps, cold in a new cache folder (its compile + warmup: issue 33's cold bar once more).
# 2. --resume of it with --train.steps=40 --extend (warm, the figure), then a refused one (another train.seed: one
#    line before anything is built).
# 3. (~12 min, issue 32) speedrun-latest's schedule cut to 260 steps against its 300, 2 paired seeds by time to record
#    #28's 0.8214, runs one after another, warm from 1.'s cache (the digest no longer holds the length: every run
#    should start warm). Wave 25 reached the target at ~step 267 of 300 (125.9 / 124.8 s) with its final loss 0.034
#    below it: a schedule that ends nearer the target may reach it sooner. Loader of both: the preset's (greedy, mix,
#    8,192 open documents, the stage table's caps; its stages are shares of the run, so they shrink with it).
#   mkdir -p /tmp/w26; setsid scripts/lease.sh /tmp/w26 scripts/plans/wave26.sh > /tmp/w26.log 2>&1 < /dev/null &
# then poll, and end with `scripts/lease.sh /tmp/w26 collect $OUT/w26.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
V="--data.train_files=$DATA --data.val_tokens=262144 --data.val_seq_len=262144 --train.compile_cache=$W/cc"
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase first 300 $PY -m speedgpt train --preset speedrun-latest --train.steps=30 --train.val_every=10 $V \
    --run-dir "$W/runs/r1" --run.sample_tokens=16 --run.report=false
phase extend 200 $PY -m speedgpt train --resume "$W/runs/r1" --train.steps=40 --extend
phase refused 60 bash -c "! $PY -m speedgpt train --resume $W/runs/r1 --train.steps=50 --extend --train.seed=3"
phase steps260 1100 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--train.steps=260" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/steps260" $C --train.compile_cache="$W/cc"
true
