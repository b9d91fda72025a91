#!/usr/bin/env bash
# Installs the Debian packages that building and testing xvs need, and only
# those that are missing. Idempotent: a second run installs nothing and does
# not touch the network.
set -euo pipefail

# Build: clang/llvm compile the XDP steering program and libxdp/libbpf (via
# xsk-rs); libelf, zlib, libpcap headers, m4 and pkg-config are what
# libxdp/libbpf's build needs; libbpf-dev gives the BPF program its headers.
# Tests: iproute2 (netns, veth), iputils-ping and arping (reachability), ethtool (offloads off on veths), iptables and
# nftables (the baselines of the end-to-end bench), systemd (systemd-analyze
# verify of the unit file), curl (the admin API over its unix socket, and a
# real HTTP client), nginx-light (real HTTP backends), wrk (a real load tool
# that reuses client ports), hping3 (an unbounded SYN flood) and tcpdump (the
# restart tests capture on the client's interface to prove no reset),
# dnsmasq-base and bind9-dnsutils (DNS real servers and dig, a resolver's
# client, through a UDP and TCP service); man-db
# and lintian (the Debian package's test renders its man pages and lints it);
# python3-prometheus-client (the official client's parser reads /metrics);
# chromium and a font (the web view's test opens it in a real, headless
# browser and takes a screenshot); qemu-system-x86, qemu-utils, debootstrap
# and e2fsprogs (`make vm-test` builds a Debian image and boots two VMs).
packages=(
  clang llvm libelf-dev zlib1g-dev libpcap-dev libbpf-dev m4 pkg-config
  linux-libc-dev libc6-dev gcc g++ make iproute2 iputils-ping arping ethtool iptables nftables systemd curl
  nginx-light wrk hping3 tcpdump dnsmasq-base bind9-dnsutils man-db lintian python3-prometheus-client chromium fonts-dejavu-core
  qemu-system-x86 qemu-utils debootstrap e2fsprogs
)

# The packages of the list not installed now.
missing_now() {
  local p
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}

mapfile -t missing < <(missing_now)

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages: ${missing[*]}; run 'make deps' as root" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Installing can remove a package of the list that was present: one from
# another release that conflicts with what was just installed (a
# backported qemu-utils against the release's qemu-system-x86). Those are
# installed again, from the release the rest came from.
mapfile -t removed < <(missing_now)
if [ ${#removed[@]} -gt 0 ]; then
  echo "deps: installing again what that install removed: ${removed[*]}"
  apt-get install -y -qq --no-install-recommends "${removed[@]}"
fi
mapfile -t still < <(missing_now)
if [ ${#still[@]} -gt 0 ]; then
  echo "deps: could not install: ${still[*]}" >&2
  exit 1
fi
