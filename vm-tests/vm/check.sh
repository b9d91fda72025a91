#!/usr/bin/env bash
# `make vm-test`: the two-VM recipe end to end. Builds the image if it is
# missing or stale (build-image.sh), boots both VMs (KVM when a kernel boots
# with it here, TCG otherwise), runs the generator's new-flow and
# established-flow runs and the TCP check, and fails unless:
#  - frames reached the sink, and replies came back to the generator;
#  - every xvs worker's frames are accounted for (rx = forwarded + answered
#    + consumed + dropped);
#  - with more than one queue, frames were handed between workers;
#  - every TCP connection through the VIP echoed its bytes;
#  - xvs reported its interfaces' XDP mode.
# Usage: check.sh [SECONDS] [QUEUES]; XVS_BIN_DIR as for run-bench.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds="${1:-3}"
queues="${2:-2}"
res="$here/out/results"
started=$SECONDS
# Like the namespace tests, it needs root (namespaces, taps, loop mounts).
[ "$(id -u)" = 0 ] || { echo "vm-test: skipped: needs root"; exit 0; }

bash "$here/build-image.sh"
bash "$here/run-bench.sh" "$seconds" "$queues" | tee "$here/out/check.txt"

bad=0
no() { echo "vm-test: FAILED: $*" >&2; bad=1; }
field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p"; }

sink=$(field received < "$res/sink.txt")
[ "${sink:-0}" -gt 0 ] || no "nothing reached the sink: $(cat "$res/sink.txt" 2>/dev/null)"
for flows in new 256; do
  line=$(grep "^flows=$flows " "$res/load.txt" || true)
  [ "$(echo "$line" | field sent)" -gt 0 ] 2>/dev/null || no "the $flows-flow run sent nothing: $line"
  [ "$(echo "$line" | field received)" -gt 0 ] 2>/dev/null || no "no reply came back in the $flows-flow run: $line"
done

workers=$(grep -c '^worker' "$res/gw.xvs.out" || true)
[ "$workers" = "$queues" ] || no "$workers xvs workers for $queues queues"
unaccounted=$(grep '^worker' "$res/gw.xvs.out" | grep -vc 'frames_accounted=true' || true)
[ "$unaccounted" = 0 ] || no "$unaccounted workers' frames not accounted for"
handed=0
while read -r line; do
  # The identity itself, not only xvs's word for it.
  rx=$(echo "$line" | field rx)
  out=0
  for k in forwarded answered consumed dropped; do out=$((out + $(echo "$line" | field $k))); done
  [ "${rx:-x}" = "$out" ] || no "rx $rx != forwarded + answered + consumed + dropped ($out): $line"
  n=$(echo "$line" | field handed_off)
  handed=$((handed + ${n:-0}))
done < <(grep '^worker' "$res/gw.xvs.out")
if [ "$queues" -gt 1 ]; then
  [ "$handed" -gt 0 ] || no "no frame was handed between the $queues workers"
fi
grep -q 'exited 0' "$res/gw.log" || no "xvs did not exit cleanly: $(tail -3 "$res/gw.log")"

conns="${XVS_VM_CONNS:-300}"
grep -q "^ok=$conns failed=0" "$res/tcp.txt" ||
  no "TCP check: $(cat "$res/tcp.txt") $(head -5 "$res/tcp.err" 2>/dev/null)"

modes=$(sed -n 's/^Interfaces: *//p' "$res/gw.status")
[ -n "$modes" ] || no "no XDP mode in xvs status: $(head -5 "$res/gw.status")"

if [ "$bad" != 0 ]; then
  echo "vm-test: consoles and logs in $res" >&2
  exit 1
fi
echo "vm-test: ok in $((SECONDS - started)) s ($(cat "$res/accel")): sink $sink frames," \
  "$handed handed between workers, TCP $(cat "$res/tcp.txt"); XDP: $modes"
