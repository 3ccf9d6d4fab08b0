#!/usr/bin/env bash
# Coverage-guided fuzzing of the daemons' parsers and sans-IO cores
# (fuzz/: cargo-afl targets on stable Rust; RELIABILITY.md "Fuzzing").
#
#   scripts/fuzz.sh [--seconds N] [TARGET...]   each target N s (default 8) on
#                                               the checked-in corpus: the CI pass
#   scripts/fuzz.sh --campaign EXECS [TARGET...] each target until EXECS executions
#
# Targets run one at a time (one core), findings go to a temp dir. Prints
# executions, execs/s, corpus count, crashes and hangs per target (from
# AFL++'s fuzzer_stats); exits non-zero if any target crashed or hung, or if
# afl-fuzz itself failed, printing each crashing or hanging input as hex with
# its path (the findings dir is then kept; it is removed otherwise).
# Reproduce a finding: `fuzz/target/release/TARGET < FILE` (panics; the short
# pass's build is in fuzz/target/ci/release/).
#
# Installs cargo-afl (which builds AFL++, without LLVM plugins) when missing.
# MSR_FUZZ_KEEP=DIR keeps every target's findings (queue included) in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=8
campaign=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --campaign) campaign="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    --*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
all=(sip_collector sip_agent sip_redirect sip_stream notify_body operator_store agent_config collector_config control_line)
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=("${all[@]}")

# cargo-afl and its AFL++ (built once per toolchain under ~/.local/share/afl.rs).
if ! cargo afl --version >/dev/null 2>&1; then
  echo "== installing cargo-afl (cargo install cargo-afl --locked)"
  cargo install cargo-afl --locked
fi
if ! { cargo afl fuzz -h 2>&1 || true; } | grep 'afl-fuzz' >/dev/null; then
  echo "== building AFL++ (cargo afl config --build)"
  cargo afl config --build
fi

# The short pass builds at opt-level 1 without debuginfo (about 40 % less
# CPU to build than the campaign's opt-level 3 with debuginfo; the targets
# run about 12 % slower), in a target dir of its own so that neither build
# invalidates the other.
if [ -n "$campaign" ]; then
  tdir=target
else
  tdir=target/ci
  export AFL_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=false
fi
echo "== cargo afl build --release (fuzz/, fuzz/$tdir)"
# Not --locked: fuzz/Cargo.lock pins what the workspace's lock pins, and a
# dependency the workspace gained since is added to it here (commit the
# change) instead of failing the pass.
(cd fuzz && CARGO_TARGET_DIR="$tdir" cargo afl build --release)

findings=$(mktemp -d "${TMPDIR:-/tmp}/msr-fuzz.XXXXXX")
keep=0
# AFL_NO_UI: periodic stat lines instead of the screen. AFL_SKIP_CPUFREQ and
# AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES: CI machines and containers cannot
# change the CPU governor or the kernel's core_pattern. AFL_NO_AFFINITY: a
# shared machine has no free core to bind to. AFL_FAST_CAL: the short pass
# spends its seconds fuzzing, not calibrating the seeds.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
[ -n "$campaign" ] || export AFL_FAST_CAL=1

failed=()
printf '%-18s %12s %10s %8s %8s %8s %7s %6s\n' target execs execs/s fuzz_s wall_s corpus crashes hangs
for t in "${targets[@]}"; do
  [ -d "fuzz/corpus/$t" ] || { echo "fuzz.sh: no corpus fuzz/corpus/$t" >&2; exit 2; }
  out="$findings/$t"
  if [ -n "$campaign" ]; then limit=(-E "$campaign"); guard=$((campaign / 100 + 600)); else limit=(-V "$seconds"); guard=$((seconds + 300)); fi
  # -t 1000: an input that runs over 1 s is a hang (AFL++ rechecks it with
  # a longer timeout before saving it).
  status=0
  start=$SECONDS
  (cd fuzz && timeout "$guard" cargo afl fuzz -i "corpus/$t" -o "$out" "${limit[@]}" -t 1000 \
    "$tdir/release/$t") >"$findings/$t.log" 2>&1 || status=$?
  stats="$out/default/fuzzer_stats"
  if [ "$status" -ne 0 ] || [ ! -f "$stats" ]; then
    echo "fuzz.sh: afl-fuzz failed on $t (exit $status); the end of $findings/$t.log:" >&2
    tail -20 "$findings/$t.log" >&2
    failed+=("$t"); keep=1; continue
  fi
  stat() { awk -F' *: *' -v k="$1" '$1 == k { print $2 }' "$stats"; }
  printf '%-18s %12s %10s %8s %8s %8s %7s %6s\n' "$t" "$(stat execs_done)" "$(stat execs_per_sec)" \
    "$(stat run_time)" "$((SECONDS - start))" "$(stat corpus_count)" "$(stat saved_crashes)" "$(stat saved_hangs)"
  bad=0
  for f in "$out"/default/crashes/id:* "$out"/default/hangs/id:*; do
    [ -e "$f" ] || continue
    # A hang saved on a loaded machine may be a stall of the whole host: one
    # that runs to its end within 10 s on its own is reported, not failed.
    case "$f" in */hangs/*)
      t0=$(date +%s%N)
      if timeout 10 "fuzz/$tdir/release/$t" <"$f" >/dev/null 2>&1; then
        echo "  slow under load, not a hang (runs in $(( ($(date +%s%N) - t0) / 1000000 )) ms on its own): $f"
        continue
      fi ;;
    esac
    bad=1
    echo "  finding: $f"
    od -An -tx1 -v "$f" | head -64 | sed 's/^/   /'
  done
  if [ "$bad" -ne 0 ]; then failed+=("$t"); keep=1; fi
done

if [ -n "${MSR_FUZZ_KEEP:-}" ]; then
  mkdir -p "$MSR_FUZZ_KEEP" && cp -r "$findings"/. "$MSR_FUZZ_KEEP"/
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (findings and logs kept in $findings)" >&2
  exit 1
fi
rm -rf "$findings"
echo "fuzz.sh: ${#targets[@]} targets, no crash, no hang"
