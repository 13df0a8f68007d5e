# Wave 15 (issues 34, 33): made for the 2 GPUs lent on 2026-11-28 (adapts to 1 and to 4), ~25 device-minutes with the
# start, in priority order; cut where the budget ends (the rest goes to docs/experiments.md's owed table). Run from
# the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w15 scripts/plans/wave15.sh > /tmp/w15.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w15/status` in calls of at most ~540 s and end each call with
# `scripts/lease.sh /tmp/w15 collect $OUT/w15.tgz`. The b064051 tree travels in .carry (git-ignored):
# `mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C .carry/tree-b064051`. Name .carry in `carry` on
# the FIRST call only (a re-copy removes the working directory of a phase running in it: wave 11).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
G1=1; [ "$NG" -lt 2 ] && G1=0  # the second GPU where there is one
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
S32='[{share=0.33,batch_tokens=131072,seq_len=32768,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=32768,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=32768,max_doc_len=8192}]'
R32="--data.seq_len=32768 --train.stages=$S32"
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
RO="--ab=--train.compile_mode=reduce-overhead"

# 1. Issue 33: speedrun-latest cold, the preset against rows of 1 x 32,768 everywhere, each in a fresh process with a
# new compile cache folder. Since c5e9143 B's stage 2 takes zero MTP weights and stays in stage 0's graph: its start
# log should say 2 graphs (training 1, validation 1) against the preset's 3. Also B's stage-2 step time with the
# three-target loss (wave 13 without it: 732.1 ms against the preset's 712.7). At once on 2 GPUs: upper bounds.
bench_cold() {  # name, GPU, cache folder, overrides...
    local name=$1 gpu=$2 cache=$3; shift 3
    phase "$name" 480 env CUDA_VISIBLE_DEVICES=$gpu $PY -m speedgpt bench $LATEST --train.compile_cache="$cache" "$@"
}
( bench_cold cold-a 0 "$W/cca" ) &
[ "$NG" -lt 2 ] && wait
bench_cold cold-b $G1 "$W/ccb" $R32
wait

# 2. Issue 34's lever for the host floor (docs/experiments.md "Wave 13": ~32-35 ms a micro-step whatever its tokens):
# CUDA graphs. On one GPU, at once: the gradient check (torch.compile's reduce-overhead against the default mode on
# 8 micro-steps of 1 x 16,384; exit 1 when its gradients differ), and the trainer's own steps with
# train.compile_mode=reduce-overhead against the default in rows of 1 x 32,768 (bench A then B in one process; A's
# kernels from cold-b's cache).
( phase cudagraphs 480 env CUDA_VISIBLE_DEVICES=0 $PY scripts/gpu_check_cudagraphs.py --preset speedrun-latest \
    --step 20 --rows 1 --seq-len 16384 --micro-steps 8 --steps 6 ) &
[ "$NG" -lt 2 ] && wait
phase ro1 600 env CUDA_VISIBLE_DEVICES=$G1 $PY -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" $R32 $RO
RO1=$?
wait

# 3. Issue 34: the same on every GPU (torchrun): the preset, then rows of 1 x 32,768 with and without CUDA graphs
# (without them only, if ro1 failed). Against cold-a / ro1's one-GPU figures: the 1 -> N scaling per stage of the
# GPU default and of each lever (wave 8, 4 GPUs: 3.52x; wave 11 on 2 GPUs: stage 0 129.4 ms with 8 host syncs since
# fixed).
if [ "$NG" -ge 2 ]; then
    phase multi-a 420 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/cca"
    if [ "$RO1" -eq 0 ]; then
        phase multi-b 600 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" $R32 $RO
    else
        phase multi-b 420 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/ccb" $R32
    fi
fi

# 4. Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree, the same call
# (spread: b064051's bench has no --per-stage), one GPU each, at once (waves 11 and 13 ran out of budget in it).
OLDER=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLDER/speedgpt/__main__.py
( phase plan-old 540 bash -c "cd $OLDER && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLDER $PY -m speedgpt bench \
    --preset speedrun-latest --steps 6 --data.train_files=$DATA" ) &
[ "$NG" -lt 2 ] && wait
phase plan-new 540 env CUDA_VISIBLE_DEVICES=$G1 $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files="$DATA" --train.compile_cache="$W/cca"
wait
true
