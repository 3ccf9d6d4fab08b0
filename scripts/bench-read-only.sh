#!/usr/bin/env bash
# Benchmark, not a test: selections that name no leg (answered from the
# loop's copy, `core/snapshot.rs`) over the control socket and HTTP, with
# 1,000 msr-loadgen MSRs in one zone and site.
#
#   [BIN=DIR] scripts/bench-read-only.sh [SELECTS] [SECONDS]
#       SELECTS  control-socket selections from 4 clients (default 300000)
#       SECONDS  length of the wrk run, 4 keep-alive clients (default 10)
#       BIN      binaries to run instead of this tree's release build
#                (a before-and-after comparison: run it once per build)
#
# Prints msr-loadgen's and wrk's summaries and the collector's CPU per
# request; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
selects=${1:-300000}
seconds=${2:-10}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
. scripts/lib/bench.sh
bench_start
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

sip_port=$(free_port udp)
http_port=$(free_port tcp)
sock=$dir/control.sock
write_collector_config "$dir/collector.toml" "$sip_port" "$sock" "$dir/state.json" "[http]
listen = \"127.0.0.1:$http_port\""
"$bin/msr-collector" --config "$dir/collector.toml" -q >"$dir/collector.log" 2>&1 &
collector_pid=$!
pids+=("$collector_pid")
"$bin/msr-loadgen" notify --collector "127.0.0.1:$sip_port" --msrs 1000 --rate 50 \
  --duration 900 --register-expires 3600 >"$dir/loadgen.log" 2>&1 &
pids+=("$!")
end=$(($(date +%s) + 120))
until [ "$(count_rows "$sock" healthy)" -ge 1000 ]; do
  [ "$(date +%s)" -lt "$end" ] || { echo "the 1000 MSRs did not come up" >&2; exit 1; }
  sleep 0.5
done
echo "== load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores; 1000 MSRs healthy"

echo "== control socket, 4 clients, $selects selections"
"$bin/msr-loadgen" select --socket "$sock" --clients 4 --requests 4000 --declare-site >/dev/null
t0=$(ticks "$collector_pid")
"$bin/msr-loadgen" select --socket "$sock" --clients 4 --requests "$selects"
t1=$(ticks "$collector_pid")
python3 -c "print(f'collector CPU per selection {($t1 - $t0) / $hz / $selects * 1e6:.1f} µs')"
echo "== control socket, 1 client, 50000 selections"
"$bin/msr-loadgen" select --socket "$sock" --clients 1 --requests 50000

url="http://127.0.0.1:$http_port/v1/select?zone=default&site=local"
wrk -t1 -c1 -d1s "$url" >/dev/null # warm-up
echo "== HTTP, wrk 4 keep-alive clients (2 threads), $seconds s"
t0=$(ticks "$collector_pid")
wrk -t2 -c4 -d"${seconds}s" --latency "$url"
t1=$(ticks "$collector_pid")
echo "collector CPU during the run: $(( (t1 - t0) * 100 / hz / seconds )) % of one core"
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -q panicked "$dir/collector.log" && { echo "the collector panicked:" >&2; cat "$dir/collector.log" >&2; exit 1; }
exit 0
