#!/usr/bin/env bash
# Benchmark, not a test: NOTIFY ingest over UDP, TCP and TLS side by side
# (BENCHMARKS.md, "NOTIFY over TCP and TLS"), a release build.
#
#   scripts/bench-ingest-transports.sh [RATE] [SECONDS] [MSRS] [TRANSPORTS]
#                                      (defaults 20000, 10, 1000, "udp tcp tls")
#
# For each transport a fresh collector (UDP, TCP and TLS listeners, a test
# certificate from `msr-loadgen pki`) and `msr-loadgen notify`: MSRS fake
# MSRs register (digest), are subscribed and send RATE NOTIFYs/s for
# SECONDS; over TCP and TLS each MSR holds a connection of its own for the
# whole run, as agents do. msr-loadgen prints answered / lost, latency, the
# collector's CPU (and CPU per NOTIFY) and RSS; `uptime` before each run
# says how busy the host was. Asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-20000}
seconds=${2:-10}
msrs=${3:-1000}
transports=${4:-udp tcp tls}

cargo build --release --locked -q -p msr-collector -p msr-tools --bins
bin=target/release
. scripts/lib/bench.sh
dir=$(mktemp -d)
collector_pid=""
stop_collector() {
  [ -n "$collector_pid" ] && kill "$collector_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  collector_pid=""
}
trap 'stop_collector; rm -rf "$dir"' EXIT

"$bin/msr-loadgen" pki --dir "$dir" >"$dir/tls.toml"
for transport in $transports; do
  port=$(free_port udp)
  tls_port=$(free_port tcp)
  # One account, 600 s subscriptions; the TLS listener on a port of its own.
  write_collector_config "$dir/collector.toml" "$port" "$dir/control.sock" "$dir/state.json" \
    "$(grep -v '^#' "$dir/tls.toml" | sed "s/127.0.0.1:0/127.0.0.1:$tls_port/")"
  sed -i 's/^transports = .*/transports = ["udp", "tcp", "tls"]/' "$dir/collector.toml"
  rm -f "$dir/state.json" "$dir"/state.json.* "$dir/control.sock"
  "$bin/msr-collector" --config "$dir/collector.toml" -q >"$dir/collector.log" 2>&1 &
  collector_pid=$!
  # Listening once its control socket is there.
  for _ in $(seq 100); do [ -S "$dir/control.sock" ] && break; sleep 0.1; done
  target=$port
  [ "$transport" = tls ] && target=$tls_port
  echo "== NOTIFY over $transport: $msrs MSRs, $rate/s for $seconds s — $(uptime)"
  "$bin/msr-loadgen" notify --transport "$transport" --tls-ca "$dir/ca.pem" \
    --collector "127.0.0.1:$target" --msrs "$msrs" --rate "$rate" --duration "$seconds" \
    --collector-pid "$collector_pid" --socket "$dir/control.sock" --setup-timeout 60
  grep -q panicked "$dir/collector.log" && { echo "the collector panicked:" >&2; cat "$dir/collector.log" >&2; exit 1; }
  stop_collector
done
exit 0
