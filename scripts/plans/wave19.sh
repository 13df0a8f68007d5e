# Wave 19 (issue 33) on one GPU: the sort-free query-side block lists (attention.ordered_block_lists, 77c322b)
# against the tree before them, where torch 2.11 built flex's argsort into a cold start's two slowest Triton kernels
# (wave 18's pc-cold: 20.2 s and 14.6 s); then speedrun-124m with precompile, cold and from its artifacts alone (its
# preset would then set it, as speedrun-latest's does since 578f3ff); last, the persistent reductions' share of a
# cold start. ~23 device-minutes with the start. The tree
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
# 1. Cold, alone on the machine, a new cache folder each: this tree, then the tree before the sort-free lists.
phase cold-sortfree 420 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccs"
# the fused flex kernels on masks whose query-side lists are now built without a sort, with grad and without
phase gpucheck-flex 240 $PY scripts/gpu_check.py flex
BEFORE=$PWD/.carry/tree-2129645
phase cold-sorted 420 bash -c "cd $BEFORE && PYTHONPATH=$BEFORE $PY -m speedgpt bench $LATEST \
    --train.compile_cache=$W/ccb"
# the sort-free tree's warm start from its cold start's artifact file alone (the warm bar, <= 20 s; wave 18: 14.2 s)
artifacts_only "$W/ccs" "$W/ccsb"
phase fresh-latest 240 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccsb"
# 2. speedrun-124m with precompile: cold, then a new folder holding only its artifact file (the warm bar, <= 20 s).
# The cold start also says why Inductor launched some kernels through Triton's own launcher, a C build each, serially
# (wave 18's profile: 21 builds, ~7 s): Inductor logs it at INFO inside its compile workers, which inherit TORCH_LOGS
# (`grep -c Bypassing logs/cold-124pc.log`; with TORCH_LOGS set, the start log counts recompiles without reasons).
S124="--preset speedrun-124m --steps 6 --data.train_files=$DATA --train.compile_precompile=true"
phase cold-124pc 300 env TORCH_LOGS=torch._inductor.runtime.triton_heuristics $PY -m speedgpt bench $S124 \
    --train.compile_cache="$W/cc124"
artifacts_only "$W/cc124" "$W/cc124b"
phase fresh-124pc 240 $PY -m speedgpt bench $S124 --train.compile_cache="$W/cc124b"
# 3. Last, where time is left: what the persistent reductions (speedrun-latest's persistent_reductions_upto=1024, 1.3 %
# faster steps) cost a cold start; wave 18's slowest kernels after flex's sorts were persistent ("per") RMSNorm +
# rotary kernels, 11-13.5 s each, which that setting may have made so. Against cold-sortfree (the same tree).
# Both last phases log Inductor's launcher reasons too (a few lines; `grep -c Bypassing`).
HEUR=TORCH_LOGS=torch._inductor.runtime.triton_heuristics
phase cold-noprs 420 env $HEUR $PY -m speedgpt bench $LATEST --train.persistent_reductions_upto=0 \
    --train.compile_cache="$W/ccn"
# Inductor's pointwise kernels with one launch config each instead of two or six (train.autotune_pointwise=false): fewer
# Triton compiles in the kernel phase; its step times say what the configs were worth. Against cold-sortfree.
phase cold-noapw 420 $PY -m speedgpt bench $LATEST --train.autotune_pointwise=false --train.compile_cache="$W/cca"
# 4. Our own Triton kernels (relu2_fp8, softcap_ce) are user-defined to Inductor, which by default launches them
# through Triton's launcher, a gcc build each: the static launcher for them too (time against cold-sortfree,
# the launcher count against cold-noprs's).
phase cold-udk 420 env $HEUR TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 $PY -m speedgpt bench $LATEST \
    --train.compile_cache="$W/ccu"
true
