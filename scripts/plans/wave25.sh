# Wave 25 (issues 33, 32), one GPU, in priority order (~27 device-minutes with the start). The last phases may be cut
# where the budget ends: collect before it does; a seed counts as a pair only where both its runs finished (a new
# machine does not have the half-done ones: rerun what is missing with --seed-base). No tree travels in .carry.
# Reordered on 2026-12-06 after three refused starts had spent 8 of the session's 30 device-minutes: the A/B first,
# the checks after it, as far as the budget reaches.
# 1. speedrun-124m against speedrun-latest, both on their presets' loaders (greedy, mix, 8,192 open documents since
#    waves 22 and 24), 2 paired seeds by time to record #28's 0.8214, runs one after another (~16 min): the README's
#    comparison was made in wave 8 with 1,024 open documents and the tables in the graph. Each arm's first run
#    starts cold in the lease's cache: issue 33's cold bars as a training run meets them (the runs' start lines).
# 2. The GPU checks after wave 24's code (YaRN's tables made outside the graph, FSDP2's uncast inputs): every
#    scripts/gpu_check.py check (~2 min); the CUDA-graph replay check on speedrun-latest, which now takes the
#    model's rope_state, comes last (~4 min).
# 3. speedrun-latest under FSDP2 on one GPU, compiled, the preset's rows (~4 min): FSDP2 with flex attention, YaRN's
#    tables and uncast forward inputs compiles and steps (wave 24's smoke ran eager with sdpa); its ms/step per
#    stage beside DDP's from 1.'s machine.
#   mkdir -p /tmp/w25; setsid scripts/lease.sh /tmp/w25 scripts/plans/wave25.sh > /tmp/w25.log 2>&1 < /dev/null &
# then poll in calls of at most ~540 s, one right after another, the last ending with
# `scripts/lease.sh /tmp/w25 collect $OUT/w25.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase latest-vs-124m 1500 $PY -m speedgpt ab --a "--preset speedrun-124m" --b "--preset speedrun-latest" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/latest-vs-124m" $C --train.compile_cache="$W/cc"
phase gpucheck 240 $PY scripts/gpu_check.py
phase fsdp-bench 400 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --parallel.strategy=fsdp \
    --data.train_files="$DATA" --train.compile_cache="$W/cc-fsdp"
phase gpucheck-cg 360 $PY scripts/gpu_check_cudagraphs.py --preset speedrun-latest
true
