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
# 4. The package's losses: the first training steps from 3.'s fresh folder (package installed, nothing traced) against
# the same run without precompile from 1.'s folder (traced, every Inductor graph a cache hit). --train.log_every=1
# keeps bench's config digest, so the fresh folder's package is found; each run is stopped by SIGINT after ~75 s.
LOSS="--preset speedrun-latest --train.log_every=1 --data.train_files=$DATA --run.report=false --run.sample_tokens=0"
phase loss-pc 150 timeout -s INT 75 $PY -m speedgpt train $LOSS $PC --train.compile_cache="$W/ccp2" \
    --run-dir "$W/runs/loss-pc"
phase loss-b 150 timeout -s INT 75 $PY -m speedgpt train $LOSS --train.compile_cache="$W/ccb" --run-dir "$W/runs/loss-b"

# 5. speedrun-124m alone: cold (bar <= 60 s; wave 11: 100.2 s beside another compile), and with precompile cold and
# from its files alone.
M124="--preset speedrun-124m --steps 6 --data.train_files=$DATA"
phase cold-124 300 $PY -m speedgpt bench $M124 --train.compile_cache="$W/cc124"
phase pc-cold-124 300 $PY -m speedgpt bench $M124 $PC --train.compile_cache="$W/cc124p"
artifacts_only "$W/cc124p" "$W/cc124p2"
phase pc-fresh-124 240 $PY -m speedgpt bench $M124 $PC --train.compile_cache="$W/cc124p2"

# 6. Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree in b064051's rows
# ($OLD), one after the other on the one GPU (owed since wave 10).
S_OLD='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=49152,max_doc_len=8192}]'
OLD="--data.seq_len=49152 --train.stages=$S_OLD"
OLDER=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLDER/speedgpt/__main__.py
phase plan-old 480 bash -c "cd $OLDER && PYTHONPATH=$OLDER $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files=$DATA"
# (--train.warmup_steps=10: b064051's warmup, so that the pair differs only in the run plan's code)
phase plan-new 480 $PY -m speedgpt bench --preset speedrun-latest --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/cca" $OLD --train.warmup_steps=10

# 7. The trace cuts' step time: 56de1ae's tree, the same per-stage bench as 1. (cold), one after the other on the GPU
# (expected: the same ms a step per stage as 1.; the kernels of the masks and rotations are tiny either way). Its
# warmup is the old one (12 steps, a whole validation): compare the compile seconds (trace, aot, ...), not
# compile_warmup_s, with 1.'s.
BEFORE=$PWD/.carry/tree-56de1ae
phase trace-old 420 bash -c "cd $BEFORE && PYTHONPATH=$BEFORE $PY -m speedgpt bench $LATEST \
    --train.compile_cache=$W/cct"

# 8. Where a cold compile's seconds go inside Inductor (issue 33: wave 9's 4 graphs spent 92 of 215 s there, and the
# phase timers stop at "inductor"): the host's Python profile of a cold start, its top functions in the log.
phase prof-compile 480 $PY -m cProfile -o "$W/compile.prof" -m speedgpt bench $LATEST --steps 1 \
    --train.compile_cache="$W/ccprof"
phase prof-read 60 $PY -c "import pstats; s = pstats.Stats('$W/compile.prof'); \
s.sort_stats('cumulative').print_stats(80); s.sort_stats('tottime').print_stats(40)"
true
