# Wave 18 (issue 33) on one GPU: what wave17.sh left when its lease ended (its phases 0-3 ran, "Wave 17" in
# docs/experiments.md), for a session with ~16 device-minutes left: speedrun-124m's cold start, the owed run-plan
# pair, precompile on torch 2.11 (mended since 5d1d209) and a host profile of a cold start. Phases 1-2 ran in wave 18:
# to start a new machine at `pc-cold` (the corpus is still built), mark them done first, since a lease skips the
# phases its status file lists: `mkdir -p /tmp/w18 && printf '%s 0 0\n' cold-124 old-tree plan-old plan-new >
# /tmp/w18/status`. The 56de1ae tree (phase 5) then is the only one .carry needs.
# In priority order; cut where the budget ends. Run from the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w18 scripts/plans/wave18.sh > /tmp/w18.log 2>&1 < /dev/null &
# then poll `/tmp/w18/status` in calls of at most ~540 s, one right after another (the machine goes back after 30 s
# idle), each ending with `scripts/lease.sh /tmp/w18 collect $OUT/w18.tgz`. The b064051 and 56de1ae trees travel in
# .carry as for wave17.sh (its header says how to make them), named in `carry` on the FIRST call only.
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"

# 1. speedrun-124m cold, alone on the machine, in a new cache folder (issue 33's bar: <= 60 s; wave 11: 100.2 s beside
# another compile).
phase cold-124 300 $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files=$DATA \
    --train.compile_cache="$W/cc124"

# 2. Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree in b064051's rows,
# one after the other on the one GPU (owed since wave 10). The same arguments as wave17.sh's plan-old / plan-new.
S_OLD='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=49152,max_doc_len=8192}]'
OLD="--data.seq_len=49152 --train.stages=$S_OLD"
OLDER=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLDER/speedgpt/__main__.py
phase plan-old 480 bash -c "cd $OLDER && PYTHONPATH=$OLDER $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files=$DATA"
# (--train.warmup_steps=10: b064051's warmup, so that the pair differs only in the run plan's code)
phase plan-new 480 $PY -m speedgpt bench --preset speedrun-latest --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/cca" $OLD --train.warmup_steps=10

# 3. Precompile on torch 2.11, now that its guard sources' pickling is mended (5d1d209; wave 17's pc-fresh died of
# it): speedrun-latest cold with dynamo's package, then a fresh machine from its artifact files alone (expected:
# nothing traced, wave 17's 10.7 s of trace gone: issue 33's warm bar, <= 20 s), then the first training steps from
# that package against a traced start's (the same losses expected; stopped by SIGINT; --train.log_every=1 keeps
# bench's config digest, so the package is found). wave17.sh's pc-cold, pc-fresh, loss-pc and loss-b (~9 min).
PC="--train.compile_precompile=true"
phase pc-cold 420 $PY -m speedgpt bench $LATEST $PC --train.compile_cache="$W/ccp"
artifacts_only "$W/ccp" "$W/ccp2"
phase pc-fresh 300 $PY -m speedgpt bench $LATEST $PC --train.compile_cache="$W/ccp2"
LOSS="--preset speedrun-latest --train.log_every=1 --data.train_files=$DATA --run.report=false --run.sample_tokens=0"
phase loss-pc 150 timeout -s INT 75 $PY -m speedgpt train $LOSS $PC --train.compile_cache="$W/ccp2" \
    --run-dir "$W/runs/loss-pc"
# (the traced start compiles cold: no folder of this lease holds its config's artifacts without precompile)
phase loss-b 270 timeout -s INT 210 $PY -m speedgpt train $LOSS --train.compile_cache="$W/ccl" --run-dir "$W/runs/loss-b"

# 4. Where a cold compile's seconds go inside Inductor (wave 17: Inductor 49.7 s and the kernels' wait 37.4 s of
# 133.5 s; the phase timers stop at "inductor"): the host's Python profile of a cold start, its top functions in the
# log. cProfile slows the traced Python; read shares, not seconds.
phase prof-compile 480 $PY -m cProfile -o "$W/compile.prof" -m speedgpt bench $LATEST --steps 1 \
    --train.compile_cache="$W/ccprof"
phase prof-read 60 $PY -c "import pstats; s = pstats.Stats('$W/compile.prof'); \
s.sort_stats('cumulative').print_stats(80); s.sort_stats('tottime').print_stats(40)"

# 5. The trace cuts' step time: 56de1ae's tree, wave17.sh's cold-b bench (its phase 7).
BEFORE=$PWD/.carry/tree-56de1ae
phase trace-old 420 bash -c "cd $BEFORE && PYTHONPATH=$BEFORE $PY -m speedgpt bench $LATEST \
    --train.compile_cache=$W/cct"
true
