# Wave 19 (issue 33) on one GPU: the sort-free query-side block lists (attention.ordered_block_lists, 77c322b)
# against the tree before them, where torch 2.11 built flex's argsort into a cold start's two slowest Triton kernels
# (wave 18's pc-cold: 20.2 s and 14.6 s); then speedrun-124m with precompile, cold and from its artifacts alone (its
# preset would then set it, as speedrun-latest's does since 578f3ff); last, the persistent reductions' share of a
# cold start. ~18 device-minutes with the start. The tree
# before travels in .carry (git-ignored), named in `carry` on the FIRST call only:
#   mkdir -p .carry/tree-2129645 && git archive 2129645 | tar -x -C .carry/tree-2129645
# then, from the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w19 scripts/plans/wave19.sh > /tmp/w19.log 2>&1 < /dev/null &
# and poll `/tmp/w19/progress` in calls of at most ~540 s, one right after another, each ending with
# `scripts/lease.sh /tmp/w19 collect $OUT/w19.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA --train.compile_precompile=true"
HEUR=TORCH_LOGS=torch._inductor.runtime.triton_heuristics  # Inductor's launcher reasons (`grep -c Bypassing`)
# 0. The fused flex kernels on masks whose query-side lists are now built without a sort, with grad and without (first:
# the default path's correctness; its caches are not the cold phases', which each have a compile cache of their own)
phase gpucheck-flex 240 $PY scripts/gpu_check.py flex
# 1. Cold, alone on the machine, a new cache folder each: this tree, then the tree before the sort-free lists.
phase cold-sortfree 420 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccs"
BEFORE=$PWD/.carry/tree-2129645
phase cold-sorted 420 bash -c "cd $BEFORE && PYTHONPATH=$BEFORE $PY -m speedgpt bench $LATEST \
    --train.compile_cache=$W/ccb"
# 2. Fewer Triton compiles, against cold-sortfree: Inductor's pointwise kernels with one launch config each instead of
# two or six (train.autotune_pointwise=false; its step times say what the configs were worth) ...
phase cold-noapw 420 $PY -m speedgpt bench $LATEST --train.autotune_pointwise=false --train.compile_cache="$W/cca"
# ... and everything at once: also Inductor's own reduction heuristic (persistent_reductions_upto=0: wave 18's slowest
# kernels after flex's sorts were persistent RMSNorm + rotary kernels, 11-13.5 s each; the setting is worth 1.3 % a
# step) and the static launcher for our own Triton kernels (relu2_fp8, softcap_ce), which Inductor otherwise launches
# through Triton's launcher, a gcc build each, serially (wave 18's profile: 21 builds, ~7 s). What the levers give
# together, with the launcher reasons in its log; each alone is a later lease's, if the sum is worth it.
phase cold-lean 420 env $HEUR TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 $PY -m speedgpt bench \
    $LATEST --train.autotune_pointwise=false --train.persistent_reductions_upto=0 --train.compile_cache="$W/ccl"
# 3. speedrun-124m with precompile: cold (with the launcher reasons at its defaults), then a new folder holding only its
# artifact file (the warm bar, <= 20 s): its preset would then set it, as speedrun-latest's does since 578f3ff.
S124="--preset speedrun-124m --steps 6 --data.train_files=$DATA --train.compile_precompile=true"
phase cold-124pc 300 env $HEUR $PY -m speedgpt bench $S124 --train.compile_cache="$W/cc124"
artifacts_only "$W/cc124" "$W/cc124b"
phase fresh-124pc 240 $PY -m speedgpt bench $S124 --train.compile_cache="$W/cc124b"
# 4. The sort-free tree's warm start from its cold start's artifact file alone (wave 18: 14.2 s before the change).
artifacts_only "$W/ccs" "$W/ccsb"
phase fresh-latest 240 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccsb"
true
