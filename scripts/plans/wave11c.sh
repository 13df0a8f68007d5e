# wave11b.sh's second half as run (2026-11-28): b064051's bench has no --per-stage (its plan-old phase failed at
# once), so the run-plan pair times the steps bench spreads over the schedule in both trees (the same 6 schedule
# positions: timed_steps is unchanged), then stage 0 on two GPUs profiled, and the same position on one GPU.
# Started after stopping wave11b.sh's job (its acf-* phases on GPU 1 went on); same usage as wave11b.sh.
# shellcheck shell=bash disable=SC2086,SC2154
OLD=$PWD/.carry/tree-b064051
phase plan-old-spread 480 bash -c "cd $OLD && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$OLD $PY -m speedgpt bench \
    --preset speedrun-latest --steps 6 --data.train_files=$DATA"
phase plan-new-spread 420 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest --steps 6 \
    --data.train_files="$DATA"
phase latest2-prof0 420 $TR -m speedgpt bench --preset speedrun-latest --at-step 20 --steps 6 --profile 12 \
    --profile-trace "$W/trace2" --data.train_files="$DATA"
phase latest1-step20 300 env CUDA_VISIBLE_DEVICES=0 $PY -m speedgpt bench --preset speedrun-latest --at-step 20 \
    --steps 6 --data.train_files="$DATA"
