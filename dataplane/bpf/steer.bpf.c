// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * xvs steering program: hands to the AF_XDP socket of the receiving queue
 * only the traffic xvs owns — IPv4 packets to, and ARP requests/replies
 * about, an address in `owned` (VIPs and SNAT addresses) — and passes
 * everything else to the kernel, so SSH and the node's own traffic keep
 * working. A queue without a socket falls back to the kernel too
 * (bpf_redirect_map's XDP_PASS default).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* IPv4 addresses xvs answers for, network byte order. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 20);
	__type(key, __u32);
	__type(value, __u8);
} owned SEC(".maps");

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

SEC("xdp")
int xvs_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 dst;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		dst = ip->daddr;
	} else if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		struct arp_ipv4 *arp = (void *)(eth + 1);

		if ((void *)(arp + 1) > end)
			return XDP_PASS;
		dst = arp->tpa;
	} else {
		return XDP_PASS;
	}
	if (!bpf_map_lookup_elem(&owned, &dst))
		return XDP_PASS;
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
