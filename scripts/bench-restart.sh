#!/usr/bin/env bash
# Benchmark, not a test: how long after `kill -9` of the collector every
# MSR is selectable again (registered, subscribed, reporting), with N fake
# MSRs played by `msr-loadgen notify` on 127.0.0.1. The restarted collector
# reads its saved bindings and subscribes at once; the MSRs never
# REGISTER again during the run (their registrations last an hour).
#
#   scripts/bench-restart.sh [N_MSRS] [ROUNDS]     (default 1000 MSRs, 3 rounds)
#
# The MSRs are spread over one UDP socket per 100 of them (at least 4), as
# distinct contacts are: admission lets each source address:port start 50
# unauthenticated REGISTERs a second (SPEC §3).
#
# Prints one line per round and the figures; asserts nothing. Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
msrs=${1:-1000}
rounds=${2:-3}

cargo build --release --locked -q -p msr-collector -p msr-tools --bins
bin=target/release
. scripts/lib/bench.sh
dir=$(mktemp -d)
collector_pid=""
loadgen_pid=""
cleanup() {
  [ -n "$loadgen_pid" ] && kill "$loadgen_pid" 2>/dev/null || true
  [ -n "$collector_pid" ] && kill -9 "$collector_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

port=$(free_port udp)
write_collector_config "$dir/collector.toml" "$port" "$dir/control.sock" "$dir/state.json"

start_collector() {
  "$bin/msr-collector" --config "$dir/collector.toml" -q >>"$dir/collector.log" 2>&1 &
  collector_pid=$!
}

# Rows that are registered, subscribed and carry a load.
live() { count_rows "$dir/control.sock" live; }

saved() {
  python3 -c 'import json, sys
try:
    print(len(json.load(open(sys.argv[1]))["bindings"]))
except Exception:
    print(0)' "$dir/state.json.bindings"
}

wait_until() { # seconds, command, wanted
  local limit=$1 cmd=$2 want=$3 end
  end=$(($(date +%s) + limit))
  while [ "$($cmd)" -lt "$want" ]; do
    [ "$(date +%s)" -lt "$end" ] || { echo "timed out waiting for $cmd >= $want" >&2; return 1; }
    sleep 0.01
  done
}

start_collector
sockets=$((msrs / 100 > 4 ? msrs / 100 : 4))
"$bin/msr-loadgen" notify --collector "127.0.0.1:$port" --msrs "$msrs" --sockets "$sockets" --rate 200 \
  --duration $((60 + 30 * rounds)) --register-expires 3600 >"$dir/loadgen.log" 2>&1 &
loadgen_pid=$!
wait_until 120 live "$msrs"
echo "$msrs MSRs live; collector pid $collector_pid"

results=()
for round in $(seq "$rounds"); do
  wait_until 10 saved "$msrs"
  kill -9 "$collector_pid"
  wait "$collector_pid" 2>/dev/null || true
  t0=$(date +%s.%N)
  start_collector
  wait_until 60 live "$msrs"
  t1=$(date +%s.%N)
  took=$(python3 -c "print(f'{$t1 - $t0:.3f}')")
  results+=("$took")
  echo "round $round: kill -9, restart: all $msrs MSRs selectable again after ${took} s"
  sleep 2
done
echo "restart figures (s): ${results[*]}"
grep -m1 "bindings restored" "$dir/collector.log" || true
