#!/usr/bin/env bash
# The fault suite (RELIABILITY.md "Fault suite"): faults played against the
# real daemons (target/debug, as the system tests use them; built when
# missing), every check an observable condition polled with a bound.
#
#   scripts/faults.sh [--loss-seconds N] [--transports LIST] [kill|loss|spoof ...]
#
# Default: every part; kill and loss once per transport of LIST (default
# "udp tcp tls"): the agents register to a `sip:` realm over UDP, a
# `sip:…;transport=tcp` one, or a `sips:` one with mutual TLS and
# `[sip.tls] require` (certificates made with openssl). spoof is UDP only.
#
#   kill   kill -9 of the collector while msrctl commits operator changes and
#          the agents report load changes: after the restart every
#          acknowledged change is there and every MSR is registered and
#          reporting again (bindings restored from the store, no REGISTER);
#          kill -9 of an agent: restarted, its MSR is registered and its
#          fresh load shown.
#   loss   20 % packet loss both ways between one agent and the collector for
#          N s (default 60; 300 for the benchmark figure), the two in network
#          namespaces of their own joined by a veth pair, an nftables
#          `numgen random mod 100 < 20 drop` on each side's output (UDP
#          datagrams, or TCP segments over TCP and TLS): every load change
#          reaches the table, the subscription is active at the end, the MSR
#          is never shown unregistered. Needs root, ip (iproute2), nft.
#   spoof  requests from a source with no business sending them change
#          nothing: a REGISTER reusing the binding's Call-ID with a lower
#          CSeq and Expires: 0 (RFC 3261 §10.3 step 7); a NOTIFY with the live
#          dialog's Call-ID and tags from another address (SPEC §4).
#
# Prints the figures (recovery times, loss measured, NOTIFYs, re-subscriptions)
# and exits non-zero on the first failed check, with the end of the logs.
set -euo pipefail
cd "$(dirname "$0")/.."

loss_seconds=60
transports="udp tcp tls"
parts=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --loss-seconds) loss_seconds="$2"; shift 2 ;;
    --transports) transports="${2//,/ }"; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    kill|loss|spoof) parts+=("$1"); shift ;;
    *) echo "faults.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "${#parts[@]}" -gt 0 ] || parts=(kill loss spoof)
for t in $transports; do
  case "$t" in udp|tcp|tls) ;; *) echo "faults.sh: --transports: unknown transport $t (udp, tcp, tls)" >&2; exit 2 ;; esac
done

bin=${MSR_BIN_DIR:-target/debug}
if [ ! -x "$bin/msr-collector" ] || [ ! -x "$bin/msr-agent" ] || [ ! -x "$bin/msrctl" ]; then
  cargo build --workspace --bins --locked
fi
bin=$(cd "$bin" && pwd)
need_tools=(jq ss)
case " $transports " in *" tls "*) need_tools+=(openssl) ;; esac
for tool in "${need_tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "faults.sh: $tool missing (scripts/deps.sh installs it)" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/msr-faults.XXXXXX")
pids=()
netns=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for n in "${netns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  if [ "${keep:-0}" = 1 ]; then echo "faults.sh: logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

fail() {
  echo "faults.sh: FAILED: $*" >&2
  for f in "$work"/*.log; do
    [ -e "$f" ] || continue
    echo "--- end of $f" >&2
    tail -25 "$f" >&2
  done
  keep=1
  exit 1
}
now_ms() { date +%s%3N; }
. scripts/lib/ports.sh
# wait_until SECONDS COMMAND...: polls COMMAND every 0.1 s; false after SECONDS.
wait_until() {
  local limit=$(( $(now_ms) + $1 * 1000 )); shift
  until "$@"; do
    [ "$(now_ms)" -lt "$limit" ] || return 1
    sleep 0.1
  done
}
# Removes PID from the list of processes to kill at the end.
forget() { local keep_pids=() p; for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep_pids+=("$p"); done; pids=("${keep_pids[@]}"); }

# --- the daemons ------------------------------------------------------------
# The transport the agents register over: udp, tcp or tls (the main loop
# sets it for each run of a part).
tr=udp
# pki: a CA, the collector's certificate (IP 127.0.0.1 and 10.212.0.1) and
# one client certificate naming msr_1, msr_2 and msr_3 (DNS subject
# alternative names, as mutual TLS checks them), once per run.
pki() {
  [ ! -e "$work/ca.pem" ] || return 0
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=msr faults ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$work/ca.key" -out "$work/ca.pem" 2>>"$work/openssl.log" || fail "tls: openssl could not make the CA"
  leaf_cert collector "IP:127.0.0.1,IP:10.212.0.1"
  leaf_cert agent "DNS:msr_1,DNS:msr_2,DNS:msr_3"
}
leaf_cert() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
    -keyout "$work/$1.key" -out "$work/$1.csr" 2>>"$work/openssl.log" || fail "tls: openssl could not make $1's key"
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' "$2" >"$work/$1.ext"
  openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
    -days 2 -extfile "$work/$1.ext" -out "$work/$1.pem" 2>>"$work/openssl.log" || fail "tls: openssl could not sign $1's certificate"
}
# realm HOST PORT: the agent's realm for the collector at HOST, whose SIP
# port is PORT (its TLS port PORT + 1), over $tr.
realm() {
  case "$tr" in
    udp) echo "sip:$1:$2" ;;
    tcp) echo "sip:$1:$2;transport=tcp" ;;
    tls) echo "sips:$1:$(($2 + 1))" ;;
  esac
}
# collector NAME LISTEN_ADDR PORT [NETNS]: writes NAME.toml (as the system
# tests' collectors: min_expires 2, subscription expiry 60 s, HTTP off; over
# tls a [sip.tls] on PORT + 1 with mutual TLS, required) and starts it; sets
# $collector_pid and waits for its control socket.
collector_start() {
  local name=$1 addr=$2 port=$3 ns=${4:-}
  if [ ! -e "$work/$name.toml" ]; then
    local transports_toml='["udp"]'
    case "$tr" in tcp) transports_toml='["udp", "tcp"]' ;; tls) transports_toml='["udp", "tls"]' ;; esac
    cat >"$work/$name.toml" <<EOF
node = "$name@faults"
[sip]
listen = "$addr:$port"
transports = $transports_toml
realm = "msr.local"
min_expires = 2
max_expires = 3600
[[accounts]]
auth_name = "msr"
password = "msr-secret"
[defaults]
zone = "default"
site = "local"
[subscription]
event = "eltex-call-count"
expires = 60
[control]
socket = "$work/$name.sock"
[state]
path = "$work/$name-state.json"
[http]
listen = "off"
EOF
    if [ "$tr" = tls ]; then
      pki
      cat >>"$work/$name.toml" <<EOF
[sip.tls]
listen = "$addr:$((port + 1))"
cert = "$work/collector.pem"
key = "$work/collector.key"
client_ca = "$work/ca.pem"
require = true
EOF
    fi
  fi
  local run=()
  [ -z "$ns" ] || run=(ip netns exec "$ns")
  "${run[@]}" "$bin/msr-collector" --config "$work/$name.toml" >>"$work/$name.log" 2>&1 &
  collector_pid=$!
  pids+=("$collector_pid")
  sock="$work/$name.sock"
  wait_until 10 ctl site list || fail "collector $name: control socket did not answer within 10 s"
}
ctl() { "$bin/msrctl" --socket "$sock" "$@" >/dev/null 2>&1; }
rows() { "$bin/msrctl" --socket "$sock" --json resource list 2>/dev/null; }
subs() { "$bin/msrctl" --socket "$sock" --json subscription list 2>/dev/null; }
# live MSR [LOAD]: registered, subscription active, a load (that load) shown.
live() {
  rows | jq -e --arg m "$1" --arg l "${2:-}" \
    'any(.rows[]; .msr == $m and .status == "registered" and .subscription == "active" and .load != null and ($l == "" or .load == ($l | tonumber)))' >/dev/null
}

# over_transport MSR: the MSR's contact is one $tr reaches (a sips: URI over
# tls, ;transport=tcp over tcp, neither over udp).
over_transport() {
  rows | jq -e --arg m "$1" --arg t "$tr" '
    any(.rows[]; .msr == $m and (.uri | if $t == "tls" then startswith("sips:")
      elif $t == "tcp" then test(";transport=tcp")
      else startswith("sip:") and (test(";transport=") | not) end))' >/dev/null
}

# agent NAME MSR REALM BIND_ADDR ENGINE_PORT REGISTER_EXPIRES [NETNS]: writes
# NAME.xml (calls from the file NAME.calls, max-calls 100: calls = load %;
# over tls the CA and the client certificate) and starts it; sets $agent_pid.
agent_start() {
  local name=$1 msr=$2 realm=$3 addr=$4 engine=$5 reg=$6 ns=${7:-}
  [ -e "$work/$name.calls" ] || echo 10 >"$work/$name.calls"
  local tls_attributes=""
  [ "$tr" != tls ] || tls_attributes=" tls-ca=\"$work/ca.pem\" tls-cert=\"$work/agent.pem\" tls-key=\"$work/agent.key\""
  cat >"$work/$name.xml" <<EOF
<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2025">
    <general log-level="3" log-rotate="no" max-calls="100" load-sensor="calls" load-delta="5"/>
    <transport bind-addr="$addr" port="$engine" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
    <codec pcma="1" pcmu="2"/>
    <accounts>
        <dynamic msr_name="$msr" realm="$realm" auth_name="msr" auth_password="msr-secret" dtmf_mode="rfc"/>
    </accounts>
    <pbyte>
        <mcc bind-addr="$addr" port="$((engine + 1))"/>
    </pbyte>
    <agent engine-probe="off" sip-port="0" register-expires="$reg" max-subscription-expires="3600" calls-source="file:$work/$name.calls" notify-min-interval-ms="1000" sample-interval-ms="200"$tls_attributes/>
</config>
EOF
  local run=()
  [ -z "$ns" ] || run=(ip netns exec "$ns")
  "${run[@]}" "$bin/msr-agent" --config "$work/$name.xml" --log-stderr >>"$work/$name.log" 2>&1 &
  agent_pid=$!
  pids+=("$agent_pid")
}
# set_calls NAME N: the media engine now reports N sessions (atomic rename).
set_calls() { echo "$2" >"$work/.$1.calls.tmp" && mv "$work/.$1.calls.tmp" "$work/$1.calls"; }
kill9() { kill -9 "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; forget "$1"; }

# --- kill: kill -9 of either daemon mid-traffic -----------------------------
part_kill() {
  echo "== kill ($tr): kill -9 of the collector and of an agent, mid-traffic"
  local port msr i kc="kc-$tr" ka="ka-$tr-"
  port=$(free_port)
  collector_start "$kc" 127.0.0.1 "$port"
  local kc_pid=$collector_pid
  # Registrations of 300 s: nothing below comes back through a REGISTER
  # refresh. Over UDP it comes back through the collector's saved bindings;
  # over TCP and TLS the agents see their connections close and register
  # again at once (the collector can't reach them otherwise).
  declare -A apid
  for i in 1 2 3; do
    agent_start "$ka$i" "msr_$i" "$(realm 127.0.0.1 "$port")" 127.0.0.1 "$((5090 + 2 * i))" 300
    apid[$i]=$agent_pid
  done
  for i in 1 2 3; do wait_until 15 live "msr_$i" 10 || fail "kill: msr_$i not live within 15 s"; done
  for i in 1 2 3; do over_transport "msr_$i" || fail "kill: msr_$i's contact is not over $tr: $(rows)"; done
  wait_until 5 all_saved "$kc" 3 || fail "kill: the bindings were not saved within 5 s"

  # Traffic: msrctl commits operator changes one after another (each
  # acknowledged one is written down), selections run and the agents'
  # loads change, until the collector is killed under them.
  : >"$work/acked"
  ( n=0; while :; do n=$((n + 1)); ctl site declare "fault_$n" && echo "fault_$n" >>"$work/acked"; done ) &
  local writer=$!; pids+=("$writer")
  ( while :; do ctl select --zone default --site local || true; done ) &
  local selector=$!; pids+=("$selector")
  ( c=10; while :; do c=$(( c == 10 ? 30 : 10 )); set_calls "${ka}1" "$c"; sleep 0.3; done ) &
  local loader=$!; pids+=("$loader")
  wait_until 20 acked_at_least 50 || fail "kill: fewer than 50 operator changes acknowledged within 20 s"
  kill9 "$kc_pid"
  kill9 "$writer"; kill9 "$selector"; kill9 "$loader"
  local acked; acked=$(wc -l <"$work/acked")
  set_calls "${ka}1" 20
  local t0; t0=$(now_ms)
  collector_start "$kc" 127.0.0.1 "$port"
  kc_pid=$collector_pid
  for i in 1 2 3; do
    want=10; [ "$i" = 1 ] && want=20
    wait_until 10 live "msr_$i" "$want" || fail "kill: msr_$i not back within 10 s of the collector's restart"
  done
  local back=$(( $(now_ms) - t0 ))
  "$bin/msrctl" --socket "$sock" --json site list >"$work/sites.json" || fail "kill: site list"
  local missing
  missing=$(jq -r '[.. | strings] as $s | input | split("\n") | map(select(. != "" and (. as $x | $s | index($x) | not))) | .[]' \
    "$work/sites.json" <(jq -Rs . "$work/acked") | head -5)
  [ -z "$missing" ] || fail "kill: acknowledged sites lost after kill -9: $missing"
  grep -q "bindings restored" "$work/$kc.log" || fail "kill: no 'bindings restored' in the collector's log"
  local how="from the saved bindings"
  [ "$tr" = udp ] || how="the agents registered again over new connections"
  echo "   collector kill -9 mid-traffic ($tr): $acked/$acked acknowledged operator changes survived; 3/3 MSRs registered, subscribed and reporting (msr_1's change made while it was down included) ${back} ms after the restart ($how)"

  # An agent: kill -9, a load change while it is down, restart.
  kill9 "${apid[2]}"
  set_calls "${ka}2" 40
  t0=$(now_ms)
  agent_start "${ka}2" msr_2 "$(realm 127.0.0.1 "$port")" 127.0.0.1 5094 300
  apid[2]=$agent_pid
  wait_until 10 live msr_2 40 || fail "kill: msr_2 not registered and reporting within 10 s of its restart"
  back=$(( $(now_ms) - t0 ))
  set_calls "${ka}2" 60
  wait_until 10 live msr_2 60 || fail "kill: msr_2's next load change not shown within 10 s"
  echo "   agent kill -9 ($tr): msr_2 registered with its fresh load ${back} ms after its restart; its next change shown"
  for i in 1 2 3; do kill9 "${apid[$i]}"; done
  kill9 "$kc_pid"
}
acked_at_least() { [ "$(wc -l <"$work/acked")" -ge "$1" ]; }
# all_saved NAME N: the collector NAME's bindings file holds N bindings.
all_saved() { [ "$(jq '.bindings | length' "$work/$1-state.json.bindings" 2>/dev/null || echo 0)" -ge "$2" ]; }

# --- loss: 20 % both ways in network namespaces ------------------------------
# NOTIFY and SUBSCRIBE are told apart by the first 6 bytes of the UDP payload
# (the request line), so that the figures say how many of each were sent
# and dropped.
NOTIFY_HEX=0x4e4f54494659
SUBSCR_HEX=0x535542534352
# lossy NS IFACE: drops 20 % of the UDP datagrams and of the TCP segments
# (TCP and TLS) NS sends on IFACE, counted.
lossy() {
  ip netns exec "$1" nft -f - <<EOF
table inet msrloss {
  counter notify_sent {}
  counter notify_dropped {}
  counter subscribe_sent {}
  counter subscribe_dropped {}
  counter other_sent {}
  counter other_dropped {}
  counter tcp_sent {}
  counter tcp_dropped {}
  chain out {
    type filter hook output priority 0; policy accept;
    oifname "$2" meta l4proto udp @th,64,48 $NOTIFY_HEX counter name "notify_sent" numgen random mod 100 < 20 counter name "notify_dropped" drop
    oifname "$2" meta l4proto udp @th,64,48 $NOTIFY_HEX accept
    oifname "$2" meta l4proto udp @th,64,48 $SUBSCR_HEX counter name "subscribe_sent" numgen random mod 100 < 20 counter name "subscribe_dropped" drop
    oifname "$2" meta l4proto udp @th,64,48 $SUBSCR_HEX accept
    oifname "$2" meta l4proto udp counter name "other_sent" numgen random mod 100 < 20 counter name "other_dropped" drop
    oifname "$2" meta l4proto tcp counter name "tcp_sent" numgen random mod 100 < 20 counter name "tcp_dropped" drop
  }
}
EOF
}
# counter NS NAME: the packets counted by NAME.
counter() { ip netns exec "$1" nft -j list counter inet msrloss "$2" | jq '[.. | .packets? | numbers] | add // 0'; }

part_loss() {
  echo "== loss ($tr): 20 % packet loss both ways between an agent and the collector for ${loss_seconds} s"
  command -v nft >/dev/null || fail "loss: nft missing (scripts/deps.sh installs nftables)"
  local nc="msrf$$${tr}c" na="msrf$$${tr}a" vc="mf$$${tr}c" va="mf$$${tr}a" lc="lc-$tr" la="la-$tr"
  ip netns add "$nc" || fail "loss: ip netns add $nc"
  netns+=("$nc")
  ip netns add "$na" || fail "loss: ip netns add $na"
  netns+=("$na")
  ip link add "$vc" type veth peer name "$va" || fail "loss: ip link add veth"
  ip link set "$vc" netns "$nc"
  ip link set "$va" netns "$na"
  ip -n "$nc" addr add 10.212.0.1/24 dev "$vc"
  ip -n "$na" addr add 10.212.0.2/24 dev "$va"
  for n in "$nc" "$na"; do ip -n "$n" link set lo up; done
  ip -n "$nc" link set "$vc" up
  ip -n "$na" link set "$va" up
  collector_start "$lc" 10.212.0.1 5060 "$nc"
  local lc_pid=$collector_pid
  # REGISTER every 15 s (60 s, refreshed 45 s before expiry), a 60 s
  # subscription: both refresh several times under loss.
  agent_start "$la" msr_1 "$(realm 10.212.0.1 5060)" 10.212.0.2 5090 60 "$na"
  local la_pid=$agent_pid
  wait_until 20 live msr_1 10 || fail "loss: msr_1 not live within 20 s (no loss yet)"
  over_transport msr_1 || fail "loss: msr_1's contact is not over $tr: $(rows)"
  lossy "$nc" "$vc" || fail "loss: nft in $nc"
  lossy "$na" "$va" || fail "loss: nft in $na"

  local end=$(( $(now_ms) + loss_seconds * 1000 ))
  local calls=10 changes=0 seen=0 lat_max=0 lat_sum=0 polls=0 unreg=0 unhealthy=0
  local eid="" resubs=0 line status sub load health t0 lat e
  eid=$(subs | jq -r '.rows[] | select(.msr == "msr_1") | .event_id')
  while [ "$(now_ms)" -lt "$end" ]; do
    calls=$(( calls >= 90 ? 10 : calls + 10 ))
    set_calls "$la" "$calls"
    changes=$((changes + 1))
    t0=$(now_ms)
    while :; do
      line=$(rows | jq -r '.rows[] | select(.msr == "msr_1") | "\(.status) \(.subscription) \(.load) \(.health)"')
      read -r status sub load health <<<"${line:-none none none none}"
      polls=$((polls + 1))
      [ "$status" = registered ] || { unreg=$((unreg + 1)); echo "   poll $polls: msr_1 shown '$status'" >&2; }
      [ "$health" = healthy ] || unhealthy=$((unhealthy + 1))
      e=$(subs | jq -r '.rows[] | select(.msr == "msr_1") | .event_id')
      if [ -n "$e" ] && [ "$e" != "$eid" ]; then resubs=$((resubs + 1)); eid=$e; fi
      [ "$load" = "$calls" ] && break
      [ $(( $(now_ms) - t0 )) -lt 60000 ] || fail "loss: load $calls not shown within 60 s under loss"
      sleep 0.2
    done
    lat=$(( $(now_ms) - t0 ))
    seen=$((seen + 1)); lat_sum=$((lat_sum + lat))
    [ "$lat" -le "$lat_max" ] || lat_max=$lat
  done
  local k
  for k in notify subscribe other tcp; do
    eval "local c_${k}_s=\$(counter $nc ${k}_sent) c_${k}_d=\$(counter $nc ${k}_dropped)"
    eval "local a_${k}_s=\$(counter $na ${k}_sent) a_${k}_d=\$(counter $na ${k}_dropped)"
  done
  ip netns exec "$nc" nft delete table inet msrloss
  ip netns exec "$na" nft delete table inet msrloss
  local c_s=$((c_notify_s + c_subscribe_s + c_other_s)) c_d=$((c_notify_d + c_subscribe_d + c_other_d))
  local a_s=$((a_notify_s + a_subscribe_s + a_other_s)) a_d=$((a_notify_d + a_subscribe_d + a_other_d))
  local sub_answer="" control_answer=""
  [ "$tr" != udp ] || foreign_subscribe
  # No subscription lost for good: with the loss gone, the subscription is
  # active and the next load shown.
  calls=$(( calls >= 90 ? 10 : calls + 10 ))
  set_calls "$la" "$calls"
  wait_until 60 live msr_1 "$calls" || fail "loss: the subscription did not come back within 60 s after the loss ended"
  local notifies; notifies=$(subs | jq -r '.rows[] | select(.msr == "msr_1") | .notify_count')
  [ "$unreg" -eq 0 ] || fail "loss: msr_1 shown unregistered in $unreg of $polls polls"
  if [ "$tr" = udp ]; then
    echo "   loss measured: collector → agent $c_d/$c_s datagrams dropped ($(pct "$c_d" "$c_s")), agent → collector $a_d/$a_s ($(pct "$a_d" "$a_s"))"
    echo "   NOTIFY datagrams (retransmissions included): agent sent $a_notify_s, $a_notify_d dropped, $((a_notify_s - a_notify_d)) reached the collector; the dialog's notify count at the end $notifies"
    echo "   SUBSCRIBE datagrams: collector sent $c_subscribe_s, $c_subscribe_d dropped; re-subscriptions (new dialog) $resubs"
    echo "   SUBSCRIBE to the agent from 10.212.0.3 (not its registrar): '$sub_answer' (from 10.212.0.1, a fetch: '$control_answer'); the collector's subscription still active, its next change shown"
  else
    local connections; connections=$(grep -c "the connection to the registrar closed" "$work/$la.log" || true)
    echo "   loss measured: collector → agent $c_tcp_d/$c_tcp_s TCP segments dropped ($(pct "$c_tcp_d" "$c_tcp_s")), agent → collector $a_tcp_d/$a_tcp_s ($(pct "$a_tcp_d" "$a_tcp_s"))"
    echo "   the dialog's notify count at the end $notifies; re-subscriptions (new dialog) $resubs; connections the agent saw close: $connections"
  fi
  echo "   load changes: $seen/$changes seen, mean $(( lat_sum / (seen > 0 ? seen : 1) )) ms, max $lat_max ms; $polls polls: $unreg unregistered, $unhealthy not healthy"
  kill9 "$la_pid"; kill9 "$lc_pid"
}
# foreign_subscribe (part_loss, over UDP; its NC, VC and LC): SPEC §4, a
# SUBSCRIBE to the agent from a host that is not its registrar is refused;
# sets sub_answer and control_answer.
foreign_subscribe() {
  # A SUBSCRIBE to the agent from a host that is not its registrar
  # (10.212.0.3, a second address on the collector's side; the collector's
  # own socket stays bound to .1) is refused and gets no NOTIFY.
  ip -n "$nc" addr add 10.212.0.3/24 dev "$vc"
  ip -n "$nc" route replace 10.212.0.2/32 dev "$vc" src 10.212.0.3
  local agent_hp
  agent_hp=$(jq -r '.bindings[] | select(.msr == "msr_1") | .uri' "$work/$lc-state.json.bindings" | sed 's/^sip:[^@]*@//; s/;.*//')
  printf 'SUBSCRIBE sip:msr_1@%s SIP/2.0\r\nVia: SIP/2.0/UDP 10.212.0.3:@LPORT@;branch=z9hG4bKforeignsub%s;rport\r\nFrom: <sip:intruder@10.212.0.3>;tag=intruder\r\nTo: <sip:msr_1@%s>\r\nCall-ID: foreign-subscribe-%s\r\nCSeq: 1 SUBSCRIBE\r\nContact: <sip:intruder@10.212.0.3:@LPORT@>\r\nEvent: eltex-call-count\r\nExpires: 60\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n' \
    "$agent_hp" "$RANDOM" "$agent_hp" "$$" >"$work/foreign-subscribe.sip"
  sub_answer=$(status_line "$(ip netns exec "$nc" bash -c "$(declare -f send_udp); send_udp ${agent_hp%:*} ${agent_hp##*:} $work/foreign-subscribe.sip")")
  case "$sub_answer" in SIP/2.0\ 2*|"no answer") fail "loss: a SUBSCRIBE from 10.212.0.3 (not the registrar) was answered '$sub_answer'" ;; esac
  ip -n "$nc" route del 10.212.0.2/32 dev "$vc"
  # The control: the same SUBSCRIBE from the registrar's address, as a fetch
  # (Expires: 0, nothing lasting), is accepted; so the 403 was the source's.
  sed -e 's/10\.212\.0\.3/10.212.0.1/g' -e 's/^Expires: 60/Expires: 0/' -e 's/foreignsub/controlsub/' \
    "$work/foreign-subscribe.sip" >"$work/control-subscribe.sip"
  control_answer=$(status_line "$(ip netns exec "$nc" bash -c "$(declare -f send_udp); send_udp ${agent_hp%:*} ${agent_hp##*:} $work/control-subscribe.sip")")
  case "$control_answer" in SIP/2.0\ 2*) ;; *) fail "loss: the control SUBSCRIBE from the registrar's address was answered '$control_answer'" ;; esac
}
# pct PART WHOLE: PART as a percentage of WHOLE, one decimal.
pct() { if [ "$2" -gt 0 ]; then echo "$(( $1 * 100 / $2 )).$(( ($1 * 1000 / $2) % 10 )) %"; else echo "-"; fi; }

# --- spoof: requests that must change nothing ---------------------------------
# send_udp HOST PORT FILE: sends FILE as one datagram from a fresh socket (a
# source the collector never sent anything to), `@LPORT@` replaced by that
# socket's port (the Via's sent-by, where the answer goes); prints the
# answer, or nothing after 2 s.
send_udp() {
  (
    exec 3<>"/dev/udp/$1/$2"
    local lport
    lport=$(ss -Hun state established "dst $1:$2" | awk '{ n = split($3, a, ":"); print a[n]; exit }')
    sed "s/@LPORT@/$lport/g" "$3" >&3
    timeout 2 dd bs=65535 count=1 status=none <&3 || true
  )
}
status_line() { if [ -n "$1" ]; then printf '%s\n' "$1" | head -1 | tr -d '\r'; else echo "no answer"; fi; }
# The last datagram of method $2 the collector NAME logged as received
# (rsipstack's trace line; RUST_LOG in part_spoof turns it on), unescaped.
last_received() {
  grep "raw_message=\"$2 " "$work/$1.log" | tail -1 | sed 's/.*raw_message="//; s/"$//; s/\\"/"/g' | { IFS= read -r m; printf '%b' "$m"; }
}
md5() { printf '%s' "$1" | md5sum | cut -d' ' -f1; }
part_spoof() {
  echo "== spoof: a REGISTER with a lower CSeq, a NOTIFY from a foreign source"
  local port; port=$(free_port)
  RUST_LOG="info,rsipstack::transport::udp=trace" collector_start sc 127.0.0.1 "$port"
  local sc_pid=$collector_pid
  agent_start sa msr_1 "sip:127.0.0.1:$port" 127.0.0.1 5090 300
  local sa_pid=$agent_pid
  wait_until 15 live msr_1 10 || fail "spoof: msr_1 not live within 15 s"
  wait_until 5 all_saved sc 1 || fail "spoof: the binding was not saved within 5 s"

  # 1. RFC 3261 §10.3 step 7: the binding's Call-ID with a CSeq below the
  # binding's, Expires: 0, correctly authenticated (MD5 digest).
  local b call_id cseq uri
  b=$(jq -c '.bindings[] | select(.msr == "msr_1")' "$work/sc-state.json.bindings")
  call_id=$(jq -r .call_id <<<"$b"); cseq=$(jq -r .cseq <<<"$b"); uri=$(jq -r .uri <<<"$b")
  [ "$cseq" -ge 2 ] || fail "spoof: the binding's CSeq is $cseq, no lower one to send"
  local ruri="sip:127.0.0.1:$port" old=$((cseq - 1))
  register() { # register CSEQ EXPIRES [AUTHORIZATION]
    printf 'REGISTER %s SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:@LPORT@;branch=z9hG4bKspoof%s;rport\r\nFrom: <sip:msr_1@127.0.0.1:%s>;tag=spoof\r\nTo: <sip:msr_1@127.0.0.1:%s>\r\nCall-ID: %s\r\nCSeq: %s REGISTER\r\nContact: <%s>;iface=lo\r\nExpires: %s\r\n%bMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n' \
      "$ruri" "$RANDOM$RANDOM" "$port" "$port" "$call_id" "$1" "$uri" "$2" "${3:-}" >"$work/register.sip"
  }
  # auth_register CSEQ EXPIRES: the REGISTER, its 401, the REGISTER with an
  # MD5 digest answer; prints the final status line.
  auth_register() {
    local answer challenge nonce ha1 ha2 resp
    register "$1" "$2"
    answer=$(send_udp 127.0.0.1 "$port" "$work/register.sip")
    challenge=$(printf '%s\n' "$answer" | tr -d '\r' | grep -i '^WWW-Authenticate:.*algorithm=MD5' | head -1 || true)
    nonce=$(sed -n 's/.*nonce="\([^"]*\)".*/\1/p' <<<"$challenge")
    [ -n "$nonce" ] || fail "spoof: no MD5 challenge to the REGISTER: $(status_line "$answer")"
    ha1=$(md5 "msr:msr.local:msr-secret"); ha2=$(md5 "REGISTER:$ruri")
    resp=$(md5 "$ha1:$nonce:00000001:0a4f113b:auth:$ha2")
    register "$1" "$2" "Authorization: Digest username=\"msr\", realm=\"msr.local\", nonce=\"$nonce\", uri=\"$ruri\", response=\"$resp\", algorithm=MD5, qop=auth, nc=00000001, cnonce=\"0a4f113b\"\r\n"
    status_line "$(send_udp 127.0.0.1 "$port" "$work/register.sip")"
  }
  local answer
  answer=$(auth_register "$old" 0)
  case "$answer" in SIP/2.0\ 2*) fail "spoof: a REGISTER with CSeq $old after $cseq was accepted: $answer" ;; esac
  live msr_1 10 || fail "spoof: msr_1 no longer live after the old-CSeq REGISTER ($answer)"
  [ "$(jq -r '.bindings[] | select(.msr == "msr_1") | .cseq' "$work/sc-state.json.bindings")" = "$cseq" ] \
    || fail "spoof: the binding changed after the old-CSeq REGISTER"
  # The control: the same credentials with the next CSeq (a refresh) are
  # accepted, so the refusal above was the ordering rule's.
  local control; control=$(auth_register "$((cseq + 1))" 300)
  case "$control" in SIP/2.0\ 200*) ;; *) fail "spoof: the control REGISTER (CSeq $((cseq + 1))) was refused: $control" ;; esac
  live msr_1 10 || fail "spoof: msr_1 not live after the control REGISTER"
  echo "   REGISTER, binding's Call-ID, CSeq $old after $cseq, Expires: 0, authenticated: '$answer'; the binding and its subscription unchanged (CSeq $((cseq + 1)), the same credentials: '$control')"

  # 2. SPEC §4: the live dialog's NOTIFY (Call-ID, both tags) replayed from
  # another source with a higher CSeq and load 79: the table keeps the
  # genuine load, and the agent's next NOTIFY is still accepted.
  set_calls sa 55
  wait_until 10 live msr_1 55 || fail "spoof: load 55 not shown"
  last_received sc NOTIFY >"$work/genuine.sip"
  grep -q "load: 55" "$work/genuine.sip" || fail "spoof: the agent's NOTIFY with load 55 was not found in the collector's trace log"
  local ncseq; ncseq=$(tr -d '\r' <"$work/genuine.sip" | sed -n 's/^CSeq: \([0-9]*\) NOTIFY$/\1/p')
  sed -e "s/^CSeq: $ncseq NOTIFY/CSeq: $((ncseq + 100)) NOTIFY/" -e 's/branch=z9hG4bK[^;\r]*/branch=z9hG4bKforeign1/' \
    -e 's/^load: 55/load: 79/' -e 's/^calls: 55/calls: 79/' "$work/genuine.sip" >"$work/foreign.sip"
  sed -i 's/^\(Via: SIP\/2.0\/UDP 127.0.0.1:\)[0-9]*/\1@LPORT@/' "$work/foreign.sip"
  answer=$(status_line "$(send_udp 127.0.0.1 "$port" "$work/foreign.sip")")
  set_calls sa 35
  local shown79=0
  spoof_done() {
    rows | jq -e 'any(.rows[]; .msr == "msr_1" and .load == 79)' >/dev/null && shown79=1
    live msr_1 35
  }
  local verdict=""
  wait_until 10 spoof_done || verdict="the agent's next NOTIFY (load 35) not shown within 10 s"
  [ "$shown79" = 0 ] || verdict="the foreign NOTIFY's load 79 was shown${verdict:+; $verdict}"
  case "$answer" in SIP/2.0\ 403*) ;; *) verdict="answered '$answer', not 403${verdict:+; $verdict}" ;; esac
  [ -z "$verdict" ] || fail "spoof: foreign NOTIFY: $verdict"
  echo "   foreign NOTIFY (same Call-ID and tags, CSeq $((ncseq + 100)), from another port): '$answer'; load 79 never shown, the agent's next NOTIFY accepted"
  kill9 "$sa_pid"; kill9 "$sc_pid"
}

for p in "${parts[@]}"; do
  case "$p" in
    spoof) tr=udp; part_spoof ;;
    *) for tr in $transports; do "part_$p"; done ;;
  esac
done
echo "faults.sh: ${parts[*]} (kill and loss over $transports): every check passed"
