#!/usr/bin/env bash
# Benchmark, not a test: the collector's three standing figures
# (BENCHMARKS.md, "Summary"), measured in one run of a release build.
#
#   [BATCHED=1] scripts/bench-collector.sh [NOTIFY_RATE] [NOTIFY_SECONDS] [SELECTS]
#                              (defaults 20000, 10, 100000)
#
# BATCHED=1: step 2's measured phase from `msr-loadgen notify --batched`
# (pre-encoded NOTIFYs, sendmmsg/recvmmsg, no retransmission), which costs
# this host little enough to offer the collector its two-core ceiling.
#
# 1. In-process selection: the criterion bench `collector/benches/select.rs`
#    (1,000 MSRs × 4 contacts, 20 zones, 50 sites; and the worst case,
#    1,000 equally near contacts in one zone and site).
# 2. NOTIFY throughput: 1,000 msr-loadgen MSRs register and are subscribed,
#    then send NOTIFY_RATE NOTIFYs/s for NOTIFY_SECONDS; msr-loadgen prints
#    answered / retransmitted / lost, latency, the collector's CPU and RSS.
# 3. Selection over the control socket from 4 clients on that same
#    collector (1,000 MSRs in one zone and site: every selection keeps all
#    of them), after a 4,000-request warm-up.
#
# Prints the tools' summaries and `uptime` before each step (the figures
# mean little on a loaded machine); asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-20000}
seconds=${2:-10}
selects=${3:-100000}

cargo build --release --locked -q -p msr-collector -p msr-tools --bins
bin=target/release
. scripts/lib/bench.sh
dir=$(mktemp -d)
collector_pid=""
cleanup() {
  [ -n "$collector_pid" ] && kill "$collector_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

echo "== 1. in-process selection (criterion) — $(uptime)"
cargo bench --locked -q -p msr-collector --bench select -- \
  --warm-up-time 1 --measurement-time 3 'select 1000 msr x' 2>&1 |
  grep -E '^select|time:' || true

echo "== 2. NOTIFY: 1,000 MSRs, $rate/s for $seconds s — $(uptime)"
port=$(free_port udp)
write_collector_config "$dir/collector.toml" "$port" "$dir/control.sock" "$dir/state.json"
"$bin/msr-collector" --config "$dir/collector.toml" -q >"$dir/collector.log" 2>&1 &
collector_pid=$!
"$bin/msr-loadgen" notify --collector "127.0.0.1:$port" --msrs 1000 --rate "$rate" \
  --duration "$seconds" --collector-pid "$collector_pid" --socket "$dir/control.sock" \
  ${BATCHED:+--batched --drain-timeout 3}

echo "== 3. select over the control socket, 4 clients — $(uptime)"
"$bin/msr-loadgen" select --socket "$dir/control.sock" --clients 4 --requests 4000 \
  --declare-site >/dev/null
"$bin/msr-loadgen" select --socket "$dir/control.sock" --clients 4 --requests "$selects"
grep -q panicked "$dir/collector.log" && { echo "the collector panicked:" >&2; cat "$dir/collector.log" >&2; exit 1; }
exit 0
