# Wave 27a (issue 33), one GPU: wave27.sh's compile-cache phases alone (~5 min, ~8 with the start), for a session
# whose refused starts left too little for its cooldown A/B (~12 min more): 1. `cold`, 2. `warm-other-val`,
# 3. `fresh`, as wave27.sh's header says.
#   mkdir -p /tmp/w27; setsid scripts/lease.sh /tmp/w27 scripts/plans/wave27a.sh > /tmp/w27.log 2>&1 < /dev/null &
# then poll, and end with `scripts/lease.sh /tmp/w27 collect $OUT/w27.tgz`.
# Sourced by scripts/lease.sh: wave27.sh without its A/B (its NO_AB).
# shellcheck shell=bash source=scripts/plans/wave27.sh
NO_AB=1
source "$(dirname "${BASH_SOURCE[0]}")/wave27.sh"
