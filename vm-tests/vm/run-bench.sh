#!/usr/bin/env bash
# Boots the two benchmark VMs (see README.md), joined by bridges with
# multi-queue taps inside a network namespace of its own, waits for them
# to power off, prints what they measured, and removes everything it
# created. Usage: run-bench.sh [SECONDS] [QUEUES]
#
# Environment: XVS_BIN_DIR (the xvs, xvs-pktgen and xvs-testnet binaries
# the VMs mount; default target/release), XVS_VM_ACCEL (auto | kvm | tcg;
# auto boots a kernel under KVM once and falls back to TCG), XVS_VM_CONNS
# (connections of the TCP check, default 300), XVS_VM_POLL (xvs's poll
# mode; default busy under KVM, adaptive under TCG, where the two VMs'
# vCPUs share the host's cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$here/out"
seconds="${1:-10}"
queues="${2:-2}"
img="$out/xvs-vm.img"
bins="${XVS_BIN_DIR:-$root/target/release}"
conns="${XVS_VM_CONNS:-300}"

fail() { echo "run-bench.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || fail "run as root (namespace, bridges, taps)"
command -v qemu-system-x86_64 >/dev/null || fail "qemu-system-x86_64 not installed (make deps)"
[ -f "$img" ] && [ -f "$out/vmlinuz" ] || fail "no image: run vm-tests/vm/build-image.sh"
[[ "$seconds" =~ ^[0-9]+$ ]] && [ "$seconds" -gt 0 ] && [ "$seconds" -le 300 ] || fail "SECONDS must be 1..300"
[[ "$queues" =~ ^[0-9]+$ ]] && [ "$queues" -ge 1 ] && [ "$queues" -le 8 ] || fail "QUEUES must be 1..8"
for b in xvs xvs-pktgen xvs-testnet; do
  [ -x "$bins/$b" ] || fail "$bins/$b missing (cargo build --release --workspace --bins, or set XVS_BIN_DIR)"
done

res="$out/results"
work=$(mktemp -d)
ns="xvst-vm-$$"
# A run killed before its cleanup (SIGKILL) leaves its namespace: removed
# here when the run that made it (the PID in its name) is gone and no
# process is left in it.
for old in $(ip netns list | awk '/^xvst-vm-[0-9]+( |$)/ {print $1}'); do
  pid=${old#xvst-vm-}
  if ! kill -0 "$pid" 2>/dev/null && [ -z "$(ip netns pids "$old" 2>/dev/null)" ]; then
    ip netns del "$old" && echo "removed $old, left by a run that was killed"
  fi
done
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$res"; mkdir -p "$res"

# The accelerator: KVM when a standard kernel boots with it, TCG otherwise.
# The probe boots the image's kernel with no root file system: it panics
# at once, and -no-reboot ends QEMU then.
accel_probe() {
  timeout 30 qemu-system-x86_64 -accel kvm -cpu host -m 256 -smp 1 -no-reboot \
    -kernel "$out/vmlinuz" -append "console=ttyS0 panic=-1" \
    -serial "file:$work/probe.console" -monitor none -display none -nodefaults \
    > "$work/probe.out" 2>&1 || true
  grep -qE "Kernel panic|Unable to mount root" "$work/probe.console" 2>/dev/null
}
accel="${XVS_VM_ACCEL:-auto}"
why=""
case "$accel" in
auto)
  if [ ! -e /dev/kvm ]; then
    accel=tcg; why="no /dev/kvm"
  elif { accel_probe; } 2>/dev/null; then
    accel=kvm
  else
    accel=tcg
    why="a kernel does not boot under KVM here: $(head -c 200 "$work/probe.out" | tr '\n' ' ')"
  fi
  ;;
kvm | tcg) why="XVS_VM_ACCEL" ;;
*) fail "XVS_VM_ACCEL must be auto, kvm or tcg" ;;
esac
if [ "$accel" = kvm ]; then
  accel_args=(-accel kvm -cpu host)
  poll="${XVS_VM_POLL:-busy}"
  echo "accelerator: kvm${why:+ ($why)}"
else
  accel_args=(-accel tcg,thread=multi -cpu max)
  poll="${XVS_VM_POLL:-adaptive}"
  echo "accelerator: tcg, software emulation (${why}): the figures below prove the recipe works; they measure nothing"
fi
echo "$accel" > "$res/accel"

# The VMs' links: two bridges with two multi-queue taps each, all in $ns.
ip netns add "$ns"
inns() { ip netns exec "$ns" "$@"; }
inns ip link set lo up
for br in brc brb; do
  inns ip link add "$br" type bridge
  inns sysctl -qw "net.ipv6.conf.$br.disable_ipv6=1"
  inns ip link set "$br" up
done
tap() { # name bridge
  inns ip tuntap add dev "$1" mode tap multi_queue
  inns sysctl -qw "net.ipv6.conf.$1.disable_ipv6=1"
  inns ip link set "$1" master "$2"
  inns ip link set "$1" up
}
tap gc brc; tap lc brc
tap gb brb; tap lb brb

# The binaries and the role script, shared read-only and read-write.
mkdir -p "$work/bin"
for b in xvs xvs-pktgen xvs-testnet; do cp "$bins/$b" "$work/bin/"; done
cp "$here/role.sh" "$res/role.sh"

vhost=off; [ -e /dev/vhost-net ] && vhost=on
smp=$((queues > 2 ? queues : 2))
nic() { # id tap mac
  echo "-netdev tap,id=$1,ifname=$2,script=no,downscript=no,queues=$queues,vhost=$vhost" \
       "-device virtio-net-pci,netdev=$1,mac=$3,mq=on,vectors=$((2 * queues + 2))"
}
boot() { # role tap-c mac-c tap-b mac-b
  qemu-img create -q -f qcow2 -b "$img" -F raw "$work/$1.qcow2"
  # shellcheck disable=SC2046 # nic() expands to several words on purpose
  inns qemu-system-x86_64 "${accel_args[@]}" -smp "$smp" -m 1024 -no-reboot -nodefaults \
    -kernel "$out/vmlinuz" -initrd "$out/initrd.img" \
    -append "root=LABEL=xvsroot rw console=ttyS0 init=/sbin/xvs-init panic=-1 quiet xvs.role=$1 xvs.seconds=$seconds xvs.queues=$queues xvs.poll=$poll xvs.conns=$conns" \
    -drive "file=$work/$1.qcow2,if=virtio,format=qcow2" \
    $(nic n0 "$2" "$3") $(nic n1 "$4" "$5") \
    -virtfs "local,path=$res,mount_tag=share,security_model=none" \
    -virtfs "local,path=$work/bin,mount_tag=bin,security_model=none,readonly=on" \
    -serial "file:$res/$1.console" -monitor none -display none > "$res/$1.qemu" 2>&1 &
  pids+=($!)
}
started=$SECONDS
boot gw gc 52:54:00:78:00:01 gb 52:54:00:78:00:02
boot load lc 52:54:00:78:00:11 lb 52:54:00:78:00:12

# Both VMs power off when done; a VM that outlives the budget is stopped.
if [ "$accel" = kvm ]; then budget=$((120 + seconds * 6 + conns / 10)); else budget=$((300 + seconds * 20 + conns)); fi
for p in "${pids[@]}"; do
  while kill -0 "$p" 2>/dev/null; do
    [ $((SECONDS - started)) -lt "$budget" ] || fail "the VMs did not finish in $budget s (consoles in $res)"
    sleep 1
  done
done
echo "VMs ran $((SECONDS - started)) s ($queues queues, $smp vCPUs each, xvs poll $poll)"
echo "generator (load VM), $seconds s per run:"
sed 's/^/  /' "$res/load.txt" 2>/dev/null || echo "  (nothing)"
echo "sink (load VM, backend side): $(cat "$res/sink.txt" 2>/dev/null)"
echo "xvs (gw VM):"
grep -E '^worker' "$res/gw.xvs.out" 2>/dev/null | sed 's/^/  /' || echo "  (no counters)"
echo "xvs status in the gw VM, before it stopped:"
sed 's/^/  /' "$res/gw.status" 2>/dev/null || echo "  (none)"
echo "TCP check: $(cat "$res/tcp.txt" 2>/dev/null)"
