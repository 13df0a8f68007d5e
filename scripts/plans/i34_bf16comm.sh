# Issue 34 (1): gradient reduce-scatters in bf16 (parallel.grad_comm_dtype, docs/distributed.md), on 4 GPUs:
# step time against fp32 communication, then the loss A/B that must come before any preset turns it on.
# About 18 device-minutes; the bench alone (~5 min) answers the speed half. From the device copy's root:
#   setsid scripts/lease.sh /tmp/i34 scripts/plans/i34_bf16comm.sh > /tmp/i34.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/i34/status` and `scripts/lease.sh /tmp/i34 collect $OUT/i34.tgz` in each call.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
NOCKPT="--train.save_final_checkpoint=false --run.report=false"
CC="--train.compile_cache=$W/cc"  # the communication dtype is outside the compiled graphs: one cache serves all
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# Speed: A = fp32 reduce-scatters (today: 181.7 ms a step, 8.7 ms of waits), B = bf16. The table's grad_comm_dtype
# row names each arm; the profile's NCCL lines show whether ReduceScatter_Sum_f32 became _bf16 and shrank.
phase bench4 480 $TR -m speedgpt bench --preset speedrun-124m --steps 10 --profile 10 --data.train_files="$DATA" \
    $CC --ab=--parallel.grad_comm_dtype=bf16
# Loss: 2 seeds x 2 arms of the 300-step run on 4 GPUs (`speedgpt ab` runs one run per GPU, which communicates
# nothing). Same-command runs part by up to ~0.01 in validation on GPUs, so 2 seeds show only a larger effect.
for seed in 1337 1338; do
    for dt in param bf16; do
        phase "train_${dt}_$seed" 420 $TR -m speedgpt train --preset speedrun-124m --train.seed=$seed \
            --parallel.grad_comm_dtype=$dt --run-dir "$W/runs/comm-$dt-$seed" $C $NOCKPT $CC
    done
done
for seed in 1337 1338; do
    phase "report_$seed" 120 $PY -m speedgpt report --markdown --target-loss 0.8214 \
        "$W/runs/comm-param-$seed" "$W/runs/comm-bf16-$seed"
done
