# Wave 6 (2026-11-27, 4 x H100, issues 34 and 33), as run: `setsid scripts/lease.sh /tmp/w6 scripts/plans/wave6.sh`.
# docs/experiments.md "Wave 6" has the figures. Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
NOCKPT="--train.save_final_checkpoint=false --run.report=false"
CC1="--train.compile_cache=$W/cc1"
PRE="--train.compile_precompile=true"
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# issue 34 (1): speedrun-124m's rows (mix, pieces <= 8,192) on 4 GPUs; issue 33: precompile, cold
phase dp4a 420 $TR -m speedgpt train --preset speedrun-124m --train.seed=1337 --run-dir "$W/runs/dp4-1337" \
    $C $NOCKPT $CC1 $PRE \
    || { PRE=""; phase dp4a_noprecompile 420 $TR -m speedgpt train --preset speedrun-124m --train.seed=1337 \
             --run-dir "$W/runs/dp4-1337-noprecompile" $C $NOCKPT $CC1; }
# a fresh machine: a new cache holding only dp4a's artifact files
artifacts_only "$W/cc1" "$W/cc2"
phase dp4b 360 $TR -m speedgpt train --preset speedrun-124m --train.seed=1338 --run-dir "$W/runs/dp4-1338" \
    $C $NOCKPT "--train.compile_cache=$W/cc2" $PRE
# the 1 -> 4 ratio at the same global batch, and a profile of NCCL against compute
phase bench4 300 $TR -m speedgpt bench --preset speedrun-124m --steps 10 --profile 10 --data.train_files="$DATA" $CC1
phase bench1 240 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-124m --steps 10 \
    --data.train_files="$DATA" $CC1
# issue 34 (4): rank 1 exits mid-run under torchrun --max-restarts=1
phase worker 480 $PY scripts/fault_suite.py --faults worker --each 1 --nproc 4 --backend nccl \
    --preset speedrun-124m --steps 30 --checkpoint-every 10 --workdir "$W/fs" --data.train_files="$DATA" \
    --data.val_tokens=1572864 --train.warmup_steps=0 $CC1
# issue 34 (3): moe-d12 at the setting that diverged at step 186, against its dense counterpart
phase moe 600 $PY -m speedgpt ab --preset moe-d12 --a "--model.moe_experts=0" --b "" --seeds 2 --no-checkpoint \
    --train.steps=250 --train.batch_tokens=131072 --train.val_every=50 --target-loss a \
    --data.train_files="$DATA" --data.val_tokens=1572864 --out "$W/runs/ab-moe"
# issue 34 (2): dense-1b through FSDP2 against DDP, then DCP across 4 -> 2 -> 1 ranks
phase fsdp 480 $TR -m speedgpt bench --preset dense-1b --steps 4 --data.train_files="$DATA" \
    --data.val_tokens=1572864 --ab=--parallel.strategy=ddp
phase dcp 480 $PY scripts/dcp_reshard_check.py --nproc 4 --backend nccl --preset dense-1b --steps 6 --more 4 \
    --workdir "$W/dcp1b" --data.train_files="$DATA" --data.val_tokens=524288 --train.warmup_steps=0
