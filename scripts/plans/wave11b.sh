# Wave 11 on two GPUs (issues 32, 33, 34), for a session that is lent no 4-GPU kind: about 25 device-minutes with
# the machine's start, in priority order; cut where the budget ends (the rest stays in docs/experiments.md's owed
# table, and wave11.sh keeps the 4-GPU phases). Run from the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w11 scripts/plans/wave11b.sh > /tmp/w11.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w11/status` in calls of at most ~540 s and end each call with
# `scripts/lease.sh /tmp/w11 collect $OUT/w11.tgz`. The b064051 tree travels in .carry (git-ignored):
# `mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C .carry/tree-b064051`; the call names .carry.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# Issue 32: can any loader reach 0.27x of speedrun-r28's time on the deduplicated corpus? The bar was set on the
# old corpus (duplicates across train and val) by an arm of short shuffled pieces. The same machine's Python files
# cut into pieces of ~1,000 characters (about 450-900 tokens) and shuffled before tokenizing, each file on the same
# side of the split as in $DATA (405e6b0), scored on $DATA's val files: the ceiling of "many documents a row".
PIECES=${DATA}_pieces
phase data-pieces 300 $PY -m speedgpt data local-python --out "$PIECES" --piece-chars 1000 --workers 32
phase pieces 900 $PY -m speedgpt ab --preset speedrun-latest --a "" \
    --b "--data.train_files=$PIECES --data.val_files=$DATA" --seeds 2 --target-loss 0.8214 --no-checkpoint \
    --out "$W/runs/pieces" $C
# Issue 33 (5): the run-plan refactor's step time for speedrun-latest, b064051 against this tree, GPU 0, one after
# the other (speedrun-124m's pair: wave 10, +0.42 %). Beside the old tree's cold compile, GPU 1 checks the
# AOTAutograd default on torch 2.11 (speedrun-124m cold into a new folder, then a fresh machine from its artifacts
# alone: "aot autograd cache 2/2 hits"); it ends before the old tree's timed steps begin (compile ~4-5 min).
OLD=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLD/speedgpt/__main__.py
(
    phase acf-cold 300 env CUDA_VISIBLE_DEVICES=1 $PY -m speedgpt bench --preset speedrun-124m --steps 6 \
        --data.train_files="$DATA" --train.compile_cache="$W/acf1"
    artifacts_only "$W/acf1" "$W/acf2"
    phase acf-fresh 200 env CUDA_VISIBLE_DEVICES=1 $PY -m speedgpt bench --preset speedrun-124m --steps 6 \
        --data.train_files="$DATA" --train.compile_cache="$W/acf2"
) &
ACF=$!
phase plan-old-speedrun-latest 480 bash -c "cd $OLD && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLD $PY -m speedgpt bench \
    --preset speedrun-latest --per-stage --steps 6 --data.train_files=$DATA"
wait $ACF
phase plan-new-speedrun-latest 420 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest \
    --per-stage --steps 6 --data.train_files="$DATA"
# Issue 34: where speedrun-latest's data-parallel step loses its time (wave 8 on 4 GPUs: 3.52x, stage 0's steps
# 87-94 ms against 260 / 4 on one). On two GPUs per stage against plan-new (one GPU), then stage 0 profiled with
# every rank's trace (the embeddings' 464M Adam parameters reduced at the end of each backward).
phase latest2-bench 480 $TR -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 \
    --data.train_files="$DATA"
phase latest2-prof0 300 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 12 \
    --profile-trace "$W/trace2" --data.train_files="$DATA"
