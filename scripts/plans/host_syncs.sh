# Issue 34: host syncs in speedrun-latest's training step after 5253b29 (the FP8 head's scales filled on the
# device). bench's host_syncs_per_step on one GPU and on all of them (expected 0 on both; above 0 the log names the
# sites: grep "host syncs at"), scripts/gpu_check_syncs.py on the FP8 head alone, then stage 0 profiled on all GPUs
# to set against wave 11's 2-GPU trace (8 syncs a step, 218 eager launches before each forward: docs/benchmarks.md,
# "Host syncs in the training step"). About 20 device-minutes on 4 x H100 with the machine's start (3 benches, the
# first compiling cold, ~6 min; the later ones find Inductor's cache warm). Run from the repository root:
#   setsid scripts/lease.sh /tmp/w35 scripts/plans/host_syncs.sh > /tmp/w35.log 2>&1 < /dev/null &
# Then: grep -H "host_syncs_per_step\|host syncs at\|step_ms_mean" /tmp/w35/logs/*.log; cat /tmp/w35/logs/host-ops.log
# Sourced by scripts/lease.sh ($W $PY $DATA $TR, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
phase fp8-check 300 env CUDA_VISIBLE_DEVICES=0 $PY scripts/gpu_check_syncs.py
phase bench-1gpu 540 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files="$DATA"
phase bench-all 540 $TR -m speedgpt bench --preset speedrun-latest --steps 6 --data.train_files="$DATA"
phase bench-all-prof0 540 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 12 \
    --profile-trace "$W/trace" --data.train_files="$DATA"
phase host-ops 120 $PY benchmarks/trace_host_ops.py "$W/trace/profile-A.json.gz"
phase trace-report 120 $PY benchmarks/trace_report.py "$W"/trace/profile-A*.json.gz
