#!/usr/bin/env bash
# Wave 6's GPU runs (issues 34 and 33) in one 4-GPU lease (docs/experiments.md "Wave 6"): one background job
# that runs the phases below in order and notes each phase's exit status and seconds in OUT_DIR/status, so a
# lease can be polled by file and cut at any phase boundary. Usage, from the repository root on a 4-GPU machine:
#   setsid scripts/wave6.sh OUT_DIR > OUT_DIR.log 2>&1 < /dev/null &
#   scripts/wave6.sh OUT_DIR status [N]   # the phases so far and each phase log's last N lines
#   scripts/wave6.sh OUT_DIR collect TAR    # the logs, metrics and summaries (no checkpoints) into one tarball
# Phases (a phase whose line is already in OUT_DIR/status is skipped, so a second start goes on where it stopped):
#   data     the local Python corpus into $DATA (default /tmp/pyc)
#   dp4a     issue 34 (1): speedrun-124m (today's rows: mix, pieces <= 8,192) on 4 GPUs, seed 1337, 300 steps,
#            cold compile with train.compile_precompile (issue 33: does it work on a GPU?)
#   dp4b     the same, seed 1338, from a NEW compile cache holding only dp4a's artifact files: a fresh
#            machine's start with dynamo's traced code in the artifacts (issue 33's warm-start bar, 20 s)
#   bench4   the 4-GPU step time with a profile of NCCL's exposed time (the missing percent of 1 -> 4 scaling)
#   bench1   the same config's step time on one GPU of the machine (the 1 -> 4 ratio at the same global batch)
#   worker   issue 34 (4): rank 1 of a 4-GPU run exits mid-run under torchrun --max-restarts=1; resumed run
#            against an unkilled one
#   moe      issue 34 (3): moe-d12 at the setting that diverged at step 186 (131K tokens a step, 250 steps,
#            seed 1337) against its dense counterpart, 2 paired seeds, one ab wave
#   fsdp     issue 34 (2): dense-1b through FSDP2 on 4 GPUs against DDP (bench, MFU)
#   dcp      issue 34 (2): dense-1b DCP checkpoint written on 4 ranks, resumed on 2 and on 1
set -u
W=$(realpath -m "${1:?usage: scripts/wave6.sh OUT_DIR [collect TAR]}")
PY=${PY:-python3}
DATA=${DATA:-/tmp/pyc}
TARGET=${TARGET:-0.8214}  # speedrun-r28, seed 1337, 300 steps on this corpus (wave 4)
mkdir -p "$W/logs" "$W/runs"
if [ "${2:-}" = status ]; then  # the phases so far and the last lines of each phase's log
    cat "$W/progress" 2>/dev/null
    for f in "$W"/logs/*.log; do [ -e "$f" ] && { echo "== $f"; tail -n "${3:-6}" "$f" | cut -c1-400; }; done
    exit 0
fi
if [ "${2:-}" = collect ]; then  # small files only: checkpoints and compile caches stay behind
    tar -czf "${3:?collect needs a TAR path}" -C "$(dirname "$W")" --exclude='checkpoints' --exclude='*.pt' \
        --exclude='*.distcp' --exclude='cc*' --exclude='xdg' "$(basename "$W")"
    exit $?
fi
export XDG_CACHE_HOME="$W/xdg" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
TR="$PY -m torch.distributed.run --standalone --nproc_per_node=4"
C="--train.save_final_checkpoint=false --run.report=false --train.steps=300 --train.val_every=25 --data.train_files=$DATA --data.val_tokens=1572864 \
--data.val_seq_len=262144"
CC1="--train.compile_cache=$W/cc1"
PRE="--train.compile_precompile=true"

phase() {  # name, timeout seconds, command...: runs unless done, notes "name rc seconds" in status
    local name=$1 limit=$2; shift 2
    grep -q "^$name " "$W/status" 2>/dev/null && return 0
    local t0=$SECONDS
    echo "$(date +%T) start $name" >> "$W/progress"
    timeout --kill-after=20 "$limit" "$@" > "$W/logs/$name.log" 2>&1
    local rc=$?
    # a phase cut by its timeout can leave workers holding GPUs: the next phase must find them free
    [ $rc -ge 124 ] && { pkill -9 -f -- "-m speedgpt (train|bench)"; sleep 5; }
    echo "$name $rc $((SECONDS - t0))" >> "$W/status"
    echo "$(date +%T) end $name rc $rc $((SECONDS - t0)) s" >> "$W/progress"
    return $rc
}

artifacts_only() {  # copy the artifact files of cache folder $1 into a new cache folder $2 (a fresh machine)
    local f d
    for f in "$1"/*/artifacts-*; do
        [ -e "$f" ] || continue
        d="$2/$(basename "$(dirname "$f")")"
        mkdir -p "$d" && cp "$f" "$d/"
    done
}

# shellcheck disable=SC2086
{
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
phase dp4a 420 $TR -m speedgpt train --preset speedrun-124m --train.seed=1337 --run-dir "$W/runs/dp4-1337" \
    $C $CC1 $PRE \
    || { PRE=""; phase dp4a_noprecompile 420 $TR -m speedgpt train --preset speedrun-124m --train.seed=1337 \
             --run-dir "$W/runs/dp4-1337-noprecompile" $C $CC1; }
artifacts_only "$W/cc1" "$W/cc2"
phase dp4b 360 $TR -m speedgpt train --preset speedrun-124m --train.seed=1338 --run-dir "$W/runs/dp4-1338" \
    $C "--train.compile_cache=$W/cc2" $PRE
phase bench4 300 $TR -m speedgpt bench --preset speedrun-124m --steps 10 --profile 10 \
    --data.train_files="$DATA" $CC1
phase bench1 240 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-124m --steps 10 \
    --data.train_files="$DATA" $CC1
phase worker 480 $PY scripts/fault_suite.py --faults worker --each 1 --nproc 4 --backend nccl \
    --preset speedrun-124m --steps 30 --checkpoint-every 10 --workdir "$W/fs" --data.train_files="$DATA" \
    --data.val_tokens=1572864 --train.warmup_steps=0 $CC1
phase moe 600 $PY -m speedgpt ab --preset moe-d12 --a "--model.moe_experts=0" --b "" --seeds 2 --no-checkpoint \
    --train.steps=250 --train.batch_tokens=131072 --train.val_every=50 --target-loss a \
    --data.train_files="$DATA" --data.val_tokens=1572864 --out "$W/runs/ab-moe"
phase fsdp 480 $TR -m speedgpt bench --preset dense-1b --steps 4 --data.train_files="$DATA" \
    --data.val_tokens=1572864 --ab=--parallel.strategy=ddp
phase dcp 480 $PY scripts/dcp_reshard_check.py --nproc 4 --backend nccl --preset dense-1b --steps 6 --more 4 \
    --workdir "$W/dcp1b" --data.train_files="$DATA" --data.val_tokens=524288 --train.warmup_steps=0
}
echo "$(date +%T) all phases done" >> "$W/progress"
