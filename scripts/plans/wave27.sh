# Wave 27 (issues 33, 32), one GPU (~8 device-minutes with the start for 1.-3., ~20 with 4.): the artifact file still
# travels after a warm run; then a longer cooldown for speedrun-latest.
# Wave 26 found a start warm from the artifact file saving less than it loaded (74 artifacts of 0.0 MiB over the
# 234 MiB file: the compiled graphs' artifacts gone from what a fresh machine starts from; the fix keeps the file
# when a run recorded nothing it lacks), and an A/B starting 71.7 s cold beside a run's artifacts that differed only
# in data.val_tokens and train.val_every (ca81eee keys the digest on validation's batch rows instead). Expected:
# 1. `cold`: speedrun-latest, 12 steps, cold in a new cache folder (the cold bar, <= 90 s, once more).
# 2. `warm-other-val`: the same config with another val_every and val_tokens (1,572,864: six rows, not one): the same
#    digest, a warm start (~7 s), and its save says "kept" (the file as 1. wrote it).
# 3. `fresh`: a new folder holding only the artifact file (another machine): nothing traced, the warm bar (<= 20 s).
# 4. `cooldown` (~12 min, issue 32): speedrun-latest with schedule.cooldown_frac 0.6 against its 0.45 (record #28's,
#    never A/B-tested here), 2 paired seeds by time to 0.8214, runs one after another, warm from 1.'s cache. Wave 25
#    and 26 reached the target at ~step 267 of 300, deep in the cooldown (it starts at step 165): an earlier decay may
#    reach it sooner. Wave 26's 260-step schedule did not (p = 0.949). Loader of both: the preset's (greedy, mix,
#    8,192 open documents, the stage table's caps).
#   mkdir -p /tmp/w27; setsid scripts/lease.sh /tmp/w27 scripts/plans/wave27.sh > /tmp/w27.log 2>&1 < /dev/null &
# then poll, and end with `scripts/lease.sh /tmp/w27 collect $OUT/w27.tgz`.
# With AB_FIRST=1 (scripts/plans/wave27b.sh) 4. runs first and 1. is left out: the A/B's first run is the cold start,
# and 2. validates otherwise than the A/B (every 6 steps on 262,144 tokens against every 25 on 1,572,864).
# With NO_AB=1 (scripts/plans/wave27a.sh) 4. is left out.
# Sourced by scripts/lease.sh ($W $PY $DATA $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
V="--preset speedrun-latest --train.steps=12 --data.train_files=$DATA --data.val_seq_len=262144"
V="$V --train.save_final_checkpoint=false --run.sample_tokens=0 --run.report=false"
VAL_ONE="--train.val_every=6 --data.val_tokens=262144"  # cold's and fresh's: one val batch
VAL_SIX="--train.val_every=4 --data.val_tokens=1572864"  # six rows: another digest's worth of validation before ca81eee
cooldown() {
    phase cooldown 1100 $PY -m speedgpt ab --preset speedrun-latest --a "" --b "--schedule.cooldown_frac=0.6" \
        --seeds 2 --target-loss 0.8214 --no-checkpoint --out "$W/runs/cooldown" $C --train.compile_cache="$W/cc"
}
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
if [ "${AB_FIRST:-0}" = 1 ]; then
    cooldown
    ls -l "$W"/cc/*/artifacts-* > "$W/logs/artifact-files-ab.txt" 2>&1
    WARM_VAL=$VAL_ONE
else
    phase cold 300 $PY -m speedgpt train $V $VAL_ONE --train.compile_cache="$W/cc" --run-dir "$W/runs/cold"
    WARM_VAL=$VAL_SIX
fi
phase warm-other-val 200 $PY -m speedgpt train $V $WARM_VAL --train.compile_cache="$W/cc" --run-dir "$W/runs/warm"
ls -l "$W"/cc/*/artifacts-* > "$W/logs/artifact-files.txt" 2>&1
artifacts_only "$W/cc" "$W/cc-fresh"
phase fresh 200 $PY -m speedgpt train $V $VAL_ONE --train.compile_cache="$W/cc-fresh" --run-dir "$W/runs/fresh"
[ "${AB_FIRST:-0}" = 1 ] || [ "${NO_AB:-0}" = 1 ] || cooldown
true
