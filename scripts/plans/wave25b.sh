# Wave 25b (issue 33), one GPU, in priority order (~17 device-minutes with the start): the part of wave25.sh that fits
# what four refused starts left of the session's 30 device-minutes (18 on 2026-12-06). wave25.sh's A/B (speedrun-124m
# against speedrun-latest, ~16 min) waits for a lease of its own. No tree travels in .carry.
# 1. Issue 33's cold bars on one more machine: speedrun-latest's bench, then speedrun-124m's, each cold in a new
#    cache folder and alone on the GPU (compile + warmup as bench prints it; latest <= 90 s met on 2 of 5 machines so
#    far, 124m <= 60 s on 1 of 5); their ms/step per stage on this machine.
# 2. The GPU checks after wave 24's code (YaRN's tables made outside the graph, FSDP2's uncast inputs): every
#    scripts/gpu_check.py check (~2 min).
# 3. speedrun-latest under FSDP2 on one GPU, compiled, the preset's rows (~4 min): FSDP2 with flex attention, YaRN's
#    tables and uncast forward inputs compiles and steps (wave 24's smoke ran eager with sdpa); its ms/step per
#    stage beside 1.'s DDP figures.
# 4. The CUDA-graph replay check on speedrun-latest, which now takes the model's rope_state (~4 min), if time is left.
#   mkdir -p /tmp/w25; setsid scripts/lease.sh /tmp/w25 scripts/plans/wave25b.sh > /tmp/w25.log 2>&1 < /dev/null &
# then poll in calls of at most ~540 s, one right after another, the last ending with
# `scripts/lease.sh /tmp/w25 collect $OUT/w25.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase cold-latest 330 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/cc-latest"
phase cold-124m 330 $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/cc-124m"
phase gpucheck 240 $PY scripts/gpu_check.py
phase fsdp-bench 400 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --parallel.strategy=fsdp \
    --data.train_files="$DATA" --train.compile_cache="$W/cc-fsdp"
phase gpucheck-cg 360 $PY scripts/gpu_check_cudagraphs.py --preset speedrun-latest
true
