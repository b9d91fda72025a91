#!/usr/bin/env bash
# The optional VM step of `make test`: a short two-VM run when KVM, QEMU and
# the image are there; otherwise a printed reason and success.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "vm bench: skipped: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root"
[ -r /dev/kvm ] || skip "no usable /dev/kvm"
grep -qE 'vmx|svm' /proc/cpuinfo || skip "the CPU exposes no virtualisation extensions (no nested KVM)"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not installed (apt-get install qemu-system-x86)"
[ -f "$here/out/xvs-vm.img" ] || skip "no image (make vm-image)"
"$here/run-bench.sh" 3 2 | tee "$here/out/check.txt"
sink=$(sed -n 's/.*received=\([0-9]*\).*/\1/p' "$here/out/results/sink.txt")
[ "${sink:-0}" -gt 0 ] || { echo "vm bench: nothing reached the sink" >&2; exit 1; }
echo "vm bench: ok ($sink frames at the sink)"
