# Sourced, not run: free_port [udp|tcp] prints a port P on the host such that
# no socket holds P or P + 1 (a TLS listener's), UDP or TCP, in any state (a
# moment ago); the argument is accepted for the callers' clarity, both are
# checked. P is in 10000..19999: below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768 and up by default), where no socket
# bound to port 0 lands, so a client connecting (an agent reconnecting after
# a kill -9, msr-loadgen) can't take it as its own local port before the
# daemon that is told P binds it; and below 20000, where the scripts' media
# engines keep their RTP ports, which an agent refuses to share.
free_port() {
  local p
  while :; do
    p=$((10000 + RANDOM % 9999))
    ss -Htuan "( sport = :$p or sport = :$((p + 1)) )" | grep -q . || { echo "$p"; return; }
  done
}
