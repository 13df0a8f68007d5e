# Wave 19 (issue 33) on one GPU (ran in full on 2026-12-06: docs/experiments.md "Wave 19 on one H100"): fewer and
# shorter Triton compiles in speedrun-latest's cold start (wave 18 on an H100: 117.7 s, kernels 35.5 s of it; the bar is
# <= 90 s), then speedrun-124m with precompile, cold and from its artifacts alone (its preset would then set it, as
# speedrun-latest's does since 578f3ff). ~18 device-minutes with the start. A ladder, one lever more a phase: c5dbb6f's
# tree (wave 18's training code), this tree (the key-side and query-side block lists without a sort or scatter: wave
# 18's two slowest kernel compiles, 20.2 and 14.6 s, were the key side's argsort), then pointwise autotuning off, then
# Inductor's own reduction heuristic and the static launcher for our Triton kernels.
# The 2026-12-06 lease ran data and gpucheck-flex, then c5dbb6f's predecessor's sort-free *query-side* lists failed
# Inductor's CUDA code generation; those are gone.
# c5dbb6f's tree travels in .carry (git-ignored; `mkdir -p .carry/tree-c5dbb6f && git archive c5dbb6f | tar -x -C
# .carry/tree-c5dbb6f`), named in `carry` on the FIRST call only. From the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w19 scripts/plans/wave19.sh > /tmp/w19.log 2>&1 < /dev/null &
# and poll `/tmp/w19/progress` in calls of at most ~540 s, one right after another, each ending with
# `scripts/lease.sh /tmp/w19 collect $OUT/w19.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA --train.compile_precompile=true"
HEUR=TORCH_LOGS=torch._inductor.runtime.triton_heuristics  # Inductor's launcher reasons (`grep -c Bypassing`)
# 0. The fused flex kernels against a dense reference, with the masks built outside and inside the compiled graph
# (its caches are not the cold phases', which each have a compile cache of their own)
phase gpucheck-flex 300 $PY scripts/gpu_check.py flex
OLD=$PWD/.carry/tree-c5dbb6f
phase old-tree 30 test -f $OLD/speedgpt/__main__.py
# If this tree's lists fail on the GPU, the levers below are measured on c5dbb6f's tree instead (its log says so).
NEW=$PWD
grep -q "^gpucheck-flex 0 " "$W/status" ||
    { NEW=$OLD; echo "gpucheck-flex failed: levers on c5dbb6f's tree" >> "$W/progress"; }
# 1. Cold, alone on the machine, a new cache folder each: c5dbb6f's tree (its training code is wave 18's pc-cold's,
# 117.7 s on an H100), this tree (no sort or scatter in the masks), then fewer Triton compiles: Inductor's pointwise
# kernels with one launch config each instead of two or six (train.autotune_pointwise=false; its step times say what
# the configs were worth) ...
phase cold-main 420 bash -c "cd $OLD && PYTHONPATH=$OLD $PY -m speedgpt bench $LATEST --train.compile_cache=$W/ccm"
phase cold-nosort 420 bash -c "cd $NEW && PYTHONPATH=$NEW $PY -m speedgpt bench $LATEST --train.compile_cache=$W/ccn"
phase cold-noapw 420 bash -c "cd $NEW && PYTHONPATH=$NEW $PY -m speedgpt bench $LATEST \
    --train.autotune_pointwise=false --train.compile_cache=$W/cca"
# ... and everything at once: also Inductor's own reduction heuristic (persistent_reductions_upto=0: wave 18's slowest
# kernels after the masks' sorts were persistent RMSNorm + rotary kernels, 11-13.5 s each; the setting is worth 1.3 %
# a step) and the static launcher for our own Triton kernels (relu2_fp8, softcap_ce), which Inductor otherwise
# launches through Triton's launcher, a gcc build each, serially (wave 18's profile: 21 builds, ~7 s). What the
# levers give together, with the launcher reasons in its log; each alone is a later lease's, if the sum is worth it.
phase cold-lean 420 env $HEUR TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 bash -c "cd $NEW && \
    PYTHONPATH=$NEW $PY -m speedgpt bench $LATEST --train.autotune_pointwise=false \
    --train.persistent_reductions_upto=0 --train.compile_cache=$W/ccl"
# 2. speedrun-124m with precompile: cold (with the launcher reasons at its defaults), then a new folder holding only its
# artifact file (the warm bar, <= 20 s).
S124="--preset speedrun-124m --steps 6 --data.train_files=$DATA --train.compile_precompile=true"
phase cold-124pc 300 env $HEUR bash -c "cd $NEW && PYTHONPATH=$NEW $PY -m speedgpt bench $S124 \
    --train.compile_cache=$W/cc124"
artifacts_only "$W/cc124" "$W/cc124b"
phase fresh-124pc 240 bash -c "cd $NEW && PYTHONPATH=$NEW $PY -m speedgpt bench $S124 --train.compile_cache=$W/cc124b"
true
