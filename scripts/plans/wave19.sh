# Wave 19 (issue 33) on one GPU: the sort-free query-side block lists (attention.ordered_block_lists) against
# wave 18's pc-cold, where torch 2.11 built flex's argsort into the cold start's two slowest Triton kernels (20.2 s
# and 14.6 s). For what was left of a session's device time (~8 minutes with the start):
#   setsid scripts/lease.sh /tmp/w19 scripts/plans/wave19.sh > /tmp/w19.log 2>&1 < /dev/null &
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
# wave 18's pc-cold, the same command (a new cache folder): compile + warmup there 117.7 s on an H100
phase cold-sortfree 420 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA \
    --train.compile_precompile=true --train.compile_cache="$W/ccs"
# the fused flex kernels on masks whose query-side lists are now built without a sort, with grad and without
phase gpucheck-flex 240 $PY scripts/gpu_check.py flex
true
