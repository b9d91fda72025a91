#!/usr/bin/env bash
# Builds vm-tests/vm/out/xvs-vm.img: a Debian bookworm root file system
# (raw ext4, booted with the kernel and initrd copied next to it) carrying
# the release binaries and the boot-time role runner. See README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$here/out"
img="$out/xvs-vm.img"
size="${XVS_VM_SIZE:-2G}"
mirror="${XVS_VM_MIRROR:-http://deb.debian.org/debian}"
# The release binaries (the Makefile passes cargo's target directory).
release="${XVS_RELEASE_DIR:-$root/target/release}"

[ "$(id -u)" = 0 ] || { echo "build-image.sh: run as root (debootstrap, loop mount)" >&2; exit 2; }
for bin in xvs xvs-pktgen; do
  [ -x "$release/$bin" ] || {
    echo "build-image.sh: $release/$bin missing: cargo build --release --workspace --bins" >&2
    exit 2
  }
done
missing=()
for pkg in debootstrap qemu-utils e2fsprogs; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

mkdir -p "$out"
mnt=$(mktemp -d)
cleanup() {
  for m in proc sys dev; do umount "$mnt/$m" 2>/dev/null || true; done
  umount "$mnt" 2>/dev/null || true
  rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT
rm -f "$img.tmp"
truncate -s "$size" "$img.tmp"
mkfs.ext4 -F -q -L xvsroot "$img.tmp"
mount -o loop "$img.tmp" "$mnt"
debootstrap --variant=minbase \
  --include=linux-image-amd64,systemd-sysv,udev,iproute2,ethtool,kmod,libelf1,zlib1g,procps \
  bookworm "$mnt" "$mirror"

install -m 0755 "$release/xvs" "$release/xvs-pktgen" "$mnt/usr/local/bin/"
install -m 0755 "$here/role.sh" "$mnt/usr/local/bin/xvs-role"
cat > "$mnt/etc/systemd/system/xvs-role.service" <<'UNIT'
[Unit]
Description=xvs benchmark role (from the kernel command line)
After=local-fs.target
[Service]
Type=oneshot
ExecStart=/usr/local/bin/xvs-role
StandardOutput=journal+console
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/xvs-role.service "$mnt/etc/systemd/system/multi-user.target.wants/xvs-role.service"
echo "xvs-vm" > "$mnt/etc/hostname"
printf 'LABEL=xvsroot / ext4 defaults 0 1\n' > "$mnt/etc/fstab"
# 9p for the shared results directory.
printf '9p\n9pnet\n9pnet_virtio\n' >> "$mnt/etc/modules"

cp "$mnt"/boot/vmlinuz-* "$out/vmlinuz"
cp "$mnt"/boot/initrd.img-* "$out/initrd.img"
cleanup
trap - EXIT
mv "$img.tmp" "$img"
echo "built $img ($(du -h "$img" | cut -f1) used), kernel and initrd in $out"
