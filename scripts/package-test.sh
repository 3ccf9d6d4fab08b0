#!/usr/bin/env bash
# Builds the Debian packages msr-agent and msr-collector and tests them on
# this machine, as a new host would get them (issue 10, item 5):
#
#  1. installs what it needs and lacks: cargo-deb (through cargo), lintian,
#     dpkg-dev and adduser (through apt-get);
#  2. builds the release binaries, the man pages and completions (msr-dist)
#     and both packages (cargo deb), into target/debian/;
#  3. lintian: any error or warning fails (the packages' own
#     lintian-overrides justify the two accepted warnings);
#  4. dpkg -i; checks the system users, files, conffiles and the config's
#     mode; systemd-analyze security --offline on the installed units (each
#     must score <= 4.0) and systemd-analyze verify;
#  5. --check-config on the installed collector.toml as user msr-collector,
#     with /run/msr-collector and /var/lib/msr-collector made as systemd
#     would (no systemd here), and on an engine config that only the
#     engine's group may read, as user msr-agent with that group
#     (SupplementaryGroups=) and without it (must fail);
#  6. starts the installed binaries by hand as their users against each
#     other on 127.0.0.1 (the control socket and the store at the production
#     paths), waits until msrctl shows the MSR registered and reporting, runs
#     msrctl select --json, and checks that only root and group
#     msr-collector reach the control socket;
#  7. SIGTERM to both (exit 0, socket removed); dpkg -r (conffiles and
#     operator store kept), dpkg --purge (both gone, users kept).
#
# Needs root (or sudo). Bounded: each wait polls with a deadline, every
# long command runs under `timeout`. A trap stops the daemons, purges the
# packages and removes what the test made (and the users, when the test
# created them). The last line is `package test: PASS` or
# `package test: FAIL (<step>)`; the exit code is 0 or 1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

STEP="start"
WORK=""
COLLECTOR_PID=""
AGENT_PID=""
INSTALLED=0
MADE_DIRS=()
ENGINE_GROUP=msr-pkgtest-engine
MADE_GROUP=0
USERS_BEFORE=""

step() {
  STEP=$1
  echo "== package test: $1"
}

fail() {
  echo "error: $*" >&2
  exit 1
}

pkg_known() { # installed, or removed with its conffiles left
  local status
  status=$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) || return 1
  [ -n "$status" ] && [ "$status" != "not-installed" ]
}

stop_pid() { # pid name: SIGTERM, at most 10 s, then SIGKILL
  local pid=$1 name=$2 i
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  $SUDO kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "warning: $name (pid $pid) still running 10 s after SIGTERM, killing it" >&2
  $SUDO kill -KILL "$pid" 2>/dev/null || true
}

dpkg_locked() { # another dpkg or apt holds the lock (e.g. a concurrent apt-get)
  local out rc=0
  out=$(timeout 300 $SUDO dpkg "$@" 2>&1) || rc=$?
  printf '%s\n' "$out"
  case "$rc:$out" in
    0:*) return 0 ;;
    *"locked by another process"*) return 75 ;;
    *) return "$rc" ;;
  esac
}

dpkg_retry() { # dpkg ARGS, waiting at most 300 s for the dpkg lock
  local rc i
  for i in $(seq 150); do
    rc=0
    dpkg_locked "$@" || rc=$?
    [ "$rc" -eq 75 ] || return "$rc"
    echo "== dpkg is locked by another process, retrying in 2 s"
    sleep 2
  done
  return 75
}

cleanup() {
  local status=$?
  trap - EXIT
  set +e
  stop_pid "$AGENT_PID" msr-agent
  stop_pid "$COLLECTOR_PID" msr-collector
  if [ "$INSTALLED" -eq 1 ]; then
    for p in msr-agent msr-collector; do
      if pkg_known "$p"; then dpkg_retry --purge "$p" >/dev/null 2>&1; fi
    done
  fi
  for d in "${MADE_DIRS[@]}"; do $SUDO rm -rf "$d"; done
  for u in msr-agent msr-collector; do
    case " $USERS_BEFORE " in
      *" $u "*) ;;
      *) if getent passwd "$u" >/dev/null; then
           $SUDO deluser --system --quiet "$u" >/dev/null 2>&1
           $SUDO delgroup --system --quiet "$u" >/dev/null 2>&1
         fi ;;
    esac
  done
  if [ "$MADE_GROUP" -eq 1 ]; then $SUDO groupdel "$ENGINE_GROUP" 2>/dev/null; fi
  if [ -n "$WORK" ]; then
    if [ "$status" -ne 0 ]; then
      for f in "$WORK"/*.log; do
        [ -s "$f" ] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; }
      done
    fi
    $SUDO rm -rf "$WORK"
  fi
  if [ "$status" -eq 0 ]; then
    echo "package test: PASS"
  else
    echo "package test: FAIL ($STEP)"
  fi
  exit "$status"
}
trap cleanup EXIT

# One package test at a time on a machine (dpkg and the users are global).
exec 9>/tmp/msr-package-test.lock
flock -w 1200 9 || fail "another package test holds /tmp/msr-package-test.lock"

step "prerequisites"
for p in msr-agent msr-collector; do
  if pkg_known "$p"; then
    fail "package $p is already on this machine; the test installs and purges it: remove it first (dpkg --purge $p)"
  fi
done
for u in msr-agent msr-collector; do
  if getent passwd "$u" >/dev/null; then USERS_BEFORE="$USERS_BEFORE $u"; fi
done
missing=()
command -v lintian >/dev/null 2>&1 || missing+=(lintian)
command -v dpkg-shlibdeps >/dev/null 2>&1 || missing+=(dpkg-dev)   # cargo-deb's $auto depends
command -v adduser >/dev/null 2>&1 || missing+=(adduser)           # the packages' postinst
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)   # offline analysis only
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]} (apt-get)"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi
if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb (cargo install)"
  timeout 1200 cargo install cargo-deb --locked --version '^3.8'
fi
echo "== $(cargo deb --version), $(lintian --version), $(systemd-analyze --version | head -n1)"

step "build"
timeout 1800 cargo build --release --locked -p msr-agent -p msr-collector -p msr-dist --bins
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps --locked |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$TARGET_DIR" ] || fail "cannot read the target directory from cargo metadata"
rm -rf packaging/generated
"$TARGET_DIR/release/msr-dist" packaging/generated
DEBS=()
for p in msr-agent msr-collector; do
  deb=$(timeout 600 cargo deb --no-build --locked -p "$p" -o "$TARGET_DIR/debian/" | tail -n 1)
  [ -f "$deb" ] || fail "cargo deb -p $p did not name a package file (got: $deb)"
  DEBS+=("$deb")
done
AGENT_DEB=${DEBS[0]}
COLLECTOR_DEB=${DEBS[1]}
ls -l "${DEBS[@]}"

step "lintian"
lintian_out=$(timeout 600 lintian --fail-on error,warning "${DEBS[@]}" 2>&1) && lintian_rc=0 || lintian_rc=$?
printf '%s\n' "$lintian_out" | grep -v '^running with root privileges' || true
echo "lintian: $(printf '%s\n' "$lintian_out" | grep -c '^E:' || true) errors, $(printf '%s\n' "$lintian_out" | grep -c '^W:' || true) warnings not overridden"
[ "$lintian_rc" -eq 0 ] || fail "lintian reported errors or warnings (exit $lintian_rc)"

step "install"
INSTALLED=1
dpkg_retry -i "$AGENT_DEB" "$COLLECTOR_DEB"
for u in msr-agent msr-collector; do
  entry=$(getent passwd "$u") || fail "user $u was not created"
  shell=${entry##*:}
  case "$shell" in */nologin|*/false) ;; *) fail "user $u has a login shell: $shell" ;; esac
  getent group "$u" >/dev/null || fail "group $u was not created"
done
for f in /usr/sbin/msr-agent /usr/sbin/msr-collector /usr/bin/msrctl \
  /usr/lib/systemd/system/msr-agent.service /usr/lib/systemd/system/msr-collector.service \
  /usr/share/man/man8/msr-agent.8.gz /usr/share/man/man8/msr-collector.8.gz \
  /usr/share/man/man1/msrctl.1.gz /usr/share/man/man1/msrctl-select.1.gz \
  /usr/share/bash-completion/completions/msrctl /usr/share/zsh/vendor-completions/_msr-agent \
  /usr/share/fish/vendor_completions.d/msr-collector.fish \
  /usr/share/doc/msr-agent/copyright /usr/share/doc/msr-collector/changelog.Debian.gz \
  /etc/default/msr-agent /etc/msr-collector/collector.toml; do
  [ -e "$f" ] || fail "$f is missing after dpkg -i"
done
dpkg-query -W -f='${Conffiles}\n' msr-agent | grep -q ' /etc/default/msr-agent ' ||
  fail "/etc/default/msr-agent is not a conffile"
dpkg-query -W -f='${Conffiles}\n' msr-collector | grep -q ' /etc/msr-collector/collector.toml ' ||
  fail "/etc/msr-collector/collector.toml is not a conffile"
mode=$(stat -c '%U:%G %a' /etc/msr-collector/collector.toml)
[ "$mode" = "root:msr-collector 640" ] || fail "collector.toml is $mode, expected root:msr-collector 640"
/usr/bin/msrctl --version
/usr/sbin/msr-agent --version
/usr/sbin/msr-collector --version

step "systemd-analyze"
# verify: the units' syntax, that their commands are executable and that
# their Documentation= man pages exist (no running systemd needed).
for unit in msr-agent msr-collector; do
  out=$(systemd-analyze verify "/usr/lib/systemd/system/$unit.service" 2>&1) ||
    fail "systemd-analyze verify $unit.service failed: $out"
  if printf '%s\n' "$out" | grep -q "$unit"; then fail "systemd-analyze verify $unit.service: $out"; fi
  echo "$unit.service: verify ok"
done
for unit in msr-agent msr-collector; do
  out=$(systemd-analyze security --offline=true "/usr/lib/systemd/system/$unit.service" 2>&1) ||
    fail "systemd-analyze security failed on $unit.service: $out"
  score=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
  echo "$unit.service: exposure $score"
  [ -n "$score" ] || fail "no exposure level for $unit.service in: $out"
  awk -v s="$score" 'BEGIN { exit !(s <= 4.0) }' || fail "$unit.service scores $score, above 4.0"
done

WORK=$($SUDO mktemp -d /tmp/msr-package-test.XXXXXX)
$SUDO chmod 0755 "$WORK"
as_collector() { $SUDO setpriv --reuid=msr-collector --regid=msr-collector --init-groups "$@"; }

step "check-config (collector)"
# What systemd's RuntimeDirectory= and StateDirectory= make before ExecStartPre.
for d in /run/msr-collector /var/lib/msr-collector; do
  if [ -e "$d" ]; then fail "$d exists before the test"; fi
  $SUDO install -d -m 0750 -o msr-collector -g msr-collector "$d"
  MADE_DIRS+=("$d")
done
as_collector /usr/sbin/msr-collector --config /etc/msr-collector/collector.toml --check-config
if $SUDO setpriv --reuid=nobody --regid=nogroup --clear-groups \
  /usr/sbin/msr-collector --config /etc/msr-collector/collector.toml --check-config >/dev/null 2>&1; then
  fail "a user outside group msr-collector can read /etc/msr-collector/collector.toml"
fi

# Free loopback ports: the collector's, and the agent's <transport> port and
# the one after it (the agent's own SIP port is that + 1).
port_busy() {
  local hex
  hex=$(printf ':%04X ' "$1")
  cat /proc/net/udp /proc/net/udp6 /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q "$hex"
}
pick_port() {
  local p i
  for i in $(seq 200); do
    p=$((30000 + (RANDOM % 15000) * 2))
    if ! port_busy "$p" && ! port_busy $((p + 1)); then echo "$p"; return 0; fi
  done
  return 1
}
CPORT=$(pick_port) || fail "no free port for the collector"
APORT=$(pick_port) || fail "no free port for the agent"
[ "$CPORT" != "$APORT" ] || APORT=$((APORT + 2))

step "check-config (agent)"
# An engine config that only root and the engine's group may read, as on an
# MSR host (mode 0640); README "Install on a real host".
if ! getent group "$ENGINE_GROUP" >/dev/null; then
  $SUDO groupadd --system "$ENGINE_GROUP"
  MADE_GROUP=1
fi
sed -e "s/port=\"5070\"/port=\"$APORT\"/" -e "s/127.0.0.1:5060/127.0.0.1:$CPORT/" \
  /usr/share/doc/msr-agent/examples/msr-loopback.xml | $SUDO tee "$WORK/engine-config.xml" >/dev/null
$SUDO chown "root:$ENGINE_GROUP" "$WORK/engine-config.xml"
$SUDO chmod 0640 "$WORK/engine-config.xml"
as_agent() {
  $SUDO setpriv --reuid=msr-agent --regid=msr-agent --groups="$ENGINE_GROUP" "$@"
}
# The unit's own command line: /etc/default/msr-agent's settings, if set.
MSR_AGENT_OPTS=""
# shellcheck disable=SC1091
. /etc/default/msr-agent
# shellcheck disable=SC2086
as_agent /usr/sbin/msr-agent --config "$WORK/engine-config.xml" $MSR_AGENT_OPTS --check-config
if $SUDO setpriv --reuid=msr-agent --regid=msr-agent --clear-groups \
  /usr/sbin/msr-agent --config "$WORK/engine-config.xml" --check-config >/dev/null 2>&1; then
  fail "msr-agent without the engine's group read a 0640 engine config"
fi
# The seed's own config, unchanged: the agent takes nothing of the engine
# (its log file, its port), so the check passes as the unit's user.
as_agent /usr/sbin/msr-agent --config /usr/share/doc/msr-agent/examples/config.xml --check-config >/dev/null ||
  fail "the seed's config does not check out as user msr-agent"

step "start the installed daemons"
sed -e "s/^listen = .*/listen = \"127.0.0.1:$CPORT\"/" \
  -e "s|^socket = .*|socket = \"/run/msr-collector/control.sock\"|" \
  -e "s|^path = .*|path = \"/var/lib/msr-collector/operator.json\"|" \
  /usr/share/doc/msr-collector/examples/collector-loopback.toml |
  $SUDO tee "$WORK/collector.toml" >/dev/null
# HTTP is on at 127.0.0.1:8080 by default (SPEC §11); this host's tests may
# hold that port, and the check below uses the control socket.
printf '[http]\nlisten = "off"\n' | $SUDO tee -a "$WORK/collector.toml" >/dev/null
$SUDO chown root:msr-collector "$WORK/collector.toml"
$SUDO chmod 0640 "$WORK/collector.toml"
as_collector /usr/sbin/msr-collector --config "$WORK/collector.toml" --check-config
$SUDO touch "$WORK/collector.log" "$WORK/agent.log"
$SUDO chmod 0666 "$WORK/collector.log" "$WORK/agent.log"
# A simple command, not a function, so that $! is the daemon (or sudo).
$SUDO setpriv --reuid=msr-collector --regid=msr-collector --init-groups \
  /usr/sbin/msr-collector --config "$WORK/collector.toml" >"$WORK/collector.log" 2>&1 &
COLLECTOR_PID=$!
SOCKET=/run/msr-collector/control.sock
for i in $(seq 200); do
  [ -S "$SOCKET" ] && break
  kill -0 "$COLLECTOR_PID" 2>/dev/null || fail "msr-collector exited at start"
  sleep 0.1
done
[ -S "$SOCKET" ] || fail "no control socket at $SOCKET within 20 s"
sock_mode=$(stat -c '%U:%G %a' "$SOCKET")
[ "$sock_mode" = "msr-collector:msr-collector 660" ] || fail "control socket is $sock_mode"
$SUDO setpriv --reuid=msr-agent --regid=msr-agent --groups="$ENGINE_GROUP" \
  /usr/sbin/msr-agent --config "$WORK/engine-config.xml" >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!

step "registered and reporting"
rows=""
for i in $(seq 300); do
  kill -0 "$COLLECTOR_PID" 2>/dev/null || fail "msr-collector exited"
  kill -0 "$AGENT_PID" 2>/dev/null || fail "msr-agent exited"
  rows=$($SUDO /usr/bin/msrctl --socket "$SOCKET" --json resource list 2>/dev/null | tr -d ' \n' || true)
  case "$rows" in
    *'"msr":"msr_1"'*'"load":'[0-9]*) case "$rows" in *'"status":"registered"'*'"subscription":"active"'*) break ;; esac ;;
  esac
  rows=""
  sleep 0.1
done
[ -n "$rows" ] || fail "msr_1 not registered, subscribed and reporting within 30 s"
echo "registered and reporting after $((i / 10)).$((i % 10)) s"
$SUDO /usr/bin/msrctl --socket "$SOCKET" resource list

step "select"
selection=$($SUDO /usr/bin/msrctl --socket "$SOCKET" select --zone default --site local --json)
printf '%s\n' "$selection"
printf '%s' "$selection" | tr -d ' \n' | grep -q '"msr":"msr_1"' || fail "select did not pick msr_1"
# The control socket: group msr-collector may use msrctl, others may not.
$SUDO setpriv --reuid=msr-agent --regid=msr-agent --groups=msr-collector \
  /usr/bin/msrctl --socket "$SOCKET" site list >/dev/null ||
  fail "a member of group msr-collector cannot use msrctl"
if $SUDO setpriv --reuid=nobody --regid=nogroup --clear-groups \
  /usr/bin/msrctl --socket "$SOCKET" site list >/dev/null 2>&1; then
  fail "a user outside group msr-collector reached the control socket"
fi

step "stop"
for name in agent collector; do
  if [ "$name" = agent ]; then pid=$AGENT_PID; else pid=$COLLECTOR_PID; fi
  $SUDO kill -TERM "$pid"
  rc=0
  timeout 15 tail --pid="$pid" -f /dev/null || fail "msr-$name did not exit within 15 s of SIGTERM"
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || fail "msr-$name exited $rc after SIGTERM"
  if [ "$name" = agent ]; then AGENT_PID=""; else COLLECTOR_PID=""; fi
done
[ ! -e "$SOCKET" ] || fail "the collector left its control socket behind"
[ -s /var/lib/msr-collector/operator.json ] || fail "no operator store in /var/lib/msr-collector"

step "remove"
dpkg_retry -r msr-agent msr-collector
for f in /usr/sbin/msr-agent /usr/sbin/msr-collector /usr/bin/msrctl /usr/lib/systemd/system/msr-agent.service; do
  [ ! -e "$f" ] || fail "$f is still there after dpkg -r"
done
for f in /etc/default/msr-agent /etc/msr-collector/collector.toml /var/lib/msr-collector/operator.json; do
  [ -e "$f" ] || fail "dpkg -r removed $f (conffiles and the operator store stay until purge)"
done

step "purge"
dpkg_retry --purge msr-agent msr-collector
INSTALLED=0
for f in /etc/default/msr-agent /etc/msr-collector /var/lib/msr-collector /var/log/msr-agent; do
  [ ! -e "$f" ] || fail "$f is still there after dpkg --purge"
done
MADE_DIRS=(/run/msr-collector)
for u in msr-agent msr-collector; do
  getent passwd "$u" >/dev/null || fail "purge removed user $u (documented: users are kept)"
done
STEP="done"
