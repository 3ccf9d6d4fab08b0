#!/usr/bin/env bash
# Benchmark, not a test: SPEC §10's rows with several core hosts in
# msr-sim (issue 47), the core failing over as the shipped Kamailio
# configuration does (SPEC §14, `failover_attempts` 3) and without failover.
#
#   scripts/bench-balancing-hosts.sh
#   CALLS=20000000 (rows with failover)  STRICT_CALLS=10000000 (without)
#   LIGHT_CALLS=10000000 (A 80 %, B 85 %)  OVERLOAD_CALLS=1000000 (120 %)
#   HOSTS_LIST="1 3 10" (the values of G)
#   BIN=target/release (set it to use built binaries)
#
# Prints one Markdown table per part; asserts nothing. msr-sim runs in
# virtual time, so the figures do not depend on what else runs on the host.
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${CALLS:-20000000}
strict_calls=${STRICT_CALLS:-10000000}
light_calls=${LIGHT_CALLS:-10000000}
overload_calls=${OVERLOAD_CALLS:-1000000}
hosts_list=${HOSTS_LIST:-1 3 10}
bin=${BIN:-target/release}
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -q -p msr-sim
fi
# The row, then the health line a failover run prints under it.
sim() { "$bin/msr-sim" run "$@" | sed -n '3p;5p'; }
header() {
  "$bin/msr-sim" run --calls 1000 | sed -n '1,2p'
}

# A 90 % for every G, both holding times and both seeds, with ARGS.
a90() {
  for hosts in $hosts_list; do
    for holding in 120 30; do
      for seed in 1 2; do
        sim --scenario a --offered 90 --hosts "$hosts" --holding "$holding" --seed "$seed" "$@"
      done
    done
  done
}

echo "## A 90 %, the core failing over (3 attempts), $calls calls a row"
header
a90 --calls "$calls" --failover-attempts 3

echo
echo "## A 90 %, no failover (a call sent to a full MSR is lost), $strict_calls calls a row"
header
a90 --calls "$strict_calls"

echo
echo "## A 80 % and B 85 %, failing over, $light_calls calls a row"
header
for hosts in 3 10; do
  for holding in 120 30; do
    sim --scenario a --offered 80 --hosts "$hosts" --holding "$holding" --seed 1 \
      --calls "$light_calls" --failover-attempts 3
    sim --scenario b --offered 85 --hosts "$hosts" --holding "$holding" --seed 1 \
      --calls "$light_calls" --failover-attempts 3
  done
done

echo
echo "## Overload, A 120 %, $overload_calls calls a row"
header
for policy in pooled ecss; do
  for hosts in $hosts_list; do
    for attempts in 1 3; do
      sim --scenario a --offered 120 --hosts "$hosts" --seed 2 --policy "$policy" \
        --calls "$overload_calls" --failover-attempts "$attempts"
    done
  done
done
