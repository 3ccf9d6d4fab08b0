#!/usr/bin/env bash
# Measures the agent's idle footprint (issue: "two accounts, two subscribers"):
# two collectors (two core hosts) on 127.0.0.1:5160 and :5162, one agent with
# one <dynamic> account per collector, each collector subscribed to it.
# After a warm-up, samples the agent's CPU time and resident memory over
# DURATION seconds (default 60) from /proc and prints the averages.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-60}
cargo build --release --workspace --bins --locked -q
dir=$(mktemp -d /tmp/msr-footprint.XXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
for n in 1 2; do
  port=$((5158 + 2 * n))
  sed -e "s#^listen = .*#listen = \"127.0.0.1:$port\"#" \
      -e "s#^socket = .*#socket = \"$dir/c$n.sock\"#" \
      -e "s#^path = .*#path = \"$dir/c$n.json\"#" \
      -e "s#^node = .*#node = \"core$n@localhost\"#" \
      config-examples/collector.toml > "$dir/c$n.toml"
  # Two collectors: neither takes the default HTTP port 8080 (SPEC §11).
  printf '[http]\nlisten = "off"\n' >> "$dir/c$n.toml"
  target/release/msr-collector --config "$dir/c$n.toml" -q &
done
sed -e 's#<dynamic msr_name="msr_1" realm="sip:127.0.0.1:5060"\(.*\)/>#<dynamic msr_name="msr_1" realm="sip:127.0.0.1:5160"\1/>\n        <dynamic msr_name="msr_1" realm="sip:127.0.0.1:5162"\1/>#' \
    -e 's#port="5070"#port="5170"#' \
    config-examples/msr-loopback.xml > "$dir/agent.xml"
target/release/msr-agent --config "$dir/agent.xml" --log-stderr -q &
agent=$!
sleep 5
for n in 1 2; do
  target/release/msrctl --socket "$dir/c$n.sock" subscription list
done
ticks() { awk '{print $14 + $15}' "/proc/$agent/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); s0=$(date +%s.%N)
sleep "$DURATION"
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
echo "agent pid $agent over ${DURATION}s:"
awk -v t0="$t0" -v t1="$t1" -v s0="$s0" -v s1="$s1" -v hz="$hz" \
  'BEGIN { printf "  cpu: %.3f %% of one core (%d ticks at %d Hz)\n", 100 * (t1 - t0) / hz / (s1 - s0), t1 - t0, hz }'
echo "  resident memory: $((rss / 1024)) MiB now ($rss KiB), peak $((hwm / 1024)) MiB ($hwm KiB)"
