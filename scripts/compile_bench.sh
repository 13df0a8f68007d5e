#!/usr/bin/env bash
# Issue 33's GPU figures in one call (docs/benchmarks.md "Compile time"): per preset, on a GPU of its own and
# all presets at once, three `speedgpt bench` processes one after another:
#   cold  - an empty compile cache (compile + warmup s, graphs, recompiles, step time, the compile's phases),
#   warm  - a fresh machine's start: a NEW cache folder holding only the artifact files the cold run saved
#           (train.compile_cache: load_cache_artifacts fills the empty Inductor/Triton caches),
#   block - cold again with train.compile_scope=block (identical blocks share compiled code).
# Then one table. Usage, from the repository root on a machine with >= 2 GPUs (4 for the block column):
#   DATA=/path/to/fineweb10B scripts/compile_bench.sh [OUT_DIR]
# DATA: the training shards (data.train_files); empty: the local Python corpus, built into OUT_DIR first (~15 s).
# STEPS (default 10): timed steps per bench. PRESETS (default "speedrun-latest speedrun-124m").
# EXTRA: overrides added to the cold and warm runs, e.g. EXTRA=--train.compile_precompile=true (dynamo's traced
# code in the artifacts too: the warm column is then a start that traces nothing); use a new OUT_DIR.
set -u
OUT=${1:-${OUT:-compile-bench}}
STEPS=${STEPS:-10}
PRESETS=${PRESETS:-"speedrun-latest speedrun-124m"}
PY=${PY:-python}
mkdir -p "$OUT"
if [ -z "${DATA:-}" ]; then  # built once here: parallel benches must not build one corpus folder together
    DATA="$OUT/pyc"
    [ -d "$DATA" ] || $PY -m speedgpt data local-python --out "$DATA" --workers 16 > "$OUT/data.txt" 2>&1 \
        || { echo "building the local corpus failed: see $OUT/data.txt"; exit 1; }
fi
data=("--data.train_files=$DATA")
# shellcheck source=scripts/lib/artifacts.sh
source "$(dirname "$0")/lib/artifacts.sh"  # artifacts_only
ngpu=$(nvidia-smi -L | wc -l)

one() {  # preset, gpu, label, cache folder, extra overrides...
    local preset=$1 gpu=$2 label=$3 cache=$4; shift 4
    CUDA_VISIBLE_DEVICES=$gpu $PY -m speedgpt bench --preset "$preset" --steps "$STEPS" "${data[@]}" \
        "--train.compile_cache=$cache" "$@" > "$OUT/$preset.$label.txt" 2>&1 \
        || echo "$preset $label: exit $? (see $OUT/$preset.$label.txt)"
}

i=0
for preset in $PRESETS; do
    (
        # shellcheck disable=SC2086
        one "$preset" "$i" cold "$OUT/cache-$preset-cold" ${EXTRA:-}
        # a fresh machine: only the portable artifact files travel, into an otherwise empty cache folder
        artifacts_only "$OUT/cache-$preset-cold" "$OUT/cache-$preset-warm"
        # per stage where the preset has a table: stage 1's step time with its MTP weights padded to 3
        stages=(); [ "$preset" = speedrun-latest ] && stages=(--per-stage)
        # shellcheck disable=SC2086
        one "$preset" "$i" warm "$OUT/cache-$preset-warm" "${stages[@]}" ${EXTRA:-}
    ) &
    i=$((i + 1))
done
if [ "$ngpu" -ge 4 ]; then  # compile_scope=block, cold, on the GPUs left
    g=2
    for preset in $PRESETS; do
        # SPEEDGPT_DEBUG=1: a failure keeps its traceback in the output file (issue 33's block run lost it)
        [ "$g" -lt "$ngpu" ] && SPEEDGPT_DEBUG=1 one "$preset" "$g" block "$OUT/cache-$preset-block" \
            --train.compile_scope=block &
        g=$((g + 1))
    done
fi
wait

field() { awk -v k="$1" '$1 == k {print $2}' "$2" 2>/dev/null; }
printf '%-16s %-6s %12s %7s %10s %12s %10s\n' preset run compile+warm graphs recompiles step_ms tok/s
for preset in $PRESETS; do
    for label in cold warm block; do
        f="$OUT/$preset.$label.txt"
        [ -f "$f" ] || continue
        printf '%-16s %-6s %12s %7s %10s %12s %10s\n' "$preset" "$label" "$(field compile_warmup_s "$f")" \
            "$(field compile_graphs "$f")" "$(field compile_recompiles "$f")" "$(field step_ms_mean "$f")" \
            "$(field tok_per_s "$f")"
    done
done
# where each run's compile seconds went (train/compile_breakdown.py; "-": torch does not expose that phase)
printf '\n%-16s %-6s' preset run
printf ' %9s' compile_s trace aot inductor kernels autotune 1st-call fx-cache aot-cache
printf '\n'
for preset in $PRESETS; do
    for label in cold warm block; do
        f="$OUT/$preset.$label.txt"
        [ -f "$f" ] || continue
        printf '%-16s %-6s' "$preset" "$label"
        for k in compile_s trace_s aot_s inductor_s kernels_s autotune_s first_call_autotune_s fx_cache_hits \
                 aot_cache_hits; do
            v=$(field "compile_$k" "$f")
            printf ' %9s' "${v:--}"
        done
        printf '\n'
    done
done
grep -h "^preset " "$OUT"/*.cold.txt 2>/dev/null | head -1  # the commit
grep -h -A8 "per stage" "$OUT"/*.warm.txt 2>/dev/null  # speedrun-latest's stages (warm run)
