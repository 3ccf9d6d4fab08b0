#!/usr/bin/env bash
# The selection benchmarks (criterion, collector/benches/select.rs) of an
# earlier commit and of the working tree, one after the other in one run,
# each in its own target directory: the before and after figures that
# BENCHMARKS.md records.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/bench-select-before-after.sh BEFORE [FILTER]

  BEFORE   the commit to compare with (e.g. f046cf3); checked out in a
           temporary git worktree
  FILTER   criterion's name filter (default: select)

Prints each tree's medians. Run it on a quiet host: both trees are built
in release first (several minutes the first time), then measured.
EOF
}

case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    '') usage >&2; exit 2 ;;
esac
before=$1
filter=${2:-select}
repo=$(git rev-parse --show-toplevel)
tree=$(mktemp -d)
trap 'git -C "$repo" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git -C "$repo" worktree add --detach -f "$tree" "$before" >/dev/null

bench() {
    local dir=$1
    echo "=== $(git -C "$dir" rev-parse --short HEAD) ($dir)"
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target-bench" cargo bench -p msr-collector --bench select -- \
        --warm-up-time 1 --measurement-time 4 "$filter" 2>&1 |
        grep -E '^select|time:')
}

bench "$tree"
bench "$repo"
