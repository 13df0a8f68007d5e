# The next 4-GPU lease (issues 34, 32, 33), in priority order, about 45 device-minutes of work: cut it where the
# 30-minute budget ends (the later phases stay in docs/experiments.md's owed table). Run from the repository root of
# the device copy:
#   setsid scripts/lease.sh /tmp/w8 scripts/plans/wave8.sh > /tmp/w8.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w8/status` in calls of at most ~540 s (a call cut by its limit collects nothing)
# and end each call with `scripts/lease.sh /tmp/w8 collect $OUT/w8.tgz`.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154

phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# issue 34 (1): 1 -> 4 scaling (wave 7: 3.66x mean / 3.77x median; bar 3.85x). The reduce-scatters carry fp32
# gradients after the whole backward: do bf16 ones close the gap? Then the 1-GPU baseline on the same machine.
# From wave 8 on bench times steps back to back (no host sync between them, ranks lined up by a barrier), as
# training runs them: wave 7's figures synced every step.
# The profile's trace comes back too (--profile-trace): wave 7's profile left 7,170 compiled kernels unplaced, so
# whether the backward's reductions start inside it could not be read; the trace lets a CPU machine find out why.
phase bench4 420 $TR -m speedgpt bench --preset speedrun-124m --steps 20 --profile 10 --data.train_files="$DATA" \
    --profile-trace "$W/trace4" --ab=--parallel.grad_comm_dtype=bf16
phase bench1 240 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-124m --steps 20 \
    --data.train_files="$DATA"
# issue 34 (1): bf16 gradient reduce-scatter changes the math: its loss on 4 GPUs, 2 seeds each, speedrun-124m. The
# param runs are also the 4-GPU side of a training-time scaling figure: the default phase trains the same command
# on one GPU of this machine (same seeds), so 300 steps' training time on 1 against 4 GPUs needs no bench.
for seed in 1337 1338; do
    for dt in param bf16; do
        phase "loss-$dt-$seed" 300 $TR -m speedgpt train --preset speedrun-124m --run-dir "$W/runs/dp4-$dt-$seed" \
            --train.seed=$seed --parallel.grad_comm_dtype=$dt --train.save_final_checkpoint=false \
            --run.report=false $C
    done
done
# issue 32 (6): which preset is the GPU default, on one machine, paired seeds: speedrun-124m (mix, pieces <= 8,192)
# against speedrun-latest (mix, later stages' pieces <= 8,192 since wave 7: 0.8214 in 145.9 / 147.1 s; 124m took
# 184.0 / 178.2 s in wave 5 on another H100). ~9 min cold (wave 7: four latest runs at once took 540 s).
phase default 720 $PY -m speedgpt ab --a "--preset speedrun-124m" --b "--preset speedrun-latest" --seeds 2 \
    --target-loss 0.8214 --no-checkpoint $C --out "$W/runs/default"
# issues 33 and 34: speedrun-latest on 4 GPUs (its compile: bar <= 120 s; issue 34's owed row), 300 steps
phase latest4 540 $TR -m speedgpt train --preset speedrun-latest --run-dir "$W/runs/dp4-latest" \
    --train.save_final_checkpoint=false --run.report=false $C
# issue 33 (2): one row shape for speedrun-latest: every stage in rows of 2 x 16,384 (stage 2 in 12 micro-steps
# instead of 8 x 1 x 49,152; its pieces are <= 8,192, so a row of 16,384 cuts no piece): one training graph fewer.
# Per-stage step time and compile, against the preset as it is (warm from the default phase). ~6 min.
S1='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,seq_len=16384,max_doc_len=8192}]'
phase oneshape 600 $PY -m speedgpt bench --preset speedrun-latest --per-stage --steps 6 --data.train_files="$DATA" \
    --ab="--data.seq_len=32768 --train.stages=$S1"
# issue 33: AOTAutograd's cache refuses graphs with custom autograd Functions (the FP8 paths) unless allowed
# (benchmarks/precompile_probe.py): does allowing it make a fresh machine's start faster? Compare the warm column
# with wave 7's (docs/experiments.md).
phase compile_acf 600 env TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=1 DATA="$DATA" PY="$PY" STEPS=6 \
    scripts/compile_bench.sh "$W/cb-acf"
