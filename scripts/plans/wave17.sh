# Wave 17 (issue 33) on one GPU: the compile figures of speedrun-latest and speedrun-124m each alone on the machine,
# dynamo's package (train.compile_precompile, now with flex attention) on a fresh machine, the run-plan pair, and the
# step time of the trace cuts (the flex masks' query-side lists and the rotary tables made once a forward, e06b084 and
# c509a38) against the tree before them (56de1ae). Not run on 2026-12-04: no machine was lent that session.
# In priority order, ~27 device-minutes with the start (8. only if time is left); cut where the budget ends. Run from
# the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w17 scripts/plans/wave17.sh > /tmp/w17.log 2>&1 < /dev/null &
# then poll `/tmp/w17/status` in calls of at most ~540 s, one right after another (the machine goes back after 30 s
# idle), each ending with `scripts/lease.sh /tmp/w17 collect $OUT/w17.tgz`. The b064051 tree travels in .carry
# (git-ignored; `mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C .carry/tree-b064051`), and so does
# 56de1ae's (the same with 56de1ae), named in `carry` on the FIRST call only.
# Sourced by scripts/lease.sh ($W $PY $DATA, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
PC="--train.compile_precompile=true"

# 0. The flex masks' query-side lists (built without from_kv_blocks since e06b084, none without grad) on the fused
# kernels: forward and gradients against dense SDPA, and the forward without grad (~1 min).
phase gpucheck-flex 300 $PY scripts/gpu_check.py flex

# 1. speedrun-latest cold, alone on the machine, in a new cache folder: issue 33's bar (<= 90 s on one GPU; wave 15
# measured 163.6 s with another compile on the host); its step time per stage. Its start log names the slowest
# Triton kernel compiles since 963af1c ("slowest kernel compiles (each its own seconds, ...): ..."): is a flex
# attention template near the "kernels" phase's wait?
phase cold-b 420 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccb"
# 2. A fresh machine: a new folder holding only 1.'s artifact files (bar <= 20 s; wave 15, same machine: 29.0 s,
# of it 20.0 s compiling). Since 2026-12-05 the warmup trains 3 steps, not 12, and validates on 1 batch of 40:
# compile_warmup_s minus the compile seconds (wave 15: 9.0 s) should be ~2 s; 1. and 3.-5. show it too.
artifacts_only "$W/ccb" "$W/ccb2"
phase fresh-b 300 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccb2"
# 3. The same with dynamo's package in the artifacts (precompile): cold, then a fresh machine from its files alone
# (expected: nothing traced, the ~15 s of dynamo's trace gone; bench's compile_call_s row is the package's install,
# inside compile_warmup_s); its step times against 1.'s.
phase pc-cold 420 $PY -m speedgpt bench $LATEST $PC --train.compile_cache="$W/ccp"
artifacts_only "$W/ccp" "$W/ccp2"
phase pc-fresh 300 $PY -m speedgpt bench $LATEST $PC --train.compile_cache="$W/ccp2"
# 4.-8. (the package's losses, speedrun-124m cold, the run-plan pair, the trace cuts' tree, the host profile) moved
# to scripts/plans/wave18.sh after wave 17's lease ended; wave 18 ran speedrun-124m cold and the run-plan pair.
# speedrun-124m's precompile pair waits for speedrun-latest's (wave18.sh 3.).
true
