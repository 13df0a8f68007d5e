# The next 4-GPU lease (issues 33, 32), in priority order, about 30 device-minutes with the machine's start: cut it
# where the budget ends (the later phases stay in docs/experiments.md's owed table). Run from the repository root of
# the device copy:
# SUPERSEDED by wave12.sh (wave 11 ran on two GPUs: wave11b.sh, wave11c.sh).
#   setsid scripts/lease.sh /tmp/w11 scripts/plans/wave11.sh > /tmp/w11.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w11/status` in calls of at most ~540 s (a call cut by its limit collects nothing)
# and end each call with `scripts/lease.sh /tmp/w11 collect $OUT/w11.tgz`. The b064051 tree travels in .carry
# (git-ignored; the device copy has no .git): `mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C
# .carry/tree-b064051`, and the call names .carry in carry.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# Issue 33, warm start: AOTAutograd's cache now on by default for the FP8 Functions (the compile cache turns it on,
# keyed on their source). Wave 10 measured it by env var (aot 15.3 -> 1.7 s): this checks the default on torch 2.11,
# cold into a new folder, then a fresh machine's start from its artifacts alone ("aot autograd cache 2/2 hits").
phase acf-cold 300 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-124m --steps 6 \
    --data.train_files="$DATA" --train.compile_cache="$W/acf1"
artifacts_only "$W/acf1" "$W/acf2"
phase acf-fresh 200 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-124m --steps 6 \
    --data.train_files="$DATA" --train.compile_cache="$W/acf2"
# Issue 32 (time to target): more open documents. speedrun-latest mixes pieces of 1,024 open documents (wave 5: more
# documents a step learned faster, 64 was worse; larger K never tried); 8,192 spreads a file's pieces over 8x the
# rows, nearer the fully shuffled pre-cut pieces that set the 0.27x on the old corpus. One run per GPU,
# cold compile of four latest runs at once (~4 min) + 300 steps (~2.7 min).
phase mixk 600 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C
# Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree, one GPU, same
# lease (speedrun-124m's pair: wave 10, +0.42 %).
OLD=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLD/speedgpt/__main__.py
phase plan-old-speedrun-latest 420 bash -c "cd $OLD && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLD $PY -m speedgpt bench \
    --preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
phase plan-new-speedrun-latest 420 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest \
    --per-stage --steps 6 --data.train_files="$DATA"
# Issue 33, the 4-GPU start of the default with AOTAutograd's cache: cold, then from the per-rank artifacts alone
# (wave 9: 230.4 s cold, 108.2 s from the artifacts with AOTAutograd 40 s; the bar is 120 s cold). Their training
# time against mixk's arm A (the same preset and $C on one GPU, seeds 1337 / 1338) is speedrun-latest's own 1 -> 4
# scaling on this machine (issue 34; wave 8: 3.52x).
for s in cold fresh; do
    [ $s = fresh ] && artifacts_only "$W/l4a" "$W/l4b"
    dir=$W/l4a; [ $s = fresh ] && dir=$W/l4b
    seed=1337; [ $s = fresh ] && seed=1338
    phase "latest4-$s" 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/latest4-$s" \
        --train.seed=$seed --train.compile_cache="$dir" --train.save_final_checkpoint=false --run.report=false $C
done
# Issue 34: speedrun-latest's own 1 -> 4 scaling (wave 8, per-chunk DistMuon: 3.52x by training time, its first
# stage's steps 87-94 ms on 4 GPUs against 260 on one). Per stage on 4 GPUs, on the cache the runs above filled;
# set against plan-new-speedrun-latest (one GPU, per stage) for the scaling of each stage.
phase latest4-bench 420 $TR -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 \
    --data.train_files="$DATA" --train.compile_cache="$W/l4a"
# Where stage 0's 4-GPU step loses its time (131,072 tokens: 32,768 a rank; 546M parameters, 400M of them embeddings
# whose gradients are reduce-scattered whole every step): the costliest ops and the collectives' overlap, steps at 20.
phase latest4-prof0 420 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 12 \
    --data.train_files="$DATA" --train.compile_cache="$W/l4a"
