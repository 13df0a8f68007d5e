# Wave 13 (issues 33, 34, 32) on the widest machine lent: 2 GPUs (about 22 device-minutes with the start), 4 (the
# same phases in fewer waves, plus speedrun-latest on 4 GPUs) or 1 (benches first, the loss A/B two runs at a time).
# In priority order; cut where the budget ends (the rest goes to docs/experiments.md's owed table). Run from the
# repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w13 scripts/plans/wave13.sh > /tmp/w13.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w13/status` in calls of at most ~540 s and end each call with
# `scripts/lease.sh /tmp/w13 collect $OUT/w13.tgz`. The b064051 tree travels in .carry (git-ignored):
# `mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C .carry/tree-b064051`. Name .carry in `carry` on
# the FIRST call only (a re-copy removes the working directory of a phase running in it: wave 11).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# Issue 33 (fewer graphs), decided by time to target: every stage in rows of 1 x 32,768 (4 / 8 / 12 micro-steps
# on one GPU) is one training graph where the preset compiles two (stage 2's 1 x 49,152 recompiles: wave 11's 91 s
# of 216 s cold). Its rows hold pieces of the same lengths (<= 896, then <= 8,192); a row boundary cuts a piece
# every 32,768 tokens instead of every 16,384 (stages 0-1) or 49,152 (stage 2). Both arms compile cold in the first
# wave: each run's start line is its cold compile. On 4 GPUs the one wave is also the one-GPU side of issue 34's
# scaling (arm A, seeds 1337 / 1338).
S32='[{share=0.33,batch_tokens=131072,seq_len=32768,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=32768,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=32768,max_doc_len=8192}]'
if [ "$NG" -ge 2 ]; then
    phase rows32k 1000 $PY -m speedgpt ab --preset speedrun-latest --a "" \
        --b "--data.seq_len=32768 --train.stages=$S32" --seeds 2 --target-loss 0.8214 --no-checkpoint \
        --out "$W/runs/rows32k" $C
else  # one GPU: step time per stage first (A and B in one process), the loss A/B two runs at a time at the end
    phase rows32k-bench 600 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 \
        --data.train_files="$DATA" --ab="--data.seq_len=32768 --train.stages=$S32"
fi
# Issue 34 (4 GPUs only): speedrun-latest's own 1 -> 4 scaling by training time against arm A above, with DistMuon
# batched, no Adam collective on the steps Adam waits (h34) and no host sync in the FP8 head (5253b29); issue 33:
# its 4-GPU start cold into a new cache folder.
if [ "$NG" -ge 4 ]; then
    phase latest4-cold 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latest4-cold" \
        --train.seed=1337 --train.compile_cache="$W/l4a" --train.save_final_checkpoint=false --run.report=false $C
fi
# Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree, the same call
# (spread over the schedule: b064051's bench has no --per-stage), on two GPUs of the machine at once. Beside it on
# GPUs 2-3 (4-GPU machine) or after it: the 1 x 16,384 rows (one graph on 1-8 GPUs, where 1 x 32,768 fits 1-4)
# against the preset, per stage.
OLDER=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLDER/speedgpt/__main__.py
R16='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=16384,max_doc_len=8192}]'
rows16k() {  # the preset on GPU $1 and 1 x 16,384 everywhere on GPU $2, per stage, at once
    ( phase rows16k-a 400 env CUDA_VISIBLE_DEVICES=$1 $PY -m speedgpt bench --preset speedrun-latest --per-stage \
        --steps 6 --data.train_files="$DATA" ) &
    phase rows16k-b 400 env CUDA_VISIBLE_DEVICES=$2 $PY -m speedgpt bench --preset speedrun-latest --per-stage \
        --steps 6 --data.train_files="$DATA" --data.seq_len=16384 --train.stages="$R16"
    wait
}
if [ "$NG" -eq 1 ]; then
    phase rows16k-b 400 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 \
        --data.train_files="$DATA" --data.seq_len=16384 --train.stages="$R16"
    # two runs share the GPU's memory (the preset's peak: 69 GiB reserved): segments that grow, not a cache that
    # fragments
    phase rows32k 1000 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $PY -m speedgpt ab \
        --preset speedrun-latest --a "" --b "--data.seq_len=32768 --train.stages=$S32" --seeds 2 --concurrent 2 \
        --target-loss 0.8214 --no-checkpoint --out "$W/runs/rows32k" $C
    phase plan-old 540 bash -c "cd $OLDER && PYTHONPATH=$OLDER $PY -m speedgpt bench --preset speedrun-latest \
        --steps 6 --data.train_files=$DATA"
    phase plan-new 540 $PY -m speedgpt bench --preset speedrun-latest --steps 6 --data.train_files="$DATA"
    return 0
fi
[ "$NG" -ge 4 ] && { rows16k 2 3 & R16PID=$!; }
(
    phase plan-old 540 bash -c "cd $OLDER && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLDER $PY -m speedgpt bench \
        --preset speedrun-latest --steps 6 --data.train_files=$DATA"
) &
OLDPID=$!
phase plan-new 540 env CUDA_VISIBLE_DEVICES=1 $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files="$DATA"
wait $OLDPID
if [ "$NG" -ge 4 ]; then wait $R16PID; elif [ "$NG" -eq 2 ]; then rows16k 0 1; fi
# Issue 32: the loader's K (8,192 open documents against 1,024), if the budget allows.
phase mixk 900 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C
