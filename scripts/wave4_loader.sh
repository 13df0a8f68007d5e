#!/usr/bin/env bash
# Wave 4's GPU runs (issues 32 and 33) in one lease: a queue of single-GPU training runs, one per GPU at a time,
# taken in priority order by whichever GPU is free, then each A/B's summary by `speedgpt ab` (which finds its
# runs finished and only reports). The runs are exactly the ones `speedgpt ab --dry-run` prints for each A/B.
#   scripts/wave4_loader.sh OUT_DIR        (from the repository root, on a machine with 4 GPUs)
#   scripts/wave4_loader.sh OUT_DIR summary   (once the queue is done: each A/B's paired figures, target = r28's
#                                              300-step validation loss)
# Writes OUT_DIR/runs/..., OUT_DIR/logs/*.log and OUT_DIR/summary.txt. Times: docs/experiments.md "Wave 4".
# (speedrun-124m's rows were record #28's then; since wave 5 its "as it is" arm needs
# --data.packing=record28 --data.long_docs=split --data.max_doc_len=0 to repeat this wave.)
set -u
OUT=$(realpath -m "${1:?usage: scripts/wave4_loader.sh OUT_DIR}")
PY=${PY:-python3}
NGPU=${NGPU:-4}
mkdir -p "$OUT/logs" "$OUT/runs/i32"
export XDG_CACHE_HOME="$OUT/xdg"  # train.compile_cache's default folder: every run of the wave shares it
DATA=${DATA:-/tmp/pyc}
[ -d "$DATA" ] || $PY -m speedgpt data local-python --out "$DATA" --workers 32 > "$OUT/logs/data.log" 2>&1 \
    || { echo "corpus build failed: $OUT/logs/data.log"; exit 1; }

C="--run.report=false --train.save_final_checkpoint=false --train.steps=300 --train.val_every=25 \
--data.train_files=$DATA --data.val_tokens=1572864 --data.val_seq_len=262144"
MIX124="--data.packing=greedy --data.long_docs=mix --data.max_doc_len=2048"
R=$OUT/runs/i32
if [ "${2:-}" = summary ]; then
    target=$($PY -c "import json, sys; print([r['val_loss'] for r in map(json.loads, open(sys.argv[1])) \
        if 'val_loss' in r][-1])" "$R/r28/seed1337/metrics.jsonl") || exit 1
    mkdir -p "$R/mix_vs_split"
    for s in 1337 1338; do ln -sfn "../mix_vs_crop/b-seed$s" "$R/mix_vs_split/b-seed$s"; done
    common="--seeds 2 --target-loss $target --no-checkpoint --train.steps=300 --train.val_every=25 \
--data.train_files=$DATA --data.val_tokens=1572864 --data.val_seq_len=262144"
    {
        echo "target $target (speedrun-r28, seed 1337, 300 steps)"
        # shellcheck disable=SC2086
        $PY -m speedgpt ab --preset speedrun-latest --a "--data.long_docs=crop" --b "--data.long_docs=mix" \
            --out "$R/mix_vs_crop" $common
        # shellcheck disable=SC2086
        $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.long_docs=mix" --out "$R/mix_vs_split" $common
        # shellcheck disable=SC2086
        $PY -m speedgpt ab --preset speedrun-124m --a "" --b "$MIX124" --out "$R/124m_mix" $common
    } 2>&1 | tee "$OUT/summary.txt"
    exit 0
fi

# name | overrides, in priority order (a/b as `speedgpt ab` names its arms)
cat > "$OUT/queue" <<EOF
$R/mix_vs_crop/b-seed1337|--preset speedrun-latest $C --data.long_docs=mix --train.seed=1337
$R/mix_vs_crop/b-seed1338|--preset speedrun-latest $C --data.long_docs=mix --train.seed=1338
$R/mix_vs_crop/a-seed1337|--preset speedrun-latest $C --data.long_docs=crop --train.seed=1337
$R/mix_vs_crop/a-seed1338|--preset speedrun-latest $C --data.long_docs=crop --train.seed=1338
$R/r28/seed1337|--preset speedrun-r28 $C --train.seed=1337
$R/mix_vs_split/a-seed1337|--preset speedrun-latest $C --train.seed=1337
$R/mix_vs_split/a-seed1338|--preset speedrun-latest $C --train.seed=1338
FRESH|--preset speedrun-latest $C --data.long_docs=mix --train.seed=1339
$R/124m_mix/b-seed1337|--preset speedrun-124m $C $MIX124 --train.seed=1337
$R/124m_mix/a-seed1337|--preset speedrun-124m $C --train.seed=1337
$R/124m_mix/a-seed1338|--preset speedrun-124m $C --train.seed=1338
$R/124m_mix/b-seed1338|--preset speedrun-124m $C $MIX124 --train.seed=1338
EOF

pop() {  # the queue's first line, removed under a lock
    flock "$OUT/queue" bash -c 'line=$(head -n1 "$0"); [ -n "$line" ] || exit 1; sed -i 1d "$0"; echo "$line"' \
        "$OUT/queue"
}

fresh_start() {  # a fresh machine's start: a new cache folder holding only the portable artifact files
    local gpu=$1 args=$2 xdg="$OUT/xdg-fresh" log="$OUT/logs/fresh_start.log"
    for f in "$OUT"/xdg/speedgpt/compile/*/artifacts-*; do
        [ -e "$f" ] && mkdir -p "$xdg/speedgpt/compile/$(basename "$(dirname "$f")")" \
            && cp "$f" "$xdg/speedgpt/compile/$(basename "$(dirname "$f")")/"
    done
    # shellcheck disable=SC2086
    XDG_CACHE_HOME=$xdg CUDA_VISIBLE_DEVICES=$gpu $PY -m speedgpt train $args --run-dir "$OUT/runs/fresh" \
        > "$log" 2>&1 &
    local pid=$!
    # the compile figure is all this run is for: stop it once the first validation after the warmup is done
    until grep -q "compile + warmup" "$log" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 5; done
    sleep 40
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
}

worker() {
    local gpu=$1 line name args
    while line=$(pop); do
        name=${line%%|*} args=${line#*|}
        echo "$(date +%T) gpu$gpu start $name" >> "$OUT/logs/queue.log"
        if [ "$name" = FRESH ]; then
            fresh_start "$gpu" "$args"
        else
            mkdir -p "$(dirname "$name")"
            # shellcheck disable=SC2086
            CUDA_VISIBLE_DEVICES=$gpu $PY -m speedgpt train $args --run-dir "$name" \
                > "$OUT/logs/$(basename "$(dirname "$name")")_$(basename "$name").log" 2>&1
        fi
        echo "$(date +%T) gpu$gpu done $name ($?)" >> "$OUT/logs/queue.log"
    done
}

for g in $(seq 0 $((NGPU - 1))); do worker "$g" & sleep 2; done
wait
echo "$(date +%T) all done" >> "$OUT/logs/queue.log"
