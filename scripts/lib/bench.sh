# Shared by the benchmark scripts (sourced, not run): their start, free
# ports, the release-build collector config they start, and counting its
# rows. Needs `bin` (the directory of the release binaries): set by
# bench_start, or by the caller.

. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

# bench_start: `bin`, the binaries to run (BIN, a directory holding another
# build's msr-collector, msr-loadgen and msrctl, for a before-and-after
# comparison; by default this tree's release build, built now); `dir`, a
# scratch folder; `pids`, the processes to kill at exit, before `dir` is
# removed.
bench_start() {
  if [ -n "${BIN:-}" ]; then
    bin=$BIN
  else
    cargo build --release --locked -q -p msr-collector -p msr-tools --bins
    bin=target/release
  fi
  dir=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}

# write_collector_config FILE SIP_PORT SOCKET STATE [EXTRA_TOML]: the bench
# collector (one account msr/msr-secret, 600 s subscriptions), plus EXTRA.
write_collector_config() {
  cat >"$1" <<CONFIG
node = "bench@localhost"
[sip]
listen = "127.0.0.1:$2"
transports = ["udp"]
realm = "msr.local"
min_expires = 10
max_expires = 3600
[[accounts]]
auth_name = "msr"
password = "msr-secret"
[subscription]
expires = 600
[control]
socket = "$3"
[state]
path = "$4"
$(case "${5:-}" in *"[http]"*) ;; *) printf '%s\n' '[http]' 'listen = "off"' ;; esac)
${5:-}
CONFIG
}

# count_rows SOCKET live|healthy: rows that are registered, subscribed and
# reporting (live), or reporting and healthy (healthy).
count_rows() {
  "$bin/msrctl" --socket "$1" --json resource list 2>/dev/null |
    python3 -c 'import json, sys
try:
    rows = json.load(sys.stdin)["rows"]
except Exception:
    print(0); sys.exit()
if sys.argv[1] == "live":
    ok = lambda r: r["status"] == "registered" and r["subscription"] == "active" and r.get("load") is not None
else:
    ok = lambda r: r.get("load") is not None and r.get("health") == "healthy"
print(sum(1 for r in rows if ok(r)))' "$2"
}
