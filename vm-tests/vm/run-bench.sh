#!/usr/bin/env bash
# Boots the two benchmark VMs (see README.md) joined by host bridges with
# multi-queue taps, waits for their results, prints them, and removes
# everything it created. Usage: run-bench.sh [SECONDS] [QUEUES]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out="$here/out"
seconds="${1:-10}"
queues="${2:-2}"
img="$out/xvs-vm.img"

fail() { echo "run-bench.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || fail "run as root (bridges, taps, KVM)"
[ -e /dev/kvm ] || fail "no /dev/kvm"
command -v qemu-system-x86_64 >/dev/null || fail "qemu-system-x86_64 not installed"
[ -f "$img" ] && [ -f "$out/vmlinuz" ] || fail "no image: run vm-tests/vm/build-image.sh"
[ "$seconds" -gt 0 ] && [ "$seconds" -le 300 ] || fail "SECONDS must be 1..300"

res="$out/results"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for t in xvs-gc xvs-gb xvs-lc xvs-lb; do ip link del "$t" 2>/dev/null || true; done
  for br in xvsbr-c xvsbr-b; do ip link del "$br" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$res"; mkdir -p "$res"

for br in xvsbr-c xvsbr-b; do
  ip link add "$br" type bridge
  ip link set "$br" up
done
tap() { # name bridge
  ip tuntap add dev "$1" mode tap multi_queue
  ip link set "$1" master "$2"
  ip link set "$1" up
}
tap xvs-gc xvsbr-c; tap xvs-lc xvsbr-c
tap xvs-gb xvsbr-b; tap xvs-lb xvsbr-b

vhost=off; [ -e /dev/vhost-net ] && vhost=on
nic() { # id tap mac
  echo "-netdev tap,id=$1,ifname=$2,script=no,downscript=no,queues=$queues,vhost=$vhost" \
       "-device virtio-net-pci,netdev=$1,mac=$3,mq=on,vectors=$((2 * queues + 2))"
}
boot() { # role tap-c mac-c tap-b mac-b
  qemu-img create -q -f qcow2 -b "$img" -F raw "$work/$1.qcow2"
  # shellcheck disable=SC2046 # nic() expands to several words on purpose
  qemu-system-x86_64 -enable-kvm -cpu host -smp 2 -m 2048 -nographic -no-reboot \
    -kernel "$out/vmlinuz" -initrd "$out/initrd.img" \
    -append "root=LABEL=xvsroot rw console=ttyS0 quiet xvs.role=$1 xvs.seconds=$seconds xvs.queues=$queues" \
    -drive "file=$work/$1.qcow2,if=virtio,format=qcow2" \
    $(nic n0 "$2" "$3") $(nic n1 "$4" "$5") \
    -virtfs "local,path=$res,mount_tag=share,security_model=none" \
    -serial "file:$res/$1.console" -monitor none -display none &
  pids+=($!)
}
boot gw xvs-gc 52:54:00:78:00:01 xvs-gb 52:54:00:78:00:02
boot load xvs-lc 52:54:00:78:00:11 xvs-lb 52:54:00:78:00:12

deadline=$((SECONDS + seconds * 4 + 240))
while [ ! -e "$res/done" ]; do
  [ $SECONDS -lt $deadline ] || fail "no results after $((seconds * 4 + 240)) s (consoles in $res)"
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a VM exited early (consoles in $res)"; done
  sleep 2
done
for p in "${pids[@]}"; do
  for _ in $(seq 60); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
done
echo "generator (load VM), $queues queues, $seconds s per run:"
cat "$res/load.txt"
echo "sink: $(cat "$res/sink.txt")"
echo "xvs: $(grep '^worker' "$res/gw.xvs.out" | tr '\n' ' ')"
