# The next 4-GPU lease (issues 34, 33, 32), in priority order, about 30 device-minutes; cut it where the budget
# ends (the later phases stay in docs/experiments.md's owed table). Run from the repository root of the device copy:
#   setsid scripts/lease.sh /tmp/w7 scripts/plans/wave7.sh > /tmp/w7.log 2>&1 < /dev/null &
# then poll `grep -q "^PHASE " /tmp/w7/status` and `scripts/lease.sh /tmp/w7 collect $OUT/w7.tgz` in each call.
# Sourced by scripts/lease.sh ($W $PY $DATA $TR $C, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 32
# issue 34 (3): moe-d12 at the setting that diverged at step 186 against its dense counterpart, now that MoE.forward
# compiles without a graph break (wave 6: the MoE arm hit dynamo's recompile limit before step 1). ~6 min cold.
phase moe 600 $PY -m speedgpt ab --preset moe-d12 --a "--model.moe_experts=0" --b "" --seeds 2 --no-checkpoint \
    --train.steps=250 --train.batch_tokens=131072 --train.val_every=50 --target-loss a \
    --data.train_files="$DATA" --data.val_tokens=1572864 --out "$W/runs/ab-moe"
# issue 34 (1): the missing percent of 1 -> 4 scaling (wave 6: 3.78x; reductions start after the whole-model
# backward). Per-block backward nodes start them inside the backward: step time and the profile's lead, both scopes.
phase bench4 480 $TR -m speedgpt bench --preset speedrun-124m --steps 10 --profile 10 --data.train_files="$DATA" \
    --ab=--train.compile_scope=block
phase bench1 360 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-124m --steps 10 \
    --data.train_files="$DATA" --ab=--train.compile_scope=block
# issue 33: compile time per preset (cold, a fresh machine from the artifacts, block scope), after flex inside the
# compiled model stopped costing a second trace
phase compile 600 env DATA="$DATA" PY="$PY" STEPS=6 scripts/compile_bench.sh "$W/cb"
# issue 32: speedrun-latest with mix and its last stages' caps at 8,192 against mix as it is (wave 5 found the
# 2,048 cap made speedrun-124m's validation rise)
S='[{share=0.33,batch_tokens=131072,seq_len=16384,max_doc_len=896,mtp_weights=[1.0,0.5,0.25],mtp_weights_end=[1.0,0.5,0.0]},{share=0.33,batch_tokens=262144,seq_len=16384,max_doc_len=8192,mtp_weights=[1.0,0.5],mtp_weights_end=[1.0,0.0]},{share=0.34,max_doc_len=8192}]'
phase latest 600 $PY -m speedgpt ab --preset speedrun-latest --a "--data.long_docs=mix" \
    --b "--data.long_docs=mix --train.stages=$S" --seeds 2 --target-loss 0.8214 --no-checkpoint $C \
    --out "$W/runs/latest_cap8192"
# issue 33: AOTAutograd's cache refuses graphs with custom autograd Functions (the FP8 paths) unless allowed
# (benchmarks/precompile_probe.py): does allowing it make a fresh machine's start faster? Compare the warm column
# with the compile phase's.
phase compile_acf 600 env TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD=1 DATA="$DATA" PY="$PY" STEPS=6 \
    scripts/compile_bench.sh "$W/cb-acf"
