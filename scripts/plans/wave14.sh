# Wave 14 (issues 33, 34, 32): the next lease, best on 4 GPUs (~34 device-minutes with the start), in priority
# order; cut where the budget ends (the rest goes to docs/experiments.md's owed table). Run from the repository root
# of the device copy:
#   setsid scripts/lease.sh /tmp/w14 scripts/plans/wave14.sh > /tmp/w14.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w14/status` in calls of at most ~540 s and end each call with
# `scripts/lease.sh /tmp/w14 collect $OUT/w14.tgz`. The b064051 tree travels in .carry (git-ignored):
# `mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C .carry/tree-b064051`. Name .carry in `carry` on
# the FIRST call only (a re-copy removes the working directory of a phase running in it: wave 11).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
S32='[{share=0.33,batch_tokens=131072,seq_len=32768,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=32768,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=32768,max_doc_len=8192}]'
R32="--data.seq_len=32768 --train.stages=$S32"
# Issue 33: speedrun-latest cold, the preset against rows of 1 x 32,768 everywhere, each in a fresh process with a
# new compile cache folder (wave 13 compiled B after A in one process: no cold figure). Since c5e9143 B's stage 2
# takes zero MTP weights and stays in stage 0's graph: its start log should say "training: 1 graph(s)"; expected
# about one graph's compile (74-91 s of ~200 s) less. Also B's stage-2 step time with the three-target loss
# (wave 13 without it: 732.1 ms against the preset's 712.7). One GPU each, at once on a machine of 2 or more.
bench_cold() {  # name, GPU, cache folder, overrides...
    local name=$1 gpu=$2 cache=$3; shift 3
    phase "$name" 480 env CUDA_VISIBLE_DEVICES=$gpu $PY -m speedgpt bench --preset speedrun-latest --per-stage \
        --steps 6 --data.train_files="$DATA" --train.compile_cache="$cache" "$@"
}
# Issue 34's lever for the host floor, beside them on a third GPU: torch.compile's CUDA graphs (reduce-overhead) on
# micro-steps of 1 x 16,384 at stage 0 (wave 13: 283.6 ms a step in 8 of them). Does it run, are the gradients the
# same, how many ms a micro-step?
cudagraphs() {
    phase cudagraphs 480 env CUDA_VISIBLE_DEVICES=$1 $PY scripts/gpu_check_cudagraphs.py --preset speedrun-latest \
        --step 20 --rows 1 --seq-len 16384 --micro-steps 8 --steps 6
}
if [ "$NG" -ge 2 ]; then
    ( bench_cold cold-a 0 "$W/cca" ) &
    [ "$NG" -ge 3 ] && { cudagraphs 2 & }
    bench_cold cold-b 1 "$W/ccb" $R32
    wait
else
    bench_cold cold-a 0 "$W/cca"
    bench_cold cold-b 0 "$W/ccb" $R32
fi
# Issue 34: speedrun-latest's 1 -> 4 scaling by training time, the preset (wave 8: 3.52x; bar 3.85x) and in rows of
# 1 x 32,768 (stage 0 one row a rank on 4 GPUs: no eager mask build on a host-bound step, docs/experiments.md
# "Wave 13"). The one-GPU side: an A/B of the two (one wave of one run per GPU on 4 GPUs), also issue 33's loss check
# of B with its three-target stage 2.
[ "$NG" -ge 2 ] && phase rows-ab 900 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "$R32" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/rows-ab" $C
if [ "$NG" -ge 4 ]; then
    phase latest4-a 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latest4-a" \
        --train.seed=1337 --train.save_final_checkpoint=false --run.report=false $C
    phase latest4-b 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latest4-b" \
        --train.seed=1337 --train.save_final_checkpoint=false --run.report=false $C $R32
fi
# Issue 34: where the 4-GPU step of stage 0 waits, in both row shapes (the host floor of docs/experiments.md "Wave
# 13": GPU idle between a micro-step's kernels when the host launches slower than the GPU runs). Each rank's trace
# lands in $W/trace4-*: copy those to $OUT alone (collect leaves traces out); `python benchmarks/trace_report.py`
# reads them on any machine.
if [ "$NG" -ge 4 ]; then
    phase prof4-a 420 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 6 \
        --profile-trace "$W/trace4-a" --data.train_files="$DATA"
    phase prof4-b 420 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 6 \
        --profile-trace "$W/trace4-b" --data.train_files="$DATA" $R32
fi
# Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree, the same call
# (spread: b064051's bench has no --per-stage), one GPU each, at once (wave 13 ran out of budget before it).
OLDER=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLDER/speedgpt/__main__.py
G1=1; [ "$NG" -lt 2 ] && G1=0
( phase plan-old 540 bash -c "cd $OLDER && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLDER $PY -m speedgpt bench \
    --preset speedrun-latest --steps 6 --data.train_files=$DATA" ) &
[ "$NG" -lt 2 ] && wait
phase plan-new 540 env CUDA_VISIBLE_DEVICES=$G1 $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files="$DATA"
wait
[ "$NG" -lt 3 ] && cudagraphs 0
# Issue 32: the loader's K (8,192 open documents against 1,024), if the budget allows.
[ "$NG" -ge 2 ] && phase mixk 900 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=8192" \
    --seeds 2 --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C
true
