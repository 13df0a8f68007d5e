# Wave 16 (issues 34, 33, 32): the next lease, best on 4 GPUs (~30 device-minutes with the start), adapts to 2 and 1;
# in priority order, cut where the budget ends (the rest goes to docs/experiments.md's owed table). Run from the
# repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w16 scripts/plans/wave16.sh > /tmp/w16.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w16/status` in calls of at most ~540 s, one right after another (the machine goes
# back after 30 s idle: wave 15 lost its first machine, and the phases on it, to a gap), and end each call with
# `scripts/lease.sh /tmp/w16 collect $OUT/w16.tgz`. No tree travels in .carry since wave 18 ran its run-plan pair.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
gpu() { echo $(( $1 < NG ? $1 : 0 )); }  # GPU k where there is one, else GPU 0
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# First: the fused flex kernels against a dense reference, the masks built outside and inside the compiled graph (on 4
# GPUs nothing of it has run since the in-graph check was added on 2026-12-06), ~1 minute.
phase gpucheck-flex 240 $PY scripts/gpu_check.py flex
# Since wave 15 the preset trains in rows of 1 x 32,768 in every stage; $OLD gives back its earlier rows (2 x 16,384
# in stages 0-1, 1 x 49,152 in stage 2) for the comparisons below.
S_OLD='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=49152,max_doc_len=8192}]'
OLD="--data.seq_len=49152 --train.stages=$S_OLD"
RO="--train.compile_mode=reduce-overhead"
LATEST="--preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"

# 1. One GPU each, cold, at once (issue 33's cold figures; the one-GPU side of 2.): the earlier rows; the preset
# (rows of 1 x 32,768; wave 15: 2 graphs, 163.6 s against 275.2 s, at once on 2 GPUs); the preset with CUDA graphs
# against without in one process (wave 15: +0.65 % on one GPU, +0.7 % on two).
one() {  # name, GPU, cache folder, overrides...
    local name=$1 g; g=$(gpu "$2"); local cache=$3; shift 3
    phase "$name" 540 env CUDA_VISIBLE_DEVICES=$g $PY -m speedgpt bench $LATEST --train.compile_cache="$cache" "$@"
}
# Beside them on a fourth GPU (after them on fewer): the CUDA-graph gradient check in the trainer's pattern (a mark
# before each micro-step, the gradients copied out after the first backward; wave 15 checked one mark a step).
cudagraphs() {
    phase cudagraphs 480 env CUDA_VISIBLE_DEVICES=$(gpu 3) $PY scripts/gpu_check_cudagraphs.py \
        --preset speedrun-latest --step 20 --rows 1 --seq-len 16384 --micro-steps 8 --steps 6
}
( one cold-a 0 "$W/cca" $OLD ) &
[ "$NG" -lt 2 ] && wait
( one cold-b 1 "$W/ccb" ) &
[ "$NG" -lt 3 ] && wait
[ "$NG" -ge 4 ] && { cudagraphs & }
one cold-ro 2 "$W/ccr" --ab=$RO
wait
[ "$NG" -lt 4 ] && cudagraphs

# 2. Issue 34: the same benches on every GPU (torchrun), caches warm from 1.: the 1 -> N scaling per stage of the
# earlier rows, of the preset and of CUDA graphs (wave 15 on 2 GPUs: rows of 32,768 1.96x by the run mean; wave 8 on
# 4: the earlier rows 3.52x).
if [ "$NG" -ge 2 ]; then
    phase multi-a 420 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/cca" $OLD
    phase multi-b 600 $TR -m speedgpt bench $LATEST --train.compile_cache="$W/ccr" --ab=$RO
fi

# 3. CUDA graphs in whole runs (validation, warmup reset, the optimizers on GPUs): the preset without and with
# them, 2 paired seeds, one run per GPU. The math is the same (wave 15's gradient check: 0 difference), so the
# losses should agree to rounding; time to 0.8214 by training time on a 4-GPU machine (one run per GPU).
[ "$NG" -ge 2 ] && phase ro-ab 900 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "$RO" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/ro-ab" $C --train.compile_cache="$W/ccr"

# 4. Issue 34 (1): the mini speedrun on every GPU by training time, seed 1337, as the preset (3.'s arm A is its
# one-GPU side on the same machine) and in the earlier rows (wave 8's 3.52x).
if [ "$NG" -ge 2 ]; then
    phase latestN-b 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latestN-b" \
        --train.seed=1337 --train.save_final_checkpoint=false --run.report=false $C --train.compile_cache="$W/ccb"
    phase latestN-a 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latestN-a" \
        --train.seed=1337 --train.save_final_checkpoint=false --run.report=false $C --train.compile_cache="$W/cca" $OLD
fi

# 5. (Issue 33's run-plan pair for speedrun-latest ran in wave 18 on one H100, scripts/plans/wave18.sh.)

# 6. Issue 32: the loader's K (32,768 open documents against the preset's 8,192), if the budget allows.
[ "$NG" -ge 2 ] && phase mixk 900 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=32768" \
    --seeds 2 --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C --train.compile_cache="$W/ccb"
true
