# Wave 22's second lease (issue 33), one GPU: the graph-node cuts (the FP8 casts without their clamp, the per-layer
# scalar tables unbound once a forward) against 714e04b's tree, speedrun-124m's bench cold in a new cache folder
# each, one after the other, alone on the GPU: the step time (no change may slow steps) and the cold compile; first,
# the casts without a clamp compiled on the GPU against a clamped cast, bit for bit (scripts/gpu_check.py cast).
# ~6 device-minutes with the start. 714e04b's tree travels in .carry (git-ignored; `mkdir -p .carry/tree-714e04b &&
# git archive 714e04b | tar -x -C .carry/tree-714e04b`), named in `carry` on the first call only:
#   setsid scripts/lease.sh /tmp/w22b scripts/plans/wave22b.sh > /tmp/w22b.log 2>&1 < /dev/null &
# Sourced by scripts/lease.sh ($W $PY $DATA, phase).
# shellcheck shell=bash disable=SC2086,SC2154
phase data 300 $PY -m speedgpt data local-python --out "$DATA" --workers 16
phase gpucheck-cast 120 $PY scripts/gpu_check.py cast  # failed in wave 22b (its rows were empty on the GPU), mended since
OLD=$PWD/.carry/tree-714e04b
S124="--preset speedrun-124m --steps 6 --data.train_files=$DATA"
phase cold-old 300 bash -c "cd $OLD && PYTHONPATH=$OLD $PY -m speedgpt bench $S124 --train.compile_cache=$W/cc-old"
phase cold-new 300 $PY -m speedgpt bench $S124 --train.compile_cache="$W/cc-new"
true
