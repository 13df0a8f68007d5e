# The next 4-GPU lease (issues 34, 33), in priority order, about 30 device-minutes of work (machine start included):
# cut it where the budget ends (the later phases stay in docs/experiments.md's owed table). Run from the repository
# root of the device copy:
#   setsid scripts/lease.sh /tmp/w9 scripts/plans/wave9.sh > /tmp/w9.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w9/status` in calls of at most ~540 s (a call cut by its limit collects nothing)
# and end each call with `scripts/lease.sh /tmp/w9 collect $OUT/w9.tgz` (the profile traces are left out of it:
# `tar -czf $OUT/traces.tgz -C /tmp/w9 trace-0123 trace-1230` once the order phases are done, ~12 MiB).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase, artifacts_only).
# shellcheck shell=bash disable=SC2086,SC2154
# issue 34 (1): which rank keeps the others waiting, and why (a GPU or a host process: not its rows), with every
# rank's profile trace (~8 min)
# shellcheck source=scripts/plans/straggler.sh
source scripts/plans/straggler.sh
# issue 33 (warm start <= 20 s): a warm start's AOTAutograd misses every training graph (wave 8: 124m compiles
# 24-29 s warm, 13-17 s of it AOTAutograd) because the FP8 paths' custom autograd Functions keep its cache off.
# Allowed: speedrun-124m cold into a new cache, then a fresh machine's start from that cache's artifacts alone
# (the figure for the bar); its start log says "aot autograd cache N/M hits".
ACF="env TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=1 CUDA_VISIBLE_DEVICES=0"
phase acf-cold 300 $ACF $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/acf1"
artifacts_only "$W/acf1" "$W/acf2"
phase acf-fresh 200 $ACF $PY -m speedgpt bench --preset speedrun-124m --steps 6 --data.train_files="$DATA" \
    --train.compile_cache="$W/acf2"
# issues 33 and 34: speedrun-latest on 4 GPUs, cold into a new cache (bar <= 120 s), then a fresh machine's start
# from that cache's artifacts alone, every rank its own file since 3a151cc (wave 8: rank 0 warm, ranks 1-3 cold:
# 151 s), seed 1338: the second seed of issue 34's row (wave 8, seed 1337: 44.5 s, 0.8214 in 40.1 s).
phase latest4-cold 600 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/dp4-latest-1337" \
    --train.compile_cache="$W/cc4a" --train.save_final_checkpoint=false --run.report=false $C
artifacts_only "$W/cc4a" "$W/cc4b"
phase latest4-fresh 420 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/dp4-latest-1338" \
    --train.seed=1338 --train.compile_cache="$W/cc4b" --train.save_final_checkpoint=false --run.report=false $C
# issue 33 (2): one row shape for speedrun-latest: every stage in rows of 2 x 16,384 (stage 2 in 12 micro-steps
# instead of 8 x 1 x 49,152; its pieces are <= 8,192, so a row of 16,384 cuts no piece): one training graph fewer.
# Per-stage step time and compile, against the preset as it is. ~6 min.
S1='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=16384,max_doc_len=8192}]'
phase oneshape 600 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 \
    --data.train_files="$DATA" --ab="--data.seq_len=32768 --train.stages=$S1"
