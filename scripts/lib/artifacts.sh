# Sourced by scripts/lease.sh (its plans) and scripts/compile_bench.sh.
# shellcheck shell=bash

artifacts_only() {  # copy the artifact files of compile cache folder $1 into a new cache folder $2 (a fresh machine)
    local f d
    for f in "$1"/*/artifacts-*; do
        [ -e "$f" ] || continue
        d="$2/$(basename "$(dirname "$f")")"
        mkdir -p "$d" && cp "$f" "$d/"
    done
}
