#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need when the machine
# lacks them: protoc (protobuf-compiler; etcd-client's build runs it), and
# the independent peers of the system tests: SIPp (sip-tester), Kamailio
# (kamailio, kamcmd, kamailio-utils-modules for http_client and
# kamailio-json-modules for the json module of its path B,
# kamailio-tls-modules for its TLS registrar test), etcd
# (etcd-server; the cluster tests start their own) and Prometheus with
# promtool (prometheus; the tests lint /metrics with `promtool check
# metrics`, unit-test the alert rules and run their own Prometheus against
# a collector, tests/it/monitoring.rs), and the fault
# suite's jq, iproute2 and nftables.
# `scripts/deps.sh build` installs only what the build needs; `--help` says
# so, and any other argument is refused (exit 2).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/deps.sh [build]

Installs with apt-get (as root, or through sudo) the Debian packages the
machine lacks:
  (no argument)  what the build and the system tests need: protoc
                 (protobuf-compiler), SIPp (sip-tester), Kamailio with its
                 http_client, json and tls modules, etcd (etcd-server),
                 Prometheus and promtool (prometheus), rtpengine
                 (rtpengine-daemon), jq, openssl, iproute2 and nftables
  build          only what the build needs: protoc (protobuf-compiler)
  -h, --help     this help

The Debian package test's own tools (lintian, dpkg-dev, adduser, cargo-deb)
are installed by scripts/package-test.sh, cargo-afl by scripts/fuzz.sh.
EOF
}

# Anything else is refused rather than read as "everything": a mistyped
# `buidl` or an unknown option would otherwise run apt-get for the whole list.
case "${1-}" in
  '') what=all ;;
  build) what=build ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; echo "deps.sh: unknown argument: $1" >&2; exit 2 ;;
esac
if [ "$#" -gt 1 ]; then
  usage >&2; echo "deps.sh: one argument at most, got $#: $*" >&2; exit 2
fi

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [ "$what" != build ]; then
  command -v sipp >/dev/null 2>&1 || need+=(sip-tester)
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  { command -v kamailio && command -v kamcmd; } >/dev/null 2>&1 || need+=(kamailio)
  # http_client (config-examples/kamailio/kamailio.cfg releases legs with it).
  [ -e /usr/lib/x86_64-linux-gnu/kamailio/modules/http_client.so ] || need+=(kamailio-utils-modules)
  # json (its path B reads the /v1/select answer with json_get_string).
  [ -e /usr/lib/x86_64-linux-gnu/kamailio/modules/json.so ] || need+=(kamailio-json-modules)
  # tls (tests/kamailio/registrar-tls.cfg: the agent registers over TLS).
  [ -e /usr/lib/x86_64-linux-gnu/kamailio/modules/tls.so ] || need+=(kamailio-tls-modules)
  # The fault suite (scripts/faults.sh): jq reads msrctl's JSON; ip and ss
  # (iproute2) make the network namespaces and find free ports; nft
  # (nftables) drops packets between them; openssl makes its TLS
  # certificates.
  command -v jq >/dev/null 2>&1 || need+=(jq)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  { command -v ip && command -v ss; } >/dev/null 2>&1 || need+=(iproute2)
  command -v nft >/dev/null 2>&1 || need+=(nftables)
fi
# prometheus and promtool without the recommends (node-exporter …).
nr=()
if [ "$what" != build ] && ! { command -v promtool && command -v prometheus; } >/dev/null 2>&1; then nr+=(prometheus); fi
# rtpengine without its recommends (the recording daemon, rtpengine-utils):
# the tests run the daemon alone, relaying in user space (no kernel module).
if [ "$what" != build ] && ! command -v rtpengine >/dev/null 2>&1; then nr+=(rtpengine-daemon); fi
if [ "$((${#need[@]} + ${#nr[@]}))" -gt 0 ]; then
  echo "== installing ${need[*]} ${nr[*]} (Debian packages)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  if [ "${#need[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if [ "${#nr[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${nr[@]}" >/dev/null
  fi
fi
# Debian's etcd-server starts a system etcd on 127.0.0.1:2379, and its
# prometheus a Prometheus server on :9090, and rtpengine-daemon a relay
# with its ng port on 127.0.0.1:2223 (on a host where services start);
# the tests use only their own etcd, Prometheus and rtpengines, on free
# ports, so they may keep running or not.
