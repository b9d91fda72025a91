#!/usr/bin/env bash
# Runs inside a benchmark VM at boot: the role (`gw` or `load`), duration
# and queue count come from the kernel command line (xvs.role=,
# xvs.seconds=, xvs.queues=); results go to the 9p share from the host.
# Interfaces are found by the MACs run-bench.sh assigns.
set -uo pipefail
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^xvs\.$1=//p"; }
role=$(arg role); seconds=$(arg seconds); queues=$(arg queues)
[ -n "$role" ] || exit 0
share=/mnt/share
mkdir -p "$share"
mount -t 9p -o trans=virtio,version=9p2000.L share "$share" || { echo "no 9p share" >&2; poweroff; }
by_mac() { for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$1" ] && basename "$d"; done; }
GW_C=52:54:00:78:00:01; GW_B=52:54:00:78:00:02; LD_C=52:54:00:78:00:11; LD_B=52:54:00:78:00:12
qlist=$(seq -s, 0 $((queues - 1)))
log() { echo "$role: $*" | tee -a "$share/$role.log"; }

case "$role" in
gw)
  c=$(by_mac $GW_C); b=$(by_mac $GW_B)
  ip addr add 198.18.0.1/24 dev "$c"; ip addr add 198.18.1.1/24 dev "$b"
  for i in "$c" "$b"; do ip link set "$i" up; ethtool -L "$i" combined "$queues" 2>/dev/null; done
  cores=$(seq -s, 0 $((queues - 1)))
  cat > /tmp/xvs.toml <<CFG
[interfaces]
mode = "two-arm"
client = "$c"
backend = "$b"
queues = [$qlist]
cores = [$cores]
poll = "busy"

[snat]
addresses = ["198.18.1.2", "198.18.1.3", "198.18.1.4", "198.18.1.5"]
ports = "1024-65535"

[conntrack.timeouts]
udp = 1

[[services]]
vip = "198.19.0.1"
protocol = "udp"
port = 9000
scheduler = "rr"
backends = [{ address = "198.18.1.10", port = 9000 }]
CFG
  xvs run --config /tmp/xvs.toml > "$share/gw.xvs.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q '^ready' "$share/gw.xvs.out" && break; sleep 0.2; done
  log "xvs ready"; touch "$share/gw.ready"
  for _ in $(seq $((seconds * 4 + 120))); do [ -e "$share/done" ] && break; sleep 1; done
  kill -TERM "$pid"; wait "$pid"
  log "xvs stopped"
  ;;
load)
  c=$(by_mac $LD_C); b=$(by_mac $LD_B)
  ip addr add 198.18.0.2/24 dev "$c"; ip addr add 198.18.1.10/24 dev "$b"
  for i in "$c" "$b"; do ip link set "$i" up; ethtool -L "$i" combined "$queues" 2>/dev/null; done
  for _ in $(seq 120); do [ -e "$share/gw.ready" ] && break; sleep 1; done
  xvs-pktgen sink --ifname "$b" --queues "$qlist" --addr 198.18.1.10 --seconds $((seconds * 2 + 8)) > "$share/sink.txt" 2>&1 &
  sink=$!
  sleep 1
  for flows in new 256; do
    xvs-pktgen send --ifname "$c" --queues "$qlist" --dst-mac $GW_C --src 198.18.0.2 --src-count 200 \
      --dst 198.19.0.1:9000 --flows $flows --seconds "$seconds" | sed "s/^/flows=$flows /" >> "$share/load.txt"
    sleep 1
  done
  wait "$sink"
  log "done"; touch "$share/done"
  ;;
esac
sync
poweroff
