#!/usr/bin/env bash
# Benchmark, not a test: select+release pairs (SPEC §9 call legs) over the
# control socket from 4 clients, against a release-build collector with
# 1,000 msr-loadgen MSRs all in one zone and site (the worst case for the
# scan), next to plain selections on the same collector.
#
#   scripts/bench-legs.sh [REQUESTS]     (default 100000 per run)
#
# Prints msr-loadgen's summaries; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-100000}

cargo build --release --locked -q -p msr-collector -p msr-tools --bins
bin=target/release
. scripts/lib/bench.sh
dir=$(mktemp -d)
collector_pid=""
loadgen_pid=""
cleanup() {
  [ -n "$loadgen_pid" ] && kill "$loadgen_pid" 2>/dev/null || true
  [ -n "$collector_pid" ] && kill "$collector_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

port=$(free_port udp)
write_collector_config "$dir/collector.toml" "$port" "$dir/control.sock" "$dir/state.json"
"$bin/msr-collector" --config "$dir/collector.toml" -q >"$dir/collector.log" 2>&1 &
collector_pid=$!
"$bin/msr-loadgen" notify --collector "127.0.0.1:$port" --msrs 1000 --rate 50 \
  --duration 600 --register-expires 3600 >"$dir/loadgen.log" 2>&1 &
loadgen_pid=$!

healthy() { count_rows "$dir/control.sock" healthy; }
end=$(($(date +%s) + 120))
until [ "$(healthy)" -ge 1000 ]; do
  [ "$(date +%s)" -lt "$end" ] || { echo "the 1,000 MSRs did not come up" >&2; exit 1; }
  sleep 0.5
done
echo "1000 MSRs live and healthy"
"$bin/msr-loadgen" select --socket "$dir/control.sock" --clients 4 --requests "$requests" --declare-site
"$bin/msr-loadgen" select --socket "$dir/control.sock" --clients 4 --requests "$requests" --legs
