#!/bin/sh
# Runs inside a benchmark VM, started by its PID 1 (build-image.sh's stub)
# from the host's 9p share. The role (`gw` or `load`), the seconds per run,
# the queue count and the poll mode come from the kernel command line
# (xvs.role=, xvs.seconds=, xvs.queues=, xvs.poll=). The binaries are on
# the read-only share /opt/xvs; results go to /mnt/share. Interfaces are
# found by the MACs run-bench.sh assigns.
#
#  load VM: client side (root namespace)    backend side (namespace "be")
#           198.18.0.2                       198.18.1.10
#  gw VM:   client 198.18.0.1, backend 198.18.1.1, xvs two-arm, SNAT
#           198.18.1.2-5; VIP 198.19.0.1: udp/9000 and tcp/9090.
#
# The load VM runs, in order: new UDP flows, then 256 established UDP
# flows (the sink reflects every frame, so replies cross xvs back and a
# reply that lands on another queue than its flow's is handed over), then
# the TCP check: CONNS connections echoing 2000 bytes each through the VIP
# to a server in "be". Every step is time-boxed.
set -u
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^xvs\.$1=//p"; }
role=$(arg role); seconds=$(arg seconds); queues=$(arg queues); poll=$(arg poll)
conns=$(arg conns)
share=/mnt/share
log() { echo "$role: $*" | tee -a "$share/$role.log"; }
by_mac() { for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$1" ] && basename "$d"; done; }
wait_for() { # file seconds
  i=0
  while [ ! -e "$share/$1" ] && [ $i -lt "$2" ]; do sleep 1; i=$((i + 1)); done
  [ -e "$share/$1" ]
}
ready_in() { # file half-seconds: until a line of the file starts with "ready"
  i=0
  until grep -q '^ready' "$share/$1" || [ $i -ge "$2" ]; do sleep 0.5; i=$((i + 1)); done
  grep -q '^ready' "$share/$1"
}
GW_C=52:54:00:78:00:01; GW_B=52:54:00:78:00:02; LD_C=52:54:00:78:00:11; LD_B=52:54:00:78:00:12
qlist=$(seq -s, 0 $((queues - 1)))
log "up: kernel $(uname -r), $(nproc) cpus, $queues queues"

case "$role" in
probe)
  ;;
gw)
  c=$(by_mac $GW_C); b=$(by_mac $GW_B)
  for i in "$c" "$b"; do ethtool -L "$i" combined "$queues" 2>/dev/null; ip link set "$i" up; done
  ip addr add 198.18.0.1/24 dev "$c"; ip addr add 198.18.1.1/24 dev "$b"
  log "queues: $c $(ls -d /sys/class/net/$c/queues/rx-* | wc -l) rx, $b $(ls -d /sys/class/net/$b/queues/rx-* | wc -l) rx"
  cat > /tmp/xvs.toml <<CFG
[interfaces]
mode = "two-arm"
client = "$c"
backend = "$b"
queues = [$qlist]
poll = "$poll"

[snat]
addresses = ["198.18.1.2", "198.18.1.3", "198.18.1.4", "198.18.1.5"]

[conntrack]
capacity = 262144

[[services]]
vip = "198.19.0.1"
protocol = "udp"
port = 9000
scheduler = "rr"
backends = [{ address = "198.18.1.10", port = 9000 }]

[[services]]
vip = "198.19.0.1"
protocol = "tcp"
port = 9090
scheduler = "rr"
backends = [{ address = "198.18.1.10", port = 9090 }]
CFG
  xvs run --config /tmp/xvs.toml > "$share/gw.xvs.out" 2>&1 &
  pid=$!
  if ! ready_in gw.xvs.out 600; then log "xvs did not start"; exit 1; fi
  log "xvs ready"
  touch "$share/gw.ready"
  wait_for load.done $((seconds * 20 + 900)) || log "no word from load"
  xvs status > "$share/gw.status" 2>&1
  xvs status --json > "$share/gw.status.json" 2>&1
  kill -TERM "$pid"; wait "$pid"
  log "xvs exited $?"
  ;;
load)
  c=$(by_mac $LD_C); b=$(by_mac $LD_B)
  for i in "$c" "$b"; do ethtool -L "$i" combined "$queues" 2>/dev/null; done
  ip netns add be
  ip link set "$b" netns be
  ip link set "$c" up
  ip addr add 198.18.0.2/24 dev "$c"
  ip route add 198.19.0.0/16 via 198.18.0.1
  ip -n be link set lo up
  ip -n be link set "$b" up
  ip -n be addr add 198.18.1.10/24 dev "$b"
  wait_for gw.ready $((seconds * 20 + 600)) || { log "gw never got ready"; touch "$share/load.done"; exit 1; }
  # 1. and 2.: generated UDP, new flows then established ones, reflected.
  ip netns exec be timeout $((seconds * 4 + 60)) xvs-pktgen sink --ifname "$b" --queues "$qlist" \
    --addr 198.18.1.10 --reflect --seconds $((seconds * 2 + 10)) > "$share/sink.txt" 2>&1 &
  sink=$!
  sleep 3
  for flows in new 256; do
    timeout $((seconds * 4 + 60)) xvs-pktgen send --ifname "$c" --queues "$qlist" --dst-mac $GW_C \
      --src 198.18.0.2 --dst 198.19.0.1:9000 --flows $flows --seconds "$seconds" --receive \
      2>&1 | sed "s/^/flows=$flows /" >> "$share/load.txt"
    sleep 1
  done
  wait "$sink"
  log "generator done"
  # 3.: real TCP through the VIP.
  ip netns exec be xvs-testnet serve --name load --tcp 198.18.1.10:9090 > "$share/server.txt" 2>&1 &
  server=$!
  # Connect only once it listens: under TCG its start can take seconds, and
  # a SYN before the bind is refused by the backend's kernel.
  ready_in server.txt 120 || log "the TCP server did not start: $(cat "$share/server.txt")"
  timeout $((conns + 300)) xvs-testnet tcp --connect 198.19.0.1:9090 --connections "$conns" \
    --concurrency 8 --payload 2000 --timeout-ms 30000 > "$share/tcp.txt" 2> "$share/tcp.err"
  log "tcp check: $(cat "$share/tcp.txt")"
  kill "$server"; wait "$server"
  touch "$share/load.done"
  ;;
esac
log "done"
