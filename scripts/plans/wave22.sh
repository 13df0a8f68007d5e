# Wave 22 (issue 32, deliverable 4: "K by a screen"), one GPU: speedrun-latest with 8,192 open documents in the mixing
# loader against the preset's 1,024, 2 paired seeds, one run after another on the one GPU (so each run's clock is a
# speed figure: no --concurrent), 300 steps, target 0.8214 (speedrun-r28's loss on this corpus). ~20 device-minutes
# with the start; nothing in .carry. First, each alone on the machine, issue 33's two one-GPU cold starts on main's
# defaults (a third machine's figures for the bars: speedrun-latest <= 90 s, speedrun-124m <= 60 s); the A/B's runs
# then start from speedrun-latest's cache.
#   setsid scripts/lease.sh /tmp/w22 scripts/plans/wave22.sh > /tmp/w22.log 2>&1 < /dev/null &
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase cold-124 420 $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/cc124"
phase cold-latest 420 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/cc"
phase mixk 1700 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--data.mix_docs=8192" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint --out "$W/runs/mixk" $C --train.compile_cache="$W/cc"
true
