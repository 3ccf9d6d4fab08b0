#!/usr/bin/env bash
# The main job: build, then run one collector and three agents on 127.0.0.1,
# print the tables and the selection shares, and watch until Ctrl-C.
# Arguments go to msr-quickstart (e.g. --once, --selections 20000; --help).
set -euo pipefail
# Where cargo puts the binaries: $CARGO_TARGET_DIR when set (a relative one
# is cargo's, relative to where this was run: resolved before the cd).
target_dir=${CARGO_TARGET_DIR:-}
if [ -n "$target_dir" ] && [ "${target_dir#/}" = "$target_dir" ]; then
  target_dir=$PWD/$target_dir
fi
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${target_dir:-$PWD/target}
# The etcd client's build needs protoc: installed when missing, as CI does.
scripts/deps.sh build
echo "==> building (cargo build --release --workspace --bins --locked)"
cargo build --release --workspace --bins --locked
exec "$CARGO_TARGET_DIR/release/msr-quickstart" "$@"
