# Issue 34 (1): which rank keeps the others waiting on 4 GPUs, and why. Wave 8's bench (29d9089) gave the ranks'
# exposed communication waits as 7.6 / 6.8 / 2.8 / 7.7 ms a step: one rank is ~4.6 ms slower on average. Its data is
# not heavier (benchmarks/rank_balance.py: 0.13 ms; docs/distributed.md), nor its optimizer share (DistMuon gives
# rank 3 less, not more), so: one slower GPU, or one slower host process? About 8 device-minutes on 4 x H100:
#   setsid scripts/lease.sh /tmp/w9s scripts/plans/straggler.sh > /tmp/w9s.log 2>&1 < /dev/null &
# Then: grep -H step_ms_mean /tmp/w9s/logs/gpu-*.log (the same work on each GPU alone, at once; a slow GPU shows
# here) and grep comm_wait_ms_by_rank /tmp/w9s/logs/order-*.log (every rank's wait in rank order; the low-wait rank
# is the slow one: does it follow the device when the order rotates, or keep its rank number?).
# Sourced by scripts/lease.sh ($W $PY $DATA $TR, phase).
# shellcheck shell=bash disable=SC2086,SC2154

phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
phase topo 30 bash -c "nvidia-smi topo -m; nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER"
# One single-GPU bench per GPU, all at once (no communication), clocks and throttle reasons logged every 2 s
phase gpus 420 bash -c "
    nvidia-smi --query-gpu=index,pci.bus_id,clocks.sm,clocks.mem,temperature.gpu,power.draw,\
clocks_throttle_reasons.active --format=csv -l 2 > '$W/logs/smi.csv' & smi=\$!
    pids=()
    for i in 0 1 2 3; do
        CUDA_VISIBLE_DEVICES=\$i $PY -m speedgpt bench --preset speedrun-124m --steps 20 \
            --data.train_files='$DATA' > '$W/logs/gpu-'\$i'.log' 2>&1 & pids+=(\$!)
    done
    rc=0; for p in \"\${pids[@]}\"; do wait \$p || rc=1; done
    kill \$smi; exit \$rc"
# The 4-GPU bench (its comm_wait_ms_by_rank row: every rank's wait; --tee keeps each rank's output tagged too), on
# two device orders, each with every rank's profile trace (benchmarks/trace_report.py lines the ranks' backward ends
# up)
for order in 0,1,2,3 1,2,3,0; do
    phase "order-${order//,/}" 420 env CUDA_VISIBLE_DEVICES=$order $TR --tee 3 --log-dir "$W/ranks-${order//,/}" \
        -m speedgpt bench --preset speedrun-124m --steps 20 --data.train_files="$DATA" \
        --profile 10 --profile-trace "$W/trace-${order//,/}"
done
