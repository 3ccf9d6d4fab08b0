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
#     operator store kept), dpkg --purge (both gone, users kept);
#  8. the upgrade from the previous release (SPEC §13): the 0.1.0 packages
#     (built once from their commit by scripts/previous-packages.sh and
#     kept under target/previous-release/) installed and run with a live
#     agent and operator settings; dpkg -i of these packages over them;
#     each daemon restarted on the new binary in turn: the settings and the
#     binding are kept (the new collector reads the old bindings file,
#     format version 1) and the MSR is never unselectable for more than
#     2 s; then purged.
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
command -v jq >/dev/null 2>&1 || missing+=(jq)                     # the upgrade step reads msrctl --json
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
# The workspace's release build, as scripts/quickstart.sh makes it: after
# either, the other rebuilds nothing (a build of some packages only would
# unify other features and rebuild their dependencies).
timeout 1800 cargo build --release --locked --workspace --bins
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
  /etc/default/msr-agent /etc/msr-collector/collector.toml \
  /usr/share/doc/msr-collector/examples/collector-softswitch.toml \
  /usr/share/doc/msr-collector/examples/collector-etcd.toml \
  /usr/share/doc/msr-collector/examples/kamailio/kamailio.cfg \
  /usr/share/doc/msr-collector/examples/kamailio/rtpengine-db/rtpengine \
  /usr/share/doc/msr-collector/examples/monitoring/grafana-dashboard.json \
  /usr/share/doc/msr-collector/examples/monitoring/alerts.yml; do
  [ -e "$f" ] || fail "$f is missing after dpkg -i"
done
# Every man page msr-dist made is installed (msr-collector(8) refers to
# msr-collector-store(8), …).
for page in packaging/generated/man/*; do
  name=$(basename "$page")
  [ -e "/usr/share/man/man${name##*.}/$name.gz" ] || fail "man page $name is not installed"
done
echo "man pages: $(find packaging/generated/man -type f | wc -l) generated, all installed"
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
# The installed config names the seed's core host address: until it is
# edited the collector would not start here, for that one reason (SPEC
# §13), and the placeholder password is a warning.
rc=0
out=$(as_collector /usr/sbin/msr-collector --config /etc/msr-collector/collector.toml --check-config 2>&1) || rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 1 ] || fail "--check-config on the installed collector.toml exited $rc, expected 1 (its [sip] listen is the seed's address)"
printf '%s\n' "$out" | grep -q '(1 reason):' || fail "--check-config on the installed collector.toml names another reason than its [sip] listen"
printf '%s\n' "$out" | grep -q 'error: \[sip\] listen = "[0-9.:]*": [0-9.]* is not an address of this host' ||
  fail "--check-config on the installed collector.toml does not name its [sip] listen"
printf '%s\n' "$out" | grep -q 'warning: \[\[accounts\]\] auth_name "user" still has the example' ||
  fail "--check-config does not warn about the example's password"
out=$($SUDO setpriv --reuid=nobody --regid=nogroup --clear-groups \
  /usr/sbin/msr-collector --config /etc/msr-collector/collector.toml --check-config 2>&1) &&
  fail "--check-config as a user outside group msr-collector succeeded"
printf '%s\n' "$out" | grep -q 'Permission denied' ||
  fail "a user outside group msr-collector can read /etc/msr-collector/collector.toml: $out"

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
# MSR host (mode 0640); docs/install.md.
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
# (its log file, its port), so the only reason it would not start here is
# the seed host's address in bind-addr, named, with exit code 1.
seed_rc=0
seed_out=$(as_agent /usr/sbin/msr-agent --config /usr/share/doc/msr-agent/examples/config.xml --check-config 2>&1) || seed_rc=$?
printf '%s\n' "$seed_out"
[ "$seed_rc" -eq 1 ] || fail "--check-config on the seed's config exited $seed_rc, expected 1 (its bind-addr is not this host's)"
printf '%s\n' "$seed_out" | grep -q '(1 reason):' ||
  fail "--check-config on the seed's config names another reason than its bind-addr"
printf '%s\n' "$seed_out" | grep -q 'error: <transport bind-addr="192.168.2.21">: 192.168.2.21 is not an address of this host' ||
  fail "--check-config on the seed's config does not name its bind-addr"

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

# ---- The upgrade from the previous release (SPEC §13) ----
step "upgrade: the previous packages"
mapfile -t OLD_DEBS < <(scripts/previous-packages.sh)
[ "${#OLD_DEBS[@]}" -eq 2 ] && [ -f "${OLD_DEBS[0]}" ] && [ -f "${OLD_DEBS[1]}" ] ||
  fail "scripts/previous-packages.sh did not name two packages: ${OLD_DEBS[*]}"
INSTALLED=1
dpkg_retry -i "${OLD_DEBS[@]}"
old_version=$(dpkg-query -W -f='${Version}' msr-collector)
new_version=$(dpkg-deb -f "$COLLECTOR_DEB" Version)
echo "installed $old_version, upgrading to $new_version"
dpkg --compare-versions "$new_version" gt "$old_version" || fail "$new_version is not newer than $old_version"
# What systemd's RuntimeDirectory= and StateDirectory= make (the purge
# removed both).
for d in /run/msr-collector /var/lib/msr-collector; do
  $SUDO install -d -m 0750 -o msr-collector -g msr-collector "$d"
done
MADE_DIRS+=(/var/lib/msr-collector)
# The previous release's own examples, on this test's free ports.
sed -e "s/port=\"5070\"/port=\"$APORT\"/" -e "s/127.0.0.1:5060/127.0.0.1:$CPORT/" \
  /usr/share/doc/msr-agent/examples/msr-loopback.xml | $SUDO tee "$WORK/engine-config.xml" >/dev/null
$SUDO chown "root:$ENGINE_GROUP" "$WORK/engine-config.xml"
$SUDO chmod 0640 "$WORK/engine-config.xml"
sed -e "s/^listen = .*/listen = \"127.0.0.1:$CPORT\"/" \
  -e "s|^socket = .*|socket = \"/run/msr-collector/control.sock\"|" \
  -e "s|^path = .*|path = \"/var/lib/msr-collector/operator.json\"|" \
  /usr/share/doc/msr-collector/examples/collector-loopback.toml |
  $SUDO tee "$WORK/collector.toml" >/dev/null
printf '[http]\nlisten = "off"\n' | $SUDO tee -a "$WORK/collector.toml" >/dev/null
$SUDO chown root:msr-collector "$WORK/collector.toml"
$SUDO chmod 0640 "$WORK/collector.toml"
$SUDO truncate -s 0 "$WORK/collector.log" "$WORK/agent.log"

start_collector() { # log file
  $SUDO setpriv --reuid=msr-collector --regid=msr-collector --init-groups \
    /usr/sbin/msr-collector --config "$WORK/collector.toml" >>"$1" 2>&1 &
  COLLECTOR_PID=$!
}
start_agent() { # log file
  $SUDO setpriv --reuid=msr-agent --regid=msr-agent --groups="$ENGINE_GROUP" \
    /usr/sbin/msr-agent --config "$WORK/engine-config.xml" --log-stderr >>"$1" 2>&1 &
  AGENT_PID=$!
}
stop_daemon() { # pid name: SIGTERM, its exit within 15 s (polled every 20 ms), exit code 0
  local rc=0 i
  $SUDO kill -TERM "$1"
  for i in $(seq 750); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.02
  done
  kill -0 "$1" 2>/dev/null && fail "$2 did not exit within 15 s of SIGTERM"
  wait "$1" || rc=$?
  [ "$rc" -eq 0 ] || fail "$2 exited $rc after SIGTERM"
}
# How long msr_1 stays unselectable: polls select every 50 ms until it
# answers msr_1, for at most 30 s; prints the seconds since START (a
# `date +%s.%N` taken before the daemon was stopped), or since now.
unselectable_for() {
  local start=${1:-$(date +%s.%N)} now out
  while :; do
    out=$($SUDO /usr/bin/msrctl --socket "$SOCKET" select --zone default --site local --json 2>/dev/null || true)
    case "$(printf '%s' "$out" | tr -d ' \n')" in *'"msr":"msr_1"'*) break ;; esac
    now=$(date +%s.%N)
    awk -v a="$start" -v b="$now" 'BEGIN { exit !(b - a < 30) }' || { echo 30; return 0; }
    sleep 0.05
  done
  now=$(date +%s.%N)
  awk -v a="$start" -v b="$now" 'BEGIN { printf "%.2f\n", b - a }'
}
within_2s() { awk -v s="$1" 'BEGIN { exit !(s <= 2.0) }'; }

start_collector "$WORK/collector.log"
for i in $(seq 200); do
  [ -S "$SOCKET" ] && break
  kill -0 "$COLLECTOR_PID" 2>/dev/null || fail "msr-collector $old_version exited at start"
  sleep 0.1
done
start_agent "$WORK/agent.log"
gap=$(unselectable_for)
[ "$gap" != 30 ] || fail "msr_1 never became selectable on $old_version"
echo "$old_version: msr_1 selectable after ${gap} s"
# Settings of every kind the operator store holds, made on the old release.
ctl() { $SUDO /usr/bin/msrctl --socket "$SOCKET" "$@"; }
ctl site declare upgrade-east >/dev/null
ctl site distance local upgrade-east 7 >/dev/null
ctl msr set msr_1 performance_coefficient 2.5 >/dev/null
ctl msr set msr_1 load_limit 90 >/dev/null
ctl subscription set msr_1 eltex-call-count expires 120 >/dev/null
settings() { # the operator settings: sites, distances, the MSR's settings
  ctl --json site list | jq -c '.sites'
  ctl --json site matrix | jq -c '[.sites, .cells]'
  ctl --json msr list | jq -c '[.msrs[] | {name, performance_coefficient, active, load_limit}]'
}
before=$(settings)
[ -s /var/lib/msr-collector/operator.json.bindings ] ||
  fail "$old_version saved no bindings beside its store"

step "upgrade: dpkg -i $new_version over $old_version"
dpkg_retry -i "$AGENT_DEB" "$COLLECTOR_DEB"
[ "$(dpkg-query -W -f='${Version}' msr-collector)" = "$new_version" ] || fail "msr-collector is not at $new_version"
[ "$(dpkg-query -W -f='${Version}' msr-agent)" = "$new_version" ] || fail "msr-agent is not at $new_version"

step "upgrade: the collector restarted on $new_version"
t0=$(date +%s.%N)
stop_daemon "$COLLECTOR_PID" "msr-collector $old_version"
COLLECTOR_PID=""
start_collector "$WORK/collector.log"
gap=$(unselectable_for "$t0")
echo "collector restart: msr_1 unselectable for at most ${gap} s (SIGTERM to the old one until the new one selects it)"
within_2s "$gap" || fail "msr_1 was unselectable for ${gap} s across the collector's upgrade (at most 2 s)"
grep -q 'bindings restored bindings=1' "$WORK/collector.log" ||
  fail "the new collector did not restore the old release's binding (see its log)"
after=$(settings)
[ "$before" = "$after" ] || fail "settings changed across the upgrade: before $before, after $after"
rows=$(ctl --json resource list | tr -d ' \n')
case "$rows" in *'"msr":"msr_1"'*'"status":"registered"'*) ;; *) fail "msr_1 not registered after the upgrade: $rows" ;; esac
software=$(ctl --json hello | jq -r '.software')
[ "$software" = "msr-collector ${new_version%-*}" ] || fail "the collector answering is $software, not ${new_version%-*}"

step "upgrade: the agent restarted on $new_version"
t0=$(date +%s.%N)
stop_daemon "$AGENT_PID" "msr-agent $old_version"
AGENT_PID=""
start_agent "$WORK/agent.log"
gap=$(unselectable_for "$t0")
echo "agent restart: msr_1 unselectable for at most ${gap} s (SIGTERM to the old one until the collector selects it again)"
within_2s "$gap" || fail "msr_1 was unselectable for ${gap} s across the agent's upgrade (at most 2 s)"
rows=$(ctl --json resource list | tr -d ' \n')
case "$rows" in *"\"version\":\"${new_version%-*}\""*) ;; *) fail "msr_1's agent is not ${new_version%-*}: $rows" ;; esac
[ "$(settings)" = "$before" ] || fail "settings changed after the agent's upgrade"
stop_daemon "$AGENT_PID" msr-agent
AGENT_PID=""
stop_daemon "$COLLECTOR_PID" msr-collector
COLLECTOR_PID=""
dpkg_retry --purge msr-agent msr-collector
INSTALLED=0
STEP="done"
