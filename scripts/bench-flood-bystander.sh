#!/usr/bin/env bash
# Benchmark, not a test: selection's round trip at rest and under a
# stranger's flood (50,000 datagrams/s from 200 sources, msr-loadgen
# flood), beside a bystander the flood never reaches (an echo server on a
# Unix socket), timed by one client in turn, so what the host does to any
# process shows beside what the collector adds (BENCHMARKS.md, "Selection
# under a stranger's flood, beside a bystander").
#
#   [BIN=DIR] scripts/bench-flood-bystander.sh [SECONDS] [LABEL]
#       SECONDS  at rest, then under the flood (default 30)
#       BIN      binaries to run instead of this tree's release build
#
# Prints p50 and p99 of both round trips for both phases; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
label=${2:-run}
. scripts/lib/bench.sh
bench_start

cat >"$dir/echo.py" <<'PY'
import os, socket, sys, threading
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(4)
def serve(c):
    for line in c.makefile('rb'):
        c.sendall(line)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
cat >"$dir/probe.py" <<'PY'
import socket, sys, time
sock, echo, secs, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
c = socket.socket(socket.AF_UNIX); c.connect(sock); cf = c.makefile('rb')
e = socket.socket(socket.AF_UNIX); e.connect(echo); ef = e.makefile('rb')
req = b'{"op":"select","zone":"default","site":"local"}\n'
sel, ech = [], []
end = time.monotonic() + secs
while time.monotonic() < end:
    t = time.perf_counter(); c.sendall(req); line = cf.readline(); sel.append(time.perf_counter() - t)
    if b'"ok":true' not in line:
        sys.exit(f"select refused: {line!r}")
    t = time.perf_counter(); e.sendall(req); ef.readline(); ech.append(time.perf_counter() - t)
    time.sleep(0.02)
def q(a, p):
    a = sorted(a); return a[min(len(a) - 1, int(len(a) * p))] * 1e6
print(f"{label}: n={len(sel)} select p50 {q(sel, .5):.0f} p99 {q(sel, .99):.0f} us | "
      f"echo p50 {q(ech, .5):.0f} p99 {q(ech, .99):.0f} us", flush=True)
PY

sip_port=$(free_port udp)
redirect_port=$(free_port udp)
sock=$dir/control.sock
write_collector_config "$dir/collector.toml" "$sip_port" "$sock" "$dir/state.json" "[redirect]
listen = \"127.0.0.1:$redirect_port\""
"$bin/msr-collector" --config "$dir/collector.toml" -q >"$dir/collector.log" 2>&1 &
pids+=($!)
"$bin/msr-loadgen" notify --collector "127.0.0.1:$sip_port" --msrs 3 --rate 3 \
  --duration $((secs * 3 + 60)) --register-expires 3600 >"$dir/msrs.log" 2>&1 &
pids+=($!)
python3 "$dir/echo.py" "$dir/echo.sock" &
pids+=($!)
end=$(($(date +%s) + 60))
until [ "$(count_rows "$sock" healthy)" -ge 3 ]; do
  [ "$(date +%s)" -lt "$end" ] || { echo "the MSRs did not report" >&2; exit 1; }
  sleep 0.5
done
python3 "$dir/probe.py" "$sock" "$dir/echo.sock" "$secs" "$label at rest"
"$bin/msr-loadgen" flood --collector "127.0.0.1:$sip_port" --redirect "127.0.0.1:$redirect_port" \
  --rate 50000 --duration $((secs + 2)) --sources 200 >"$dir/flood.log" 2>&1 &
flood=$!
pids+=($flood)
sleep 1
python3 "$dir/probe.py" "$sock" "$dir/echo.sock" "$secs" "$label flood"
wait "$flood" || true
cat "$dir/flood.log"
grep -q panicked "$dir/collector.log" && { echo "the collector panicked:" >&2; cat "$dir/collector.log" >&2; exit 1; }
exit 0
