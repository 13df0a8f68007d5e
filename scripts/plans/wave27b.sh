# Wave 27b (issues 32, 33), one GPU: wave27.sh reordered for a session whose refused starts left ~19 device-minutes
# (~17 with the start): the A/B first, then the compile-cache checks on its cache, without wave27.sh's 12-step cold
# start (the A/B's first run starts cold in a new folder: the cold bar from a training run's start, as in wave 26).
# 1. `cooldown` (~12 min, issue 32): speedrun-latest with schedule.cooldown_frac 0.6 against its 0.45 (record #28's,
#    never A/B-tested here), 2 paired seeds by time to 0.8214, runs one after another. Waves 25 and 26 reached the
#    target at ~step 267 of 300, deep in the cooldown (it starts at step 165): an earlier decay may reach it sooner.
#    Loader of both: the preset's (greedy, mix, 8,192 open documents, the stage table's caps).
# 2. `warm-other-val`: 12 steps of the same preset validating otherwise than the A/B (val_every 6, one val batch of
#    262,144 tokens against 25 and six): the same digest (ca81eee), a warm start (~7 s), and its save says the file was
#    kept (06761e9: the A/B's later runs and this one compiled nothing, so the file the A/B's first run wrote stays).
# 3. `fresh`: a new folder holding only that artifact file (another machine): nothing traced, the warm bar (<= 20 s).
#   mkdir -p /tmp/w27b; setsid scripts/lease.sh /tmp/w27b scripts/plans/wave27b.sh > /tmp/w27b.log 2>&1 < /dev/null &
# then poll, and end with `scripts/lease.sh /tmp/w27b collect $OUT/w27b.tgz`.
# Sourced by scripts/lease.sh: wave27.sh in this order (its AB_FIRST).
# shellcheck shell=bash source=scripts/plans/wave27.sh
AB_FIRST=1
source "$(dirname "${BASH_SOURCE[0]}")/wave27.sh"
