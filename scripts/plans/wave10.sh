# The next 4-GPU lease (issues 34, 33), in priority order, about 33 device-minutes of work with the machine's start:
# cut it where the budget ends (the later phases stay in docs/experiments.md's owed table). Run from the repository
# root of the device copy:
#   setsid scripts/lease.sh /tmp/w10 scripts/plans/wave10.sh > /tmp/w10.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w10/status` in calls of at most ~540 s (a call cut by its limit collects nothing)
# and end each call with `scripts/lease.sh /tmp/w10 collect $OUT/w10.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# ShardedMuon (FSDP) on torch 2.11's DTensor after the Muon batching (07cad93, 9e76ac4): three eager steps of d12
# under fsdp on 4 GPUs; the CPU tests run torch 2.13, whose DTensor registers more multi-tensor ops (~1 min).
phase fsdp-smoke 240 $TR -m speedgpt train --preset d12 --parallel.strategy=fsdp --model.attn_backend=sdpa \
    --train.compile=false --train.steps=3 --train.val_every=0 --train.save_final_checkpoint=false \
    --run.report=false --run.sample_tokens=0 --data.train_files="$DATA" --run-dir "$W/runs/fsdp-smoke"
# Issue 34 (1), the scaling's missing percent. Wave 9's traces: on the late rank the host issued DistMuon's ~630
# launches slower than its GPU ran them (idle 13-17 ms in the optimizer's span), and the others waited for that
# rank's all-gathers. 61d24db..07cad93 batch a rank's matrices of one shape (704 operations a rank-step -> 320,
# benchmarks/dist_muon_ops.py). The 4-GPU bench of speedrun-124m with DistMuon per chunk (the tree before, 6e1e7a3)
# and batched (this tree), alternated twice: step_ms_mean and comm_wait_ms_by_rank of each. Both trees compile the
# same graphs (one Inductor cache).
# The device copy has no .git: both older trees travel in .carry (git-ignored), made here by
#   mkdir -p .carry/prev-6e1e7a3 && cp -r speedgpt pyproject.toml .carry/prev-6e1e7a3/ && for f in muon sharded_muon;
#   do git show 6e1e7a3:speedgpt/optim/$f.py > .carry/prev-6e1e7a3/speedgpt/optim/$f.py; done
#   mkdir -p .carry/tree-b064051 && git archive b064051 | tar -x -C .carry/tree-b064051
# and the call names .carry in carry.
PREV=$PWD/.carry/prev-6e1e7a3
phase prev-tree 30 test -f $PREV/speedgpt/optim/muon.py
B4="-m speedgpt bench --preset speedrun-124m --steps 30 --data.train_files=$DATA"
for round in 1 2; do
    phase "muon-chunk-$round" 300 bash -c "cd $PREV && PYTHONPATH=$PREV $TR $B4"
    phase "muon-batch-$round" 300 $TR $B4
done
# The scaling by training time on this machine (wave 8's measure: 3.848x / 3.847x), 300 steps of speedrun-124m,
# seeds 1337 and 1338: on 4 GPUs, then on one GPU each (the two at once, on GPUs 0 and 1).
for seed in 1337 1338; do
    phase "scale4-$seed" 300 $TR -m speedgpt train --preset speedrun-124m --run-dir "$W/runs/dp4-124m-$seed" \
        --train.seed=$seed --train.save_final_checkpoint=false --run.report=false $C
done
phase scale1 420 bash -c "
    for i in 0 1; do
        CUDA_VISIBLE_DEVICES=\$i $PY -m speedgpt train --preset speedrun-124m --run-dir '$W/runs/one-124m-'\$((1337 + i)) \
            --train.seed=\$((1337 + i)) --train.save_final_checkpoint=false --run.report=false $C \
            > '$W/logs/scale1-'\$i'.log' 2>&1 & pids+=(\$!)
    done
    rc=0; for p in \"\${pids[@]}\"; do wait \$p || rc=1; done; exit \$rc"
# Issue 33 (warm start <= 20 s), owed again: wave 9 ran it (acf-cold 138 s, acf-fresh 56 s of phase time) but its
# collect dropped the logs. speedrun-124m with AOTAutograd's cache allowed for the FP8 paths' custom autograd
# Functions, cold into a new cache, then a fresh machine's start from that cache's artifacts alone; its start log
# says "aot autograd cache N/M hits" and the compile seconds per phase.
ACF="env TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=1 CUDA_VISIBLE_DEVICES=0"
phase acf-cold 300 $ACF $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/acf1"
artifacts_only "$W/acf1" "$W/acf2"
phase acf-fresh 200 $ACF $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/acf2"
# Issue 32 (time to target): more open documents. speedrun-latest mixes pieces of 1,024 open documents (wave 5: more
# documents a step learned faster, 64 was worse; larger K never tried); 8,192 spreads a file's pieces over 8x the
# rows, nearer the fully shuffled pre-cut pieces that set the 0.27x on the old corpus. One run per GPU,
# cold compile of four latest runs at once (~4 min) + 300 steps (~2.7 min).
phase mixk 600 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C
# Issue 33 (5): the run-plan refactor's step time, b064051 against this tree, one GPU, same call.
OLD=$PWD/.carry/tree-b064051
phase old-tree 30 test -f $OLD/speedgpt/__main__.py
for preset in speedrun-124m speedrun-latest; do
    phase "plan-old-$preset" 400 bash -c "cd $OLD && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLD $PY -m speedgpt bench \
        --preset $preset --steps 10 --data.train_files=$DATA"
    phase "plan-new-$preset" 400 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset $preset --steps 10 \
        --data.train_files="$DATA"
done
