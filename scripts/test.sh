#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine.
#
# Installs what the tests need and the machine lacks (scripts/deps.sh: SIPp,
# Kamailio, etcd, promtool, protoc, rtpengine, jq, nftables from Debian's
# packages), runs the Debian package test (scripts/package-test.sh: build,
# lintian, dpkg -i, the installed daemons on loopback, dpkg --purge), the
# simulator's validation against closed forms (msr-sim validate), then the
# unit, property and system tests, then the fault suite (scripts/faults.sh)
# and the short fuzz pass (scripts/fuzz.sh). The package test, the fault
# suite and the fuzz pass count as one test each in the closing summary.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p msr-agent`)
# and skip the package test (as does MSR_SKIP_PACKAGE_TEST=1), the
# simulator's validation, the fault suite and the fuzz pass.
set -euo pipefail
cd "$(dirname "$0")/.."

# SIPp (sip-tester), Kamailio, etcd (etcd-server), promtool (prometheus) and protoc
# (protobuf-compiler), from Debian's packages, when missing.
scripts/deps.sh
echo "== $(sipp -v 2>/dev/null | grep -m1 -i 'sipp v' || echo 'sipp installed')"
echo "== $(etcd --version 2>/dev/null | head -1), $(protoc --version), $(kamailio -v 2>/dev/null | head -1), $(promtool --version 2>&1 | head -1)"

extra_passed=0
extra_failed=0
if [ "$#" -eq 0 ] && [ "${MSR_SKIP_PACKAGE_TEST:-0}" != "1" ]; then
  echo "== Debian packages (scripts/package-test.sh)"
  if timeout 3000 scripts/package-test.sh; then extra_passed=1; else extra_failed=1; fi
else
  echo "== Debian packages: skipped (arguments given, or MSR_SKIP_PACKAGE_TEST=1)"
fi

# The system tests run the real binaries from target/debug; `cargo test`
# alone builds only the test targets' own crates, so build every binary first.
echo "== cargo build (binaries used by the system tests)"
cargo build --workspace --bins --locked
if [ "$#" -eq 0 ]; then
  echo "== msr-sim validate (Erlang-B one MSR, pooled oracle, Takacs round robin; SPEC §10)"
  cargo run --release --locked -q -p msr-sim -- validate --calls 1000000 --seed 1
else
  echo "== msr-sim validate: skipped (arguments given)"
fi
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
# The fault suite (scripts/faults.sh; RELIABILITY.md "Fault suite") on the
# binaries just built, with 60 s of packet loss, and the short fuzz pass:
# every target 8 s on the checked-in corpus (about a minute, plus the fuzz
# crate's release build; installs cargo-afl when missing). Each counts as
# one test in the summary. Skipped with arguments, as the package test, or
# with MSR_SKIP_FAULTS=1 / MSR_SKIP_FUZZ=1.
if [ "$#" -eq 0 ] && [ "${MSR_SKIP_FAULTS:-0}" != "1" ]; then
  echo "== fault suite (scripts/faults.sh)"
  if scripts/faults.sh; then extra_passed=$((extra_passed + 1)); else extra_failed=$((extra_failed + 1)); fi
else
  echo "== fault suite: skipped (arguments given, or MSR_SKIP_FAULTS=1)"
fi
if [ "$#" -eq 0 ] && [ "${MSR_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== fuzz (scripts/fuzz.sh: 8 s per target)"
  if scripts/fuzz.sh; then extra_passed=$((extra_passed + 1)); else extra_failed=$((extra_failed + 1)); fi
else
  echo "== fuzz: skipped (arguments given, or MSR_SKIP_FUZZ=1)"
fi
# One closing line for the whole run: the sum of every test binary's result
# and the package test's, the fault suite's and the fuzz pass's.
awk -v p="$extra_passed" -v f="$extra_failed" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
if [ "$extra_failed" -ne 0 ] && [ "$status" -eq 0 ]; then status=1; fi
exit "$status"
