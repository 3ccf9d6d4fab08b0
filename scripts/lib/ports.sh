# Sourced, not run: free_port [udp|tcp] prints a port P on the host such that
# no socket holds P or P + 1 (a TLS listener's), UDP or TCP, in any state (a
# moment ago); the argument is accepted for the callers' clarity, both are
# checked. P is below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768 and up by default), where no socket
# bound to port 0 lands: a client connecting (an agent reconnecting after a
# kill -9, msr-loadgen) can't take it as its own local port before the
# daemon that is told P binds it.
free_port() {
  local p low
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  while :; do
    p=$((20000 + RANDOM % (low - 20002)))
    ss -Htuan "( sport = :$p or sport = :$((p + 1)) )" | grep -q . || { echo "$p"; return; }
  done
}
