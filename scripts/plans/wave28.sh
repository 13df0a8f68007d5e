# Wave 28 (issues 33, 32), one GPU, ~15 device-minutes with the start: an lr A/B whose B arm starts warm.
# Wave 27b's B arm (--schedule.cooldown_frac=0.6) compiled 55.8 s beside A's artifacts: the optimizer and the lr
# schedule were in the compile cache's digest though only the model is compiled. 30ab8cb takes them out.
# 1. `muon-lr` (~12 min, issue 32): speedrun-latest with optim.muon_lr 0.06 against its 0.05 (record #28's, never
#    A/B-tested here), 2 paired seeds by time to 0.8214, runs one after another, the first cold in a new cache folder
#    (the cold bar, <= 90 s, from a training run's start). Expected of the cache: B's first run loads A's artifact file
#    ("loaded 78 artifact(s)" under A's digest) and starts in ~8 s, not ~56 s. Waves 25 to 27b reached the target at
#    ~step 267 of 300 with 0.034 to spare at step 300: a larger Muon lr may reach it sooner (or overshoot: the screen
#    says which). Loader of both: the preset's (greedy, mix, 8,192 open documents, the stage table's caps).
# 2. `warm-adam-lr`: 12 steps with another Adam lr (--optim.embed_lr=0.01) from the same cache: again A's digest, 0
#    graphs compiled, the file kept as loaded.
#   mkdir -p /tmp/w28; setsid scripts/lease.sh /tmp/w28 scripts/plans/wave28.sh > /tmp/w28.log 2>&1 < /dev/null &
# then poll (each poll's call copies the tree anew; lease.sh runs the phases on its own copy of speedgpt since
# 899be5e), and end with `scripts/lease.sh /tmp/w28 collect $OUT/w28.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase muon-lr 1100 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--optim.muon_lr=0.06" \
    --seeds 2 --target-loss 0.8214 --no-checkpoint --out "$W/runs/muon-lr" $C --train.compile_cache="$W/cc"
ls -l "$W"/cc/*/artifacts-* > "$W/logs/artifact-files.txt" 2>&1
phase warm-adam-lr 200 $PY -m speedgpt train --preset speedrun-latest --train.steps=12 --data.train_files=$DATA \
    --data.val_seq_len=262144 --train.val_every=6 --data.val_tokens=262144 --train.save_final_checkpoint=false \
    --run.sample_tokens=0 --run.report=false --optim.embed_lr=0.01 --train.compile_cache="$W/cc" \
    --run-dir "$W/runs/warm-adam-lr"
true
