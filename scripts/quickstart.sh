#!/usr/bin/env bash
# The main job: build, then run one collector and three agents on 127.0.0.1,
# print the tables and the selection shares, and watch until Ctrl-C.
# Arguments go to msr-quickstart (e.g. --once, --selections 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
# The etcd client's build needs protoc: installed when missing, as CI does.
scripts/deps.sh build
echo "==> building (cargo build --release)"
cargo build --release --workspace --bins --locked
exec target/release/msr-quickstart "$@"
