# The next 4-GPU lease (issues 34, 32, 33), in priority order: about 48 device-minutes of phases against the
# session's 30, so cut it where the budget ends (the rest stays in docs/experiments.md's owed table). Run from the
# repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w12 scripts/plans/wave12.sh > /tmp/w12.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w12/status` in calls of at most ~540 s and end each call with
# `scripts/lease.sh /tmp/w12 collect $OUT/w12.tgz`. The old trees travel in .carry (git-ignored; the device copy
# has no .git): `for c in b064051 405e6b0; do mkdir -p .carry/tree-$c && git archive $c | tar -x -C .carry/tree-$c;
# done`. Name .carry in `carry` on the FIRST call only: the device tool copies a carried path anew on every call
# that names it, and a process working in the old copy loses its working directory (wave 11: Inductor's compile
# workers died, a cold compile fell to one process and ran past its limit).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# Issue 32's loader screen, K = 8,192 open documents against 1,024 (64 was worse, wave 5); its arm A, speedrun-latest
# as it is on one GPU (seeds 1337, 1338), is the one-GPU side of speedrun-latest's 1 -> 4 scaling below.
phase mixk 720 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C
# Issue 34: speedrun-latest's own 1 -> 4 scaling by training time (wave 8: 3.52x on 4 x H100), now with DistMuon
# batched, no Adam collective on the steps Adam waits (h34) and no host sync in the FP8 head (5253b29); issue 33:
# its 4-GPU start cold, then from the per-rank artifacts alone with AOTAutograd's cache (wave 9: 230.4 / 108.2 s).
for s in cold fresh; do
    [ $s = fresh ] && artifacts_only "$W/l4a" "$W/l4b"
    dir=$W/l4a; [ $s = fresh ] && dir=$W/l4b
    seed=1337; [ $s = fresh ] && seed=1338
    phase "latest4-$s" 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latest4-$s" \
        --train.seed=$seed --train.compile_cache="$dir" --train.save_final_checkpoint=false --run.report=false $C
done
# What the two step-path changes since 405e6b0 give: on 4 GPUs per stage (both: h34 and the sync fix), on one GPU
# (the sync fix alone: one rank has no Adam collective to skip). The old tree compiles cold. This tree's bench also
# prints host_syncs_per_step (f524266; expected 0) and, if any, where they come from.
OLD=$PWD/.carry/tree-405e6b0
phase bench4-old 540 bash -c "cd $OLD && PYTHONPATH=$OLD $TR -m speedgpt bench --preset speedrun-latest --per-stage \
    --steps 6 --data.train_files=$DATA"
phase bench4-new 420 $TR -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --data.train_files="$DATA"
# Issue 33 (fewer graphs): every stage in rows of 1 x 32,768 (4 / 8 / 12 micro-steps on one GPU, 1 / 2 / 3 on four)
# gives one training graph where the preset compiles two (stage 2's 1 x 49,152 recompiles: wave 11's 91 s of 216 s
# cold). Wave 9's 2 x 16,384 everywhere made stage 2 11 % slower; this keeps stage 2's rows long. B compiles cold, A
# is warm from mixk: read B's compile figures, and each stage's ms/step against A's.
S32='[{share=0.33,batch_tokens=131072,seq_len=32768,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=32768,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=32768,max_doc_len=8192}]'
phase rows32k 480 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 \
    --data.train_files="$DATA" --ab="--data.seq_len=32768 --train.stages=$S32"
phase bench1-old 480 bash -c "cd $OLD && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLD $PY -m speedgpt bench \
    --preset speedrun-latest --steps 6 --data.train_files=$DATA"
phase bench1-new 300 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files="$DATA"
# Issue 33 (5): the run-plan refactor's step time for speedrun-latest: b064051 against 405e6b0 (bench1-old: the last
# tree before the sync fix, which moves step time on its own), one GPU, the steps bench spreads over the schedule
# (b064051's bench has no --per-stage; timed_steps is the same in both).
OLDER=$PWD/.carry/tree-b064051
phase plan-old 480 bash -c "cd $OLDER && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLDER $PY -m speedgpt bench \
    --preset speedrun-latest --steps 6 --data.train_files=$DATA"
# Issue 34: stage 0 on 4 GPUs profiled, every rank's trace (copy $W/trace4 to $OUT alone: collect leaves traces out).
phase latest4-prof0 420 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 12 \
    --profile-trace "$W/trace4" --data.train_files="$DATA"
