# Wave 25 (issues 32, 33), one GPU, in priority order (~20 device-minutes with the start). The last phase may be cut
# where the budget ends: collect before it does; a seed counts as a pair only where both its runs finished (a new
# machine does not have the half-done ones: rerun what is missing with --seed-base). No tree travels in .carry.
# Its checks and FSDP2's bench ran in wave 25b (scripts/plans/wave25b.sh, docs/experiments.md "Wave 25b"); left:
# 1. speedrun-124m against speedrun-latest, both on their presets' loaders (greedy, mix, 8,192 open documents since
#    waves 22 and 24), 2 paired seeds by time to record #28's 0.8214, runs one after another (~16 min): the README's
#    comparison was made in wave 8 with 1,024 open documents and the tables in the graph. Each arm's first run
#    starts cold in the lease's cache: issue 33's cold bars as a training run meets them (the runs' start lines).
# 2. gpu_check.py's generation check as 59d632b judges it (~1 min): KV-cache decoding against the full forward
#    through sdpa, with the preset's FP8 matmuls and without (wave 25b: 6e-3; against flex's forward 2.6e-2).
#   mkdir -p /tmp/w25; setsid scripts/lease.sh /tmp/w25 scripts/plans/wave25.sh > /tmp/w25.log 2>&1 < /dev/null &
# then poll in calls of at most ~540 s, one right after another, the last ending with
# `scripts/lease.sh /tmp/w25 collect $OUT/w25.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase latest-vs-124m 1500 $PY -m speedgpt ab --a "--preset speedrun-124m" --b "--preset speedrun-latest" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/latest-vs-124m" $C --train.compile_cache="$W/cc"
phase gpucheck-gen 120 $PY scripts/gpu_check.py generation
true
