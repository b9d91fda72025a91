#!/usr/bin/env bash
# Builds vm-tests/vm/out/xvs-vm.img: a minimal Debian root file system (raw
# ext4, booted with the kernel and initrd copied next to it). It holds no
# xvs binary and no test script: the VMs mount those from the host over 9p
# at boot (run-bench.sh), so one image serves every build and every change
# to the recipe. The image is rebuilt only when this script changes (its
# hash is stamped next to it). See README.md.
#
# The suite is the host's (the binaries are built against its glibc).
# Downloaded packages are kept in out/debs, so a rebuild downloads nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out="$here/out"
img="$out/xvs-vm.img"
stamp="$out/xvs-vm.stamp"
size="${XVS_VM_SIZE:-2G}"
mirror="${XVS_VM_MIRROR:-http://deb.debian.org/debian}"
suite="${XVS_VM_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}"
want="$(sha256sum "$0" | cut -d' ' -f1) $suite"

if [ -f "$img" ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initrd.img" ] &&
   [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ "${1:-}" != "--force" ]; then
  echo "vm image: $img is current ($suite)"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build-image.sh: run as root (debootstrap, loop mount)" >&2; exit 2; }
for tool in debootstrap mkfs.ext4; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool missing (make deps)" >&2; exit 2; }
done

mkdir -p "$out/debs"
mnt=$(mktemp -d)
cleanup() {
  umount "$mnt" 2>/dev/null || true
  rmdir "$mnt" 2>/dev/null || true
  rm -f "$img.tmp"
}
trap cleanup EXIT
rm -f "$img" "$stamp"
truncate -s "$size" "$img.tmp"
mkfs.ext4 -F -q -L xvsroot "$img.tmp"
mount -o loop "$img.tmp" "$mnt"
started=$SECONDS
# minbase and no init system: the VM's PID 1 is the stub below. iproute2
# and ethtool configure the links; libelf1 and zlib1g are xvs's libraries.
timeout 900 debootstrap --variant=minbase --cache-dir="$out/debs" \
  --include=linux-image-amd64,iproute2,ethtool,kmod,libelf1,zlib1g,procps \
  "$suite" "$mnt" "$mirror"

# PID 1: mounts what the recipe needs, then runs the role script the host
# shares (run-bench.sh puts it in the share), then powers the VM off.
cat > "$mnt/sbin/xvs-init" <<'INIT'
#!/bin/sh
export PATH=/opt/xvs:/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
for m in virtio_net 9pnet_virtio 9p; do modprobe "$m"; done
mkdir -p /mnt/share /opt/xvs
mount -t 9p -o trans=virtio,version=9p2000.L share /mnt/share
mount -t 9p -o trans=virtio,version=9p2000.L,ro bin /opt/xvs
ip link set lo up
echo 1 > /proc/sys/kernel/sysrq
/bin/sh /mnt/share/role.sh > /dev/console 2>&1
sync
umount /mnt/share /opt/xvs 2>/dev/null
echo o > /proc/sysrq-trigger
sleep 60
INIT
chmod 0755 "$mnt/sbin/xvs-init"
echo "xvs-vm" > "$mnt/etc/hostname"
printf 'LABEL=xvsroot / ext4 defaults 0 1\n' > "$mnt/etc/fstab"
cp "$mnt"/boot/vmlinuz-* "$out/vmlinuz"
cp "$mnt"/boot/initrd.img-* "$out/initrd.img"
rm -rf "$mnt"/var/cache/apt/archives/*.deb "$mnt"/var/lib/apt/lists/*
umount "$mnt"
mv "$img.tmp" "$img"
echo "$want" > "$stamp"
echo "vm image: built $img ($suite, $(du -h "$img" | cut -f1) used) in $((SECONDS - started)) s"
