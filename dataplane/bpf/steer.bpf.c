// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * xvs steering program: hands to the AF_XDP socket of the receiving queue
 * only the traffic xvs owns and passes everything else to the kernel, so
 * SSH and the node's own traffic keep working. A queue without a socket
 * falls back to the kernel too (bpf_redirect_map's XDP_PASS default).
 *
 * An address in `owned` is either xvs's alone (OWN_XVS: VIPs, SNAT
 * addresses of their own), and every IPv4 packet to it and ARP about it
 * goes to xvs; or shared with the host (OWN_SHARED: a SNAT address that is
 * also the node's, as kube-proxy masquerades to the node's address), and
 * only what belongs to xvs's SNAT port range goes to xvs: TCP/UDP to a
 * port in `snat_ports`, and ICMP errors quoting a packet sent from such a
 * port. The kernel keeps the rest (its ARP, ping, listening and ephemeral
 * ports). ARP replies to 0.0.0.0 answer xvs's ARP probes (how it resolves
 * next hops from a shared address without taking the kernel's replies)
 * and go to xvs. IPv6 addresses (`owned6`) are always xvs's alone:
 * every packet to one goes to xvs, and so does a neighbour solicitation
 * whose target is one (it is sent to the target's solicited-node group);
 * the kernel keeps every other IPv6 packet (its own neighbour discovery,
 * router advertisements, its addresses). With SETTINGS_ALL (`steering = "all"`) every packet is
 * xvs's, the kernel gets only what no socket takes.
 *
 * The hold window: each worker refreshes its queue's liveness mark in
 * `alive` (CLOCK_MONOTONIC ns, the clock bpf_ktime_get_ns reads) on every
 * turn of its loop. When a queue has no socket (no process, or one still
 * starting), packets xvs owns are dropped while the mark is younger than
 * the hold window, so TCP retransmits instead of the kernel answering with
 * RSTs, and passed to the kernel after it, as if xvs were gone; `held`
 * counts the drops. Traffic xvs does not own is never held.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define OWN_XVS 1
#define OWN_SHARED 2
#define ARP_REPLY 2
#define SETTINGS_ALL 1
#define NDP_SOLICIT 135

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* IPv4 addresses xvs answers for (network byte order) -> OWN_*. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 20);
	__type(key, __u32);
	__type(value, __u8);
} owned SEC(".maps");

/* IPv6 addresses xvs answers for (network byte order) -> OWN_XVS. */
struct addr6 {
	__u8 b[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 20);
	__type(key, struct addr6);
	__type(value, __u8);
} owned6 SEC(".maps");

/* The SNAT port range (host byte order, inclusive) and SETTINGS_*. */
struct settings {
	__u16 first;
	__u16 last;
	__u32 flags;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings);
} settings SEC(".maps");

/* One cache line per queue, written by that queue's worker alone. */
struct liveness {
	__u64 mark_ns;
	__u64 hold_ns;
	__u64 pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct liveness);
} alive SEC(".maps");

/* Packets xvs owns dropped in the hold window. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} held SEC(".maps");

/* Ethernet/IPv4 ARP payload. */
struct arp_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[6];
	__be32 spa;
	__u8 tha[6];
	__be32 tpa;
} __attribute__((packed));

static __always_inline int in_snat_range(__be16 port)
{
	__u32 zero = 0;
	struct settings *r = bpf_map_lookup_elem(&settings, &zero);
	__u16 p = bpf_ntohs(port);

	return r && p >= r->first && p <= r->last;
}

/* Whether a packet to a shared address is xvs's: TCP/UDP to a SNAT port,
 * or an ICMP error about a TCP/UDP packet sent from one. */
static __always_inline int for_xvs(struct iphdr *ip, void *end)
{
	void *l4 = (void *)ip + (ip->ihl & 0xf) * 4;

	if (ip->frag_off & bpf_htons(0x1fff))
		return 0;
	if (ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) {
		__be16 *ports = l4;

		if ((void *)(ports + 2) > end)
			return 0;
		return in_snat_range(ports[1]);
	}
	if (ip->protocol == IPPROTO_ICMP) {
		__u8 *icmp = l4;
		struct iphdr *inner = l4 + 8;
		__be16 *ports;

		if ((void *)(inner + 1) > end)
			return 0;
		if (icmp[0] != 3 && icmp[0] != 11 && icmp[0] != 12)
			return 0;
		if (inner->protocol != IPPROTO_TCP && inner->protocol != IPPROTO_UDP)
			return 0;
		ports = (void *)inner + (inner->ihl & 0xf) * 4;
		if ((void *)(ports + 2) > end)
			return 0;
		return in_snat_range(ports[0]);
	}
	return 0;
}

/* To the queue's socket; without one, a packet xvs owns is held (dropped)
 * while the queue's liveness mark is within the hold window. */
static __always_inline int to_xvs(struct xdp_md *ctx, int owned_by_xvs)
{
	__u32 q = ctx->rx_queue_index;
	__u64 fallback = XDP_PASS;
	long ret;

	if (owned_by_xvs) {
		struct liveness *l = bpf_map_lookup_elem(&alive, &q);

		if (l && l->hold_ns && bpf_ktime_get_ns() - l->mark_ns <= l->hold_ns)
			fallback = XDP_DROP;
	}
	ret = bpf_redirect_map(&xsks, q, fallback);
	if (ret == XDP_DROP) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&held, &zero);

		if (n)
			*n += 1;
	}
	return ret;
}

/* Whether every packet goes to xvs (`steering = "all"`). */
static __always_inline int steer_all(void)
{
	__u32 zero = 0;
	struct settings *s = bpf_map_lookup_elem(&settings, &zero);

	return s && (s->flags & SETTINGS_ALL);
}

SEC("xdp")
int xvs_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 *kind;

	if ((void *)(eth + 1) > end)
		return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__u32 dst;

		if ((void *)(ip + 1) > end)
			return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
		dst = ip->daddr;
		kind = bpf_map_lookup_elem(&owned, &dst);
		if (!kind)
			return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
		if (*kind == OWN_SHARED && !for_xvs(ip, end))
			return XDP_PASS;
	} else if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		struct arp_ipv4 *arp = (void *)(eth + 1);
		__u32 tpa;

		if ((void *)(arp + 1) > end)
			return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
		tpa = arp->tpa;
		if (tpa == 0 && arp->op == bpf_htons(ARP_REPLY))
			return to_xvs(ctx, 0);
		kind = bpf_map_lookup_elem(&owned, &tpa);
		if (!kind || *kind == OWN_SHARED)
			return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		struct addr6 key;

		if ((void *)(ip6 + 1) > end)
			return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
		__builtin_memcpy(key.b, &ip6->daddr, 16);
		if (ip6->nexthdr == IPPROTO_ICMPV6) {
			__u8 *icmp = (void *)(ip6 + 1);

			/* A neighbour solicitation goes to a multicast group:
			 * it is xvs's when its target is. */
			if ((void *)(icmp + 24) <= end && icmp[0] == NDP_SOLICIT)
				__builtin_memcpy(key.b, icmp + 8, 16);
		}
		kind = bpf_map_lookup_elem(&owned6, &key);
		if (!kind)
			return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
	} else {
		return steer_all() ? to_xvs(ctx, 0) : XDP_PASS;
	}
	return to_xvs(ctx, 1);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
