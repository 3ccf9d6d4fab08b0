#!/usr/bin/env bash
# Builds the previous release's Debian packages (msr-agent and
# msr-collector 0.1.0, commit ae2410a) for the upgrade test of
# scripts/package-test.sh, and prints their two paths (agent first).
#
# The old tree is checked out with `git worktree` under
# target/previous-release/ and built there in release mode with its own
# target directory. The .debs are kept by commit in the user's cache
# (${XDG_CACHE_HOME:-~/.cache}/msr-selection/previous-packages/COMMIT/, or
# MSR_PREVIOUS_CACHE), outside the clone, so a later run on the same
# machine, from this clone or a fresh one (as CI's), prints them without
# building; the first run takes a release build, about 8 minutes on 2
# cores. MSR_PREVIOUS_COMMIT names another commit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COMMIT=${MSR_PREVIOUS_COMMIT:-ae2410a}
BASE=$ROOT/target/previous-release
FULL=$(git rev-parse --verify "$COMMIT^{commit}")
CACHE=${MSR_PREVIOUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/msr-selection/previous-packages}
DEBS=$CACHE/$FULL
found() { # the two cached packages, agent first, or nothing
  local agent collector
  agent=$(find "$DEBS" -maxdepth 1 -name 'msr-agent_*.deb' 2>/dev/null | head -n 1)
  collector=$(find "$DEBS" -maxdepth 1 -name 'msr-collector_*.deb' 2>/dev/null | head -n 1)
  [ -n "$agent" ] && [ -n "$collector" ] && printf '%s\n%s\n' "$agent" "$collector"
}
if cached=$(found); then
  echo "== previous packages (cached, commit ${FULL:0:10}): $(printf '%s\n' "$cached" | xargs -n1 basename | tr '\n' ' ')" >&2
  printf '%s\n' "$cached"
  exit 0
fi
SRC=$BASE/src
mkdir -p "$BASE" "$(dirname "$DEBS")"
# A stale worktree (an interrupted run) is replaced.
if [ -e "$SRC" ]; then
  git worktree remove --force "$SRC" >/dev/null 2>&1 || rm -rf "$SRC"
  git worktree prune
fi
echo "== previous packages: building commit ${FULL:0:10} in $SRC (release)" >&2
git worktree add --detach "$SRC" "$FULL" >&2
cleanup() { git -C "$ROOT" worktree remove --force "$SRC" >/dev/null 2>&1 || true; }
trap cleanup EXIT
(
  cd "$SRC"
  export CARGO_TARGET_DIR=$BASE/target
  timeout 2400 cargo build --release --locked -p msr-agent -p msr-collector -p msr-dist --bins >&2
  rm -rf packaging/generated
  "$CARGO_TARGET_DIR/release/msr-dist" packaging/generated >&2
  # Into a folder of its own first: a cache holds both packages or none.
  rm -rf "$DEBS.tmp"
  mkdir -p "$DEBS.tmp"
  for p in msr-agent msr-collector; do
    deb=$(timeout 600 cargo deb --no-build --locked -p "$p" -o "$DEBS.tmp/" | tail -n 1)
    [ -f "$deb" ] || { echo "error: cargo deb -p $p (commit $FULL) named no package (got: $deb)" >&2; exit 1; }
  done
)
rm -rf "$DEBS"
mv "$DEBS.tmp" "$DEBS"
found
