#!/usr/bin/env bash
# Benchmark, not a test: the softswitch-facing front ends (SPEC §11) of a
# release-build collector on loopback.
#
#   [BIN=DIR] scripts/bench-front-ends.sh [SECONDS] [INVITES]
#       SECONDS  length of each wrk run (default 10)
#       INVITES  INVITEs per SIPp redirect run (default 30000)
#       BIN      binaries to run instead of this tree's release build
#
# 1. HTTP `GET /v1/select` with 1,000 msr-loadgen MSRs all in one zone and
#    site (the worst case for the scan), measured with wrk (Debian's `wrk`):
#    one keep-alive client (round trip), then 4 keep-alive clients
#    (throughput).
# 2. SIP redirect throughput, SIPp `tests/sipp/redirect_uac.xml` (INVITE →
#    302 → ACK, at most 200 calls in flight, as fast as answers come):
#    the collector's redirect server with 3 msr-loadgen MSRs, then in the
#    same run Kamailio 5.6's dispatcher (`ds_select_dst` weight-based over
#    the same 3 contact URIs, `sl_send_reply("302")`, 2 children) for the
#    same traffic. Each server's CPU time over its run is read from
#    /proc/PID/stat, so the rates are also given per CPU-second.
#
# Prints the figures and the load average; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
invites=${2:-30000}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }

# BIN: a directory holding another build's msr-collector, msr-loadgen and
# msrctl (a before-and-after comparison); by default this tree's release.
. scripts/lib/bench.sh
bench_start

# utime + stime of PIDs (all their threads), in clock ticks.
ticks() {
  local sum=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    sum=$((sum + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat")))
  done
  echo "$sum"
}
hz=$(getconf CLK_TCK)
now() { date +%s.%N; }

# start_collector NAME MSRS → sets sip_port http_port redirect_port sock
start_collector() {
  local name=$1 msrs=$2
  sip_port=$(free_port udp)
  http_port=$(free_port tcp)
  redirect_port=$(free_port udp)
  sock="$dir/$name.sock"
  write_collector_config "$dir/$name.toml" "$sip_port" "$sock" "$dir/$name-state.json" "[http]
listen = \"127.0.0.1:$http_port\"
[redirect]
listen = \"127.0.0.1:$redirect_port\""
  "$bin/msr-collector" --config "$dir/$name.toml" -q >"$dir/$name.log" 2>&1 &
  collector_pid=$!
  pids+=("$collector_pid")
  "$bin/msr-loadgen" notify --collector "127.0.0.1:$sip_port" --msrs "$msrs" \
    --rate "$(( msrs < 50 ? msrs : 50 ))" --duration 900 --register-expires 3600 \
    >"$dir/$name-loadgen.log" 2>&1 &
  loadgen_pid=$!
  pids+=("$loadgen_pid")
  local end=$(($(date +%s) + 120))
  until [ "$(healthy)" -ge "$msrs" ]; do
    [ "$(date +%s)" -lt "$end" ] || { echo "the $msrs MSRs did not come up" >&2; exit 1; }
    sleep 0.5
  done
  echo "$msrs MSRs live and healthy (collector pid $collector_pid)"
}
healthy() { count_rows "$sock" healthy; }

echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo "== 1. HTTP GET /v1/select, 1,000 MSRs in one zone and site"
start_collector http 1000
url="http://127.0.0.1:$http_port/v1/select?zone=default&site=local"
wrk -t1 -c1 -d1s "$url" >/dev/null # warm-up
echo "-- wrk, 1 keep-alive client (round trip)"
wrk -t1 -c1 -d"${seconds}s" --latency "$url"
echo "-- wrk, 4 keep-alive clients (2 threads)"
t0=$(ticks "$collector_pid")
wrk -t2 -c4 -d"${seconds}s" --latency "$url"
t1=$(ticks "$collector_pid")
echo "collector CPU during the 4-client run: $(( (t1 - t0) * 100 / hz / seconds )) % of one core"
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)"
kill "$loadgen_pid" "$collector_pid" 2>/dev/null || true

echo "== 2. SIP redirect: INVITE → 302 → ACK, $invites INVITEs per server, 3 destinations"
start_collector redirect 3
uris=$("$bin/msrctl" --socket "$sock" --json resource list |
  python3 -c 'import json, sys; print("\n".join(r["uri"].split(";")[0] for r in json.load(sys.stdin)["rows"]))')
kport=$(free_port udp)
: >"$dir/dispatcher.list"
for u in $uris; do echo "1 $u 0 0 weight=33" >>"$dir/dispatcher.list"; done
cat >"$dir/dispatcher.cfg" <<CFG
#!KAMAILIO
debug=1
log_stderror=yes
fork=yes
children=2
auto_aliases=no
listen=udp:127.0.0.1:$kport
mpath="/usr/lib/x86_64-linux-gnu/kamailio/modules/"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "dispatcher.so"
modparam("dispatcher", "list_file", "$dir/dispatcher.list")
request_route {
    if (is_method("ACK")) { exit; }
    if (!is_method("INVITE")) { sl_send_reply("405", "Method Not Allowed"); exit; }
    if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
    if (!ds_select_dst("1", "9")) { sl_send_reply("503", "No Destination"); exit; }
    append_to_reply("Contact: <\$du>\r\n");
    sl_send_reply("302", "Moved Temporarily");
    exit;
}
CFG
kamailio -DD -E -f "$dir/dispatcher.cfg" -Y "$dir" >"$dir/kamailio.log" 2>&1 &
kamailio_pid=$!
pids+=("$kamailio_pid")
end=$(($(date +%s) + 10))
until sipp -sf tests/sipp/redirect_uac.xml -i 127.0.0.1 -p "$(free_port udp)" -m 1 \
  -timeout 2s -nostdin "127.0.0.1:$kport" >/dev/null 2>&1; do
  [ "$(date +%s)" -lt "$end" ] || { echo "kamailio did not answer:"; cat "$dir/kamailio.log"; exit 1; } >&2
  sleep 0.2
done

# redirect_run LABEL PORT PID... : SIPp against PORT, CPU of PIDs.
redirect_run() {
  local label=$1 port=$2; shift 2
  local t0 t1 w0 w1 out ok
  t0=$(ticks "$@"); w0=$(now)
  out=$(sipp -sf tests/sipp/redirect_uac.xml -i 127.0.0.1 -p "$(free_port udp)" \
    -m "$invites" -r 100000 -l 200 -timeout 300s -nostdin "127.0.0.1:$port" 2>&1 || true)
  w1=$(now); t1=$(ticks "$@")
  ok=$(printf '%s\n' "$out" | awk -F'|' '/Successful call/ { v = $3 } END { gsub(/ /, "", v); print v + 0 }')
  python3 - "$label" "$ok" "$w0" "$w1" "$t0" "$t1" "$hz" <<'PY'
import sys
label, ok, w0, w1, t0, t1, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
wall = w1 - w0
cpu = (t1 - t0) / hz
print(f"{label}: {ok} calls 302+ACK in {wall:.2f} s = {ok / wall:,.0f}/s; "
      f"server CPU {cpu:.2f} s ({100 * cpu / wall:.0f} % of one core) = {ok / max(cpu, 1e-9):,.0f} per CPU-second")
PY
  printf '%s\n' "$out" | grep -aE "Failed call|Retrans|INVITE ---" | head -3
}
kamailio_pids() { echo "$kamailio_pid $(pgrep -P "$kamailio_pid" | tr '\n' ' ')"; }
for round in 1 2; do
  echo "-- round $round, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2046
  redirect_run "msr-collector redirect" "$redirect_port" "$collector_pid"
  # shellcheck disable=SC2046
  redirect_run "kamailio dispatcher  " "$kport" $(kamailio_pids)
done
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
