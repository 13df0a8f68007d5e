#!/usr/bin/env bash
# Wave 5's GPU runs (issues 32 and 33) in one 4-GPU lease, one phase per call (docs/experiments.md "Wave 5"):
#   scripts/wave5.sh OUT_DIR mix       issue 32: why mix's validation rises at the end of speedrun-124m. Two arms that
#                                      each change one of the two suspects, 2 paired seeds, one `ab` wave:
#                                      A: 64 open documents (a file's pieces within ~4 steps, not ~45; pieces <= 2,048)
#                                      B: pieces <= 8,192 tokens (69 % of late tokens see a full window, not 15 %;
#                                         1,024 open documents). Wave 4 ran mix with 1,024 and 2,048 (same seeds).
#   scripts/wave5.sh OUT_DIR compile   issue 33: scripts/compile_bench.sh (cold, fresh-machine warm, block scope)
#   scripts/wave5.sh OUT_DIR latest NAME "ARM_A" "ARM_B"   issue 32: the same question on speedrun-latest, arms
#                                      chosen from the first phase's answer (docs/experiments.md says which ran)
# The corpus is built once into $DATA (default /tmp/pyc); the runs share one compile cache under OUT_DIR/xdg.
set -u
OUT=$(realpath -m "${1:?usage: scripts/wave5.sh OUT_DIR mix|latest|compile}")
PHASE=${2:?usage: scripts/wave5.sh OUT_DIR mix|latest|compile}
PY=${PY:-python3}
DATA=${DATA:-/tmp/pyc}
TARGET=${TARGET:-0.8214}  # speedrun-r28, seed 1337, 300 steps on this corpus (wave 4)
mkdir -p "$OUT/logs"
export XDG_CACHE_HOME="$OUT/xdg"
[ -d "$DATA" ] || $PY -m speedgpt data local-python --out "$DATA" --workers 32 > "$OUT/logs/data.log" 2>&1 \
    || { echo "corpus build failed: $OUT/logs/data.log"; exit 1; }
C="--no-checkpoint --train.steps=300 --train.val_every=25 --data.train_files=$DATA --data.val_tokens=1572864 \
--data.val_seq_len=262144"
MIX="--data.packing=greedy --data.long_docs=mix"

case $PHASE in
mix)
    # shellcheck disable=SC2086
    $PY -m speedgpt ab --preset speedrun-124m --a "$MIX --data.max_doc_len=2048 --data.mix_docs=64" \
        --b "$MIX --data.max_doc_len=8192" --seeds 2 --target-loss "$TARGET" --out "$OUT/runs/k64_vs_cap8192" $C ;;
latest)
    # shellcheck disable=SC2086
    $PY -m speedgpt ab --preset speedrun-latest --a "${4:?ARM_A}" --b "${5:?ARM_B}" --seeds 2 --target-loss "$TARGET" \
        --out "$OUT/runs/latest_${3:?NAME}" $C ;;
compile)
    DATA=$DATA PY=$PY STEPS=${STEPS:-6} scripts/compile_bench.sh "$OUT/cb" ;;
*)
    echo "unknown phase '$PHASE': use mix, latest or compile"; exit 2 ;;
esac
