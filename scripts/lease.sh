#!/usr/bin/env bash
# One GPU lease as one background job of phases (docs/experiments.md, "GPU work still owed"): a plan file names the
# phases, each runs under a timeout, and its exit status and seconds go to OUT_DIR/status, so a lease is polled by
# file (never by `pgrep -f` / `pkill -f` with a pattern the polling command itself contains) and can be cut at any
# phase boundary. A phase already in OUT_DIR/status is skipped: a second start goes on where the first stopped.
# Usage, from the repository root on the GPU machine:
#   setsid scripts/lease.sh OUT_DIR PLAN > OUT_DIR.log 2>&1 < /dev/null &   # PLAN: e.g. scripts/plans/wave7.sh
#   scripts/lease.sh OUT_DIR status [N]     # the phases so far and each phase log's last N lines
#   scripts/lease.sh OUT_DIR collect TAR    # logs, metrics and summaries (no checkpoints or caches) in one tarball
#     (compile caches, compile_bench.sh's cache-* folders and bench's profile traces would pass the device tool's
#     size limit: copy a trace to $OUT alone)
# A tree the plan reads from .carry (git-ignored) travels in the first call's `carry` only: the device tool copies a
# carried path anew on every call that names it, and a phase working in the old copy loses its working directory
# (wave 11: Inductor's compile workers died with it).
# A plan is a bash file sourced here: it calls `phase NAME TIMEOUT_S COMMAND...` in order and may use $W (OUT_DIR),
# $PY, $DATA (the local corpus, built by the plan's first phase), $TR (torchrun on every GPU) and $C (the 300-step
# training arguments of the A/B rows).
set -u
W=$(realpath -m "${1:?usage: scripts/lease.sh OUT_DIR PLAN|status|collect}")
MODE=${2:?usage: scripts/lease.sh OUT_DIR PLAN|status|collect}
mkdir -p "$W/logs" "$W/runs"
if [ "$MODE" = status ]; then
    cat "$W/progress" 2>/dev/null
    for f in "$W"/logs/*.log; do [ -e "$f" ] && { echo "== $f"; tail -n "${3:-6}" "$f" | cut -c1-400; }; done
    exit 0
fi
if [ "$MODE" = collect ]; then
    # Caches by where plans put them, anchored at OUT_DIR's top (an unanchored 'acf*' dropped wave 9's
    # logs/acf-*.log with its acf1/ cache); heavy file kinds anywhere.
    B=$(basename "$W")
    TAR=${3:?collect needs a TAR path}
    tar -czf "$TAR" -C "$(dirname "$W")" --exclude='checkpoints' --exclude='*.pt' --exclude='*.distcp' \
        --exclude='*.bin' --exclude='profile-*.json.gz' \
        --anchored --exclude="$B/xdg" --exclude="$B/src" --exclude="$B/cc*" --exclude="$B/acf*" \
        --exclude="$B/cb*/cache-*" "$B" \
        || exit $?
    # The device tool brings back files up to its size limit (16 MiB): name what made one too big.
    if [ "$(stat -c %s "$TAR")" -gt $((15 * 2**20)) ]; then
        echo "lease.sh collect: $TAR is $(du -h "$TAR" | cut -f1), past what the device tool brings back;" \
            "the largest folders under $W:"
        du -x --max-depth=2 "$W" 2>/dev/null | sort -rn | head -6
    fi
    exit 0
fi
[ -f "$MODE" ] || { echo "lease.sh: no plan file '$MODE' (see scripts/plans/)"; exit 2; }
PY=${PY:-python3}
DATA=${DATA:-/tmp/pyc}
# The device tool copies the working tree anew on every call, a poll's too: a run importing speedgpt at that moment
# found the package half-copied (wave 27b: "cannot import name 'preset_names' from 'speedgpt.config' (unknown
# location)", an A/B arm lost). The phases import the lease's own copy of the package, made once at its start
# (PYTHONSAFEPATH: `python -m` puts the working directory, the live tree, before PYTHONPATH otherwise; scripts that
# put the repository on sys.path themselves, the gpu_check*.py, still read the live tree).
rm -rf "$W/src" && mkdir -p "$W/src" && cp -r speedgpt "$W/src/" \
    || { echo "lease.sh: cannot copy speedgpt/ to $W/src"; exit 2; }
export XDG_CACHE_HOME="$W/xdg" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 PYTHONSAFEPATH=1 PYTHONPATH="$W/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
TR="$PY -m torch.distributed.run --standalone --nproc_per_node=$(nvidia-smi -L 2>/dev/null | wc -l)"
# `train` takes --train.save_final_checkpoint=false; --no-checkpoint is ab's own flag
C="--train.steps=300 --train.val_every=25 --data.train_files=$DATA --data.val_tokens=1572864 --data.val_seq_len=262144"

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

# shellcheck source=scripts/lib/artifacts.sh
source "$(dirname "$0")/lib/artifacts.sh"  # artifacts_only, for the plans

# shellcheck disable=SC1090
source "$MODE"
echo "$(date +%T) all phases done" >> "$W/progress"
