#!/usr/bin/env bash
# Try the rtpengine setup of docs/rtpengine.md on one host, on 127.0.0.1:
# a collector, three rtpengines (user space), an msr-agent beside each
# (calls-source="rtpengine"), Kamailio with the shipped
# config-examples/kamailio/kamailio.cfg on path C (-A WITH_RTPENGINE), then
# SIPp test calls with RTP both ways through Kamailio and the rtpengine the
# collector chose for each. Prints the tables and each rtpengine's share,
# checks that every call succeeded and that each rtpengine relayed exactly
# the calls the collector placed on it, and stops everything on exit.
# tests/it/try_rtpengine.rs runs it, so this guide stays true.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/try-rtpengine.sh [OPTIONS]

Brings up on 127.0.0.1, from the built binaries: msr-collector, three
rtpengines (rtpe_1..3, user space, each with its own ng and HTTP port), an
msr-agent beside each, and Kamailio with config-examples/kamailio/kamailio.cfg
on path C. Then places test calls with RTP (tests/sipp/rtp_caller_uac.xml to
tests/sipp/rtp_callee_uas.xml) through Kamailio, prints `msrctl resource
list` while they are up and each rtpengine's share afterwards, and stops
everything on exit (Ctrl-C too).

Options:
  --calls N          calls to place (default 30)
  --rate N           calls per second (default 10)
  --hold MS          each call's length with RTP, milliseconds (default 5000)
  --max-calls A,B,C  the agents' max-calls (default 100,100,100)
  --rtp-base PORT    first RTP port: the rtpengines take 3 x 200 ports from
                     there, the SIPp callee and caller 4 per call each after
                     them (default 23000: outside the kernel's ephemeral
                     ports and the ranges the system tests bind)
  --release          run target/release's binaries (default target/debug,
                     or target/release when only it is built, as after
                     scripts/quickstart.sh; $CARGO_TARGET_DIR is honoured)
  --build            cargo build --workspace --bins (with --release) first
  --keep             keep the run folder (configs, logs) after a success;
                     after a failure it is always kept
  -h, --help         this help

Needs rtpengine, kamailio (with kamailio-utils-modules for http_client and
kamailio-json-modules), kamcmd, sipp, curl and ss: scripts/deps.sh installs
them on Debian. Runs in about 20 s with the defaults.
EOF
}

die() {
  echo "try-rtpengine: $*" >&2
  exit 2
}

calls=30 rate=10 hold=5000 max_calls=100,100,100 rtp_base=23000
profile="" build="" keep=""
while [ $# -gt 0 ]; do
  case $1 in
    --calls) calls=${2:?--calls needs a number}; shift ;;
    --rate) rate=${2:?--rate needs a number}; shift ;;
    --hold) hold=${2:?--hold needs milliseconds}; shift ;;
    --max-calls) max_calls=${2:?--max-calls needs A,B,C}; shift ;;
    --rtp-base) rtp_base=${2:?--rtp-base needs a port}; shift ;;
    --release) profile=release ;;
    --build) build=1 ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
  shift
done
for n in "$calls" "$rate" "$hold" "$rtp_base"; do
  [[ $n =~ ^[1-9][0-9]{0,5}$ ]] || die "not a positive number: $n"
done
IFS=, read -r -a capacities <<<"$max_calls"
[ "${#capacities[@]}" -eq 3 ] || die "--max-calls takes three numbers, A,B,C: $max_calls"
for n in "${capacities[@]}"; do
  [[ $n =~ ^[1-9][0-9]{0,5}$ ]] || die "not a positive number in --max-calls: $n"
done

# The binaries: where cargo puts them. A relative CARGO_TARGET_DIR is
# cargo's, relative to where it was run: here, before the cd below.
target_dir=${CARGO_TARGET_DIR:-}
if [ -n "$target_dir" ] && [ "${target_dir#/}" = "$target_dir" ]; then
  target_dir=$PWD/$target_dir
fi
cd "$(dirname "$0")/.."
root=$PWD
target_dir=${target_dir:-$root/target}
built() { for b in msr-collector msr-agent msrctl; do [ -x "$target_dir/$1/$b" ] || return 1; done; }
if [ -z "$profile" ]; then
  profile=debug
  if [ -z "$build" ] && ! built debug && built release; then
    profile=release
    echo "==> no debug build: running target/release's binaries"
  fi
fi
if [ -n "$build" ]; then
  flag=()
  [ "$profile" = release ] && flag=(--release)
  echo "==> building (cargo build ${flag[*]} --workspace --bins)"
  CARGO_TARGET_DIR=$target_dir cargo build "${flag[@]}" --workspace --bins --locked
fi
bin=$target_dir/$profile
for b in msr-collector msr-agent msrctl; do
  [ -x "$bin/$b" ] || die "no $bin/$b: build first (cargo build --workspace --bins$([ "$profile" = release ] && echo " --release"), or --build)"
done
for tool in rtpengine kamailio kamcmd sipp curl ss; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed: scripts/deps.sh installs it"
done

# Control ports from scripts/lib/ports.sh (10000..19999, below the
# ephemeral range); a port picked here is not bound until its daemon
# starts, so the ones already picked are skipped.
. scripts/lib/ports.sh
picked=" "
pick() {
  local p
  while :; do
    p=$(free_port udp)
    case $picked in *" $p "* | *" $((p + 1)) "*) continue ;; esac
    picked+="$p $((p + 1)) "
    printf -v "$1" '%s' "$p"
    return
  done
}

# The RTP ports: the rtpengines' ranges, then the callee's and the caller's
# (SIPp gives call N the port -mp + 4 (N - 1)). They must be free now.
span=$((4 * calls + 4))
callee_mp=$((rtp_base + 600))
caller_mp=$((callee_mp + span))
rtp_end=$((caller_mp + span - 1))
[ "$rtp_end" -le 65535 ] || die "--rtp-base $rtp_base with $calls calls runs past port 65535"
if ss -Htuan "( sport >= :$rtp_base and sport <= :$rtp_end )" | grep -q .; then
  die "RTP ports $rtp_base..$rtp_end are in use: choose others with --rtp-base"
fi

run=$(mktemp -d "${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/try-rtpengine.XXXXXX")
echo "==> run folder $run (configs and logs)"
pids=()
ok=""
cleanup() {
  local pid i
  # Reverse order: the callee and Kamailio first, the collector last, so
  # the agents unregister from a collector that is still there.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "${pids[i]}" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  if [ -n "$ok" ] && [ -z "$keep" ]; then
    rm -rf "$run"
  else
    echo "==> run folder kept: $run"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# waits SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds.
waits() {
  local limit=$1 what=$2
  shift 2
  for _ in $(seq $((limit * 10))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "try-rtpengine: $what: not within ${limit} s" >&2
  return 1
}

# 1. The collector: config-examples/collector.toml with this run's socket,
# store and free ports (port 0: it announces the ones it got).
sed -e 's|^listen = "127.0.0.1:5060"|listen = "127.0.0.1:0"|' \
  -e "s|^socket = .*|socket = \"$run/control.sock\"|" \
  -e "s|^path = .*|path = \"$run/state.json\"|" \
  config-examples/collector.toml >"$run/collector.toml"
printf '\n[http]\nlisten = "127.0.0.1:0"\n' >>"$run/collector.toml"
grep -q '^listen = "127.0.0.1:0"' "$run/collector.toml" || die "config-examples/collector.toml changed: no [sip] listen to rewrite"
"$bin/msr-collector" --config "$run/collector.toml" >"$run/collector.log" 2>&1 &
pids+=($!)
announced() { grep -o "listening on $1 127.0.0.1:[0-9]*" "$run/collector.log" | head -1 | sed 's/.*://'; }
waits 10 "the collector announcing its ports" grep -q "listening on http" "$run/collector.log"
sip_port=$(announced udp)
http_port=$(announced http)
msrctl=("$bin/msrctl" --socket "$run/control.sock")
waits 10 "the collector's control socket" "${msrctl[@]}" site list
echo "==> collector: SIP 127.0.0.1:$sip_port, HTTP http://127.0.0.1:$http_port, msrctl --socket $run/control.sock"

# 2. Three rtpengines, each its own rtpengine.conf: the ng port Kamailio
# and the agent talk to, an HTTP port of its own (its /metrics: what it
# relayed), no CLI port (the package file's fixed ones would collide).
ng=() rhttp=()
for i in 1 2 3; do
  pick port
  pick hport
  ng+=("$port")
  rhttp+=("$hport")
  min=$((rtp_base + (i - 1) * 200))
  cat >"$run/rtpe_$i.conf" <<EOF
[rtpengine]
# user space: no kernel module needed
table = -1
interface = 127.0.0.1
listen-ng = 127.0.0.1:$port
listen-http = 127.0.0.1:$hport
port-min = $min
port-max = $((min + 199))
# a deleted call leaves rtpengine's count at once
delete-delay = 0
EOF
  rtpengine --config-file="$run/rtpe_$i.conf" --foreground --log-stderr >"$run/rtpe_$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do
  waits 10 "rtpe_$i's HTTP port" curl -sf "http://127.0.0.1:${rhttp[i - 1]}/metrics"
done
echo "==> rtpengines: ng ports ${ng[*]}"

# 3. An agent beside each: config-examples/msr-rtpengine.xml with its
# rtpengine's ports, the collector's address and its own name.
for i in 1 2 3; do
  min=$((rtp_base + (i - 1) * 200))
  sed -e "s|port=\"2223\"|port=\"${ng[i - 1]}\"|g" \
    -e "s|realm=\"sip:127.0.0.1:5060\"|realm=\"sip:127.0.0.1:$sip_port\"|" \
    -e "s|msr_name=\"rtpe_1\"|msr_name=\"rtpe_$i\"|" \
    -e "s|max-calls=\"2000\"|max-calls=\"${capacities[i - 1]}\"|" \
    -e "s|port-start=\"30000\" port-range=\"10001\"|port-start=\"$min\" port-range=\"200\"|" \
    -e 's|sip-port="5064"|sip-port="0"|' \
    config-examples/msr-rtpengine.xml >"$run/rtpe_$i.xml"
  # The example's values this rewrites must still be there.
  for want in "realm=\"sip:127.0.0.1:$sip_port\"" "msr_name=\"rtpe_$i\"" \
    "<mcc bind-addr=\"127.0.0.1\" port=\"${ng[i - 1]}\"" "port-range=\"200\"" 'sip-port="0"'; do
    grep -qF "$want" "$run/rtpe_$i.xml" || die "config-examples/msr-rtpengine.xml changed: no $want after the rewrite"
  done
  "$bin/msr-agent" --config "$run/rtpe_$i.xml" --check-config >"$run/rtpe_$i-check.log" 2>&1 ||
    die "msr-agent --check-config refused $run/rtpe_$i.xml: $(cat "$run/rtpe_$i-check.log")"
  "$bin/msr-agent" --config "$run/rtpe_$i.xml" --log-stderr \
    --control-socket "$run/rtpe_$i.sock" >"$run/agent_$i.log" 2>&1 &
  pids+=($!)
done
# Registered, subscribed and reporting: three healthy rows.
healthy() { [ "$("${msrctl[@]}" --json resource list | grep -c '"health": *"healthy"')" -eq 3 ]; }
waits 20 "three rtpengine MSRs healthy in msrctl resource list" healthy

# 4. Kamailio, the shipped config as it is, path C; only its defines set.
mkdir "$run/rtpengine-db"
cp config-examples/kamailio/rtpengine-db/version "$run/rtpengine-db/"
{
  head -1 config-examples/kamailio/rtpengine-db/rtpengine
  for i in 1 2 3; do echo "$i:$i:udp\\:127.0.0.1\\:${ng[i - 1]}:1:0:0"; done
} >"$run/rtpengine-db/rtpengine"
pick kam_port
kamailio -DD -E -f config-examples/kamailio/kamailio.cfg -Y "$run" \
  -A WITH_RTPENGINE \
  -A "LISTEN=udp:127.0.0.1:$kam_port" \
  -A "CTL_SOCKET=\"unix:$run/kamailio.ctl\"" \
  -A "HTTP_API=\"http://127.0.0.1:$http_port\"" \
  -A "RTPENGINE_DB=\"text://$run/rtpengine-db\"" >"$run/kamailio.log" 2>&1 &
pids+=($!)
waits 10 "Kamailio's control socket" kamcmd -s "unix:$run/kamailio.ctl" core.version
echo "==> kamailio: 127.0.0.1:$kam_port (path C, the rtpengine table in $run/rtpengine-db)"
echo
"${msrctl[@]}" resource list

# 5. The calls: the callee answers with its SDP and sends RTP; the caller
# sends its INVITE to Kamailio (-rsa) for the callee, then RTP. Both loop
# one second of PCMA silence (0xd5), made here: no audio file in the repo.
head -c 8000 /dev/zero | tr '\0' '\325' >"$run/audio.pcma"
pick callee_port
(cd "$run" && exec sipp -sf "$root/tests/sipp/rtp_callee_uas.xml" -i 127.0.0.1 \
  -p "$callee_port" -mp "$callee_mp" -nostdin >"$run/callee.log" 2>&1) &
pids+=($!)
pick caller_port
echo
echo "==> $calls calls at $rate/s, each $hold ms with RTP both ways, through Kamailio"
started=$SECONDS
(cd "$run" && exec timeout 300 sipp -sf "$root/tests/sipp/rtp_caller_uac.xml" -i 127.0.0.1 \
  -p "$caller_port" -mp "$caller_mp" -m "$calls" -r "$rate" -d "$hold" \
  -timeout 120s -nostdin -rsa "127.0.0.1:$kam_port" "127.0.0.1:$callee_port" \
  >"$run/caller.log" 2>&1) &
caller=$!
pids+=("$caller")
# While the calls are up (all placed, the first not yet ended, the agents'
# next sample and NOTIFY in): each rtpengine's count.
placing=$((calls * 1000 / rate + 1500))
sleep "$(((placing < hold ? placing : hold) / 1000)).$(((placing < hold ? placing : hold) % 1000 / 100))"
echo
echo "==> while the calls are up: Calls is what each agent last reported (a NOTIFY each time the load"
echo "    moves by load-delta, 5 points), Live legs the calls the collector placed there"
"${msrctl[@]}" resource list
code=0
wait "$caller" || code=$?
echo "==> the calls took $((SECONDS - started)) s; SIPp exited $code"
sipp_total() { grep "^ *$1" "$run/caller.log" | tail -1 | awk -F'|' '{gsub(/ /, "", $NF); print $NF}'; }
successful=$(sipp_total "Successful call")
failed=$(sipp_total "Failed call")

# 6. The shares: what the collector placed on each MSR (its /metrics), and
# what each rtpengine relayed (its own /metrics), once the BYEs are through.
idle() { curl -sf "http://127.0.0.1:$1/metrics" | grep -q '^rtpengine_sessions{type="own"} 0$'; }
for i in 1 2 3; do waits 10 "rtpe_$i empty after the BYEs" idle "${rhttp[i - 1]}" || true; done
metrics=$(curl -sf "http://127.0.0.1:$http_port/metrics")
placed_on() {
  echo "$metrics" | grep '^msr_collector_msr_selections_total{' | grep "msr=\"$1\"" |
    grep -E 'leg="(new|reanchored)"' | awk '{s += $2} END {print s + 0}'
}
relayed_by() { curl -sf "http://127.0.0.1:$1/metrics" | awk '$1 == "rtpengine_sessions_total" {print $2 + 0}'; }
packets_by() { curl -sf "http://127.0.0.1:$1/metrics" | awk '$1 == "rtpengine_packets_total{type=\"userspace\"}" {print $2 + 0}'; }
echo
echo "==> shares: placed by the collector (msr_collector_msr_selections_total), relayed by each rtpengine (its /metrics)"
agree=1 empty=""
total=0
for i in 1 2 3; do total=$((total + $(placed_on "rtpe_$i"))); done
for i in 1 2 3; do
  p=$(placed_on "rtpe_$i")
  r=$(relayed_by "${rhttp[i - 1]}")
  k=$(packets_by "${rhttp[i - 1]}")
  share=$(awk -v p="$p" -v t="$total" 'BEGIN {printf "%5.1f", t ? 100 * p / t : 0}')
  printf '  rtpe_%s  max-calls %4s  placed %4s (%s %%)  relayed %4s calls, %s RTP packets\n' \
    "$i" "${capacities[i - 1]}" "$p" "$share" "${r:-?}" "${k:-?}"
  [ "$p" = "${r:-}" ] || agree=""
  [ "$p" -gt 0 ] || empty+=" rtpe_$i"
done
echo
echo "$(printf '%s' "${successful:-0}") of $calls calls succeeded, ${failed:-0} failed"
if [ -n "$agree" ]; then
  echo "each rtpengine relayed exactly the calls the collector placed on it"
else
  echo "an rtpengine relayed other calls than the collector placed on it: see $run/kamailio.log"
fi
if [ -z "$empty" ]; then
  echo "every rtpengine got calls"
else
  echo "no call on$empty (with few calls the collector's weighted draw may skip one)"
fi
if [ "$code" -eq 0 ] && [ "${successful:-0}" = "$calls" ] && [ -n "$agree" ]; then
  ok=1
  echo "try-rtpengine: ok"
else
  echo "try-rtpengine: FAILED (logs in $run)" >&2
  exit 1
fi
