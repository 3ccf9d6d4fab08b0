#!/usr/bin/env bash
# Benchmark, not a test: the balancing check end to end (SPEC §10). G real
# msr-collectors (one per core host, `[cluster] core_hosts` G), one real
# msr-agent per MSR with a `file:` calls source (`load-sensor="calls"`,
# `load-delta` 10, the agent's default intervals: one NOTIFY a second at
# most, one every 50 ms near the top, a sample a second) and one
# `<dynamic>` account per collector, and `msr-loadgen calls` placing and
# releasing calls through the collectors' control sockets, each call at
# one collector drawn at random. Then the same scenario in msr-sim
# (`--hosts G`) at its own time scale, for the figures BALANCING.md sets
# side by side.
#
# Time compression: calls are held HOLDING_MS (default 2 s), and every
# time the balance depends on is divided by TIME_SCALE (default 15) with
# them: the agents' NOTIFY and sampling intervals (`msr-agent
# --time-scale`) and the collectors' assumed NOTIFY flight
# (`notify_flight_time_ms`, 20 ms / TIME_SCALE). So the default run is
# the scenario with 30 s holding times, 15 times faster, and msr-sim runs
# that scenario uncompressed (holding HOLDING_MS × TIME_SCALE). At 30
# times the agents' 50 ms near the top becomes 1.7 ms, and ten agents
# sampling that often take more than a core of a 2-core host (the
# driver's lag reached seconds).
#
#   scripts/bench-balancing-e2e.sh [DURATION_S] [POLICY]
#       (default 600 s measured after a 60 s warm-up; POLICY pooled or ecss)
#   HOSTS=1 MSRS=10 SESSIONS=20 OFFERED=90 HOLDING_MS=2000 TIME_SCALE=15
#   WARMUP=60 SEED=1 SIM_CALLS=1000000 SIM_DELAY_MS=20
#   FAILOVER=1 (the MSRs a call may be given in all: 3 fails over as a
#   core does, SPEC §14, in the driver and in msr-sim)
#   NO_CALL_ID=1 (selects name no call and nothing is released: the
#   `ecss` fallback of `pooled`, SPEC §10, in the driver and in msr-sim)
#   BIN=target/release (set BIN to use built binaries, e.g. target/debug)
#   JSON=FILE keeps msr-loadgen's summary
#
# Prints msr-loadgen's and msr-sim's summaries; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-600}
policy=${2:-pooled}
hosts=${HOSTS:-1}
msrs=${MSRS:-10}
sessions=${SESSIONS:-20}
offered=${OFFERED:-90}
holding_ms=${HOLDING_MS:-2000}
scale=${TIME_SCALE:-15}
warmup=${WARMUP:-60}
seed=${SEED:-1}
failover=${FAILOVER:-1}
no_call_id=()
[ -n "${NO_CALL_ID:-}" ] && no_call_id=(--no-call-id)
bin=${BIN:-target/release}
case "$hosts" in '' | *[!0-9]* | 0*) echo "HOSTS must be a positive whole number" >&2; exit 2 ;; esac
case "$scale" in '' | *[!0-9]* | 0*) echo "TIME_SCALE must be a positive whole number" >&2; exit 2 ;; esac
# msr-sim takes whole seconds of holding time.
[ $((holding_ms * scale % 1000)) -eq 0 ] ||
  { echo "HOLDING_MS × TIME_SCALE must be whole seconds" >&2; exit 2; }
# The agent's defaults, which --time-scale divides; msr-sim gets them as
# they are.
min_interval_ms=1000
top_interval_ms=50
sample_interval_ms=1000
flight_ms=$(((20 + scale / 2) / scale))

if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -q -p msr-collector -p msr-agent -p msr-tools -p msr-sim --bins
fi
. scripts/lib/bench.sh
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# Collector h: SIP port ports[h-1], control socket control-h.sock. Each
# is started before the next port is chosen, and a port already taken by
# this run is drawn again (free_port sees only bound sockets).
ports=()
socket_args=()
for h in $(seq 1 "$hosts"); do
  while :; do
    port=$(free_port udp)
    case " ${ports[*]} " in *" $port "*) ;; *) break ;; esac
  done
  ports+=("$port")
  write_collector_config "$dir/collector-$h.toml" "$port" "$dir/control-$h.sock" "$dir/state-$h.json" \
    "$(printf '[selection]\npolicy = "%s"\nnotify_flight_time_ms = %s\n[cluster]\ncore_hosts = %s\n' \
      "$policy" "$flight_ms" "$hosts")"
  "$bin/msr-collector" --config "$dir/collector-$h.toml" -q >"$dir/collector-$h.log" 2>&1 &
  pids+=($!)
  socket_args+=(--socket "$dir/control-$h.sock")
done

msr_args=()
for i in $(seq 1 "$msrs"); do
  name="msr_$i"
  echo 0 >"$dir/$name.calls"
  cat >"$dir/$name.xml" <<XML
<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2025">
    <general log-level="3" log-rotate="no" max-calls="$sessions" load-sensor="calls" load-delta="10"/>
    <transport bind-addr="127.0.0.1" port="$((20000 + 2 * i))" transport="udp"/>
    <media port-start="30000" port-range="1000"/>
    <codec pcma="1" pcmu="2"/>
    <accounts>
$(for port in "${ports[@]}"; do
    echo "        <dynamic msr_name=\"$name\" realm=\"sip:127.0.0.1:$port\" auth_name=\"msr\" auth_password=\"msr-secret\" dtmf_mode=\"rfc\"/>"
  done)
    </accounts>
    <pbyte>
        <mcc bind-addr="127.0.0.1" port="$((20001 + 2 * i))"/>
    </pbyte>
    <agent engine-probe="off" sip-port="0" register-expires="600" max-subscription-expires="3600" calls-source="file:$dir/$name.calls" notify-min-interval-ms="$min_interval_ms" notify-top-interval-ms="$top_interval_ms" sample-interval-ms="$sample_interval_ms"/>
</config>
XML
  "$bin/msr-agent" --config "$dir/$name.xml" --log-stderr --time-scale "$scale" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  msr_args+=(--msr "$name=$dir/$name.calls")
done

echo "e2e: G = $hosts, $msrs MSRs × $sessions sessions, offered $offered %, holding mean $holding_ms ms, time scale $scale, policy $policy"
"$bin/msr-loadgen" calls "${socket_args[@]}" "${msr_args[@]}" --declare-site \
  --offered "$offered" --holding-ms "$holding_ms" --warmup "$warmup" --duration "$duration" \
  --seed "$seed" --failover-attempts "$failover" "${no_call_id[@]}" --json "${JSON:-$dir/summary.json}"

# The same scenario simulated at its own time scale: holding times
# HOLDING_MS × TIME_SCALE, the agent's intervals undivided, the report
# delay SIM_DELAY_MS (20 ms, the collector's assumed flight). Calls:
# 1,000,000 (SIM_CALLS), far more than a run of minutes offers, so the
# simulator's interval is the narrow one of the two.
calls=${SIM_CALLS:-1000000}
sim_delay_ms=${SIM_DELAY_MS:-20}
holding_s=$((holding_ms * scale / 1000))
echo
echo "msr-sim: the same scenario, holding $holding_s s, $calls calls"
"$bin/msr-sim" run --msrs "$msrs" --sessions "$sessions" --offered "$offered" --policy "$policy" \
  --hosts "$hosts" --holding "$holding_s" --min-interval-ms "$min_interval_ms" \
  --top-interval-ms "$top_interval_ms" --sample-interval-ms "$sample_interval_ms" \
  --delay-ms "$sim_delay_ms" --calls "$calls" --seed "$seed" --failover-attempts "$failover" "${no_call_id[@]}"
