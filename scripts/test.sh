#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine.
#
# Installs what the tests need and the machine lacks (scripts/deps.sh: SIPp,
# etcd, protoc from Debian's packages), then runs the unit, property and
# system tests. Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p msr-agent`).
set -euo pipefail
cd "$(dirname "$0")/.."

# SIPp (sip-tester), etcd (etcd-server) and protoc (protobuf-compiler).
scripts/deps.sh
echo "== $(sipp -v 2>/dev/null | grep -m1 -i 'sipp v' || echo 'sipp installed')"
echo "== $(etcd --version 2>/dev/null | head -1), $(protoc --version)"

# The system tests run the real binaries from target/debug; `cargo test`
# alone builds only the test targets' own crates, so build every binary first.
echo "== cargo build (binaries used by the system tests)"
cargo build --workspace --bins --locked
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole run: the sum of every test binary's result.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
