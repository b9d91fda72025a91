//! Address families: what the flow key, the flow table, the neighbour
//! table and the checksum code need of an IP address, so each is written
//! once for both families.
//!
//! The hot path is generic over [`Address`] (monomorphised: an IPv4 flow
//! key stays 13 bytes and a flow entry 88, and an IPv4 lookup compiles to
//! what it was before the trait existed). [`IpAddr`] implements it as well,
//! for code where one value must hold either family; the `family` bench
//! measures what that costs a flow table (see the README's layout
//! section).
//!
//! Invariant: `octets()` is the address in network byte order, of
//! [`Address::LEN`] bytes (4 or 16; for [`IpAddr`], that of its variant).

use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Which family an address belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// An IP address as the data plane handles it.
pub trait Address:
    Copy + Eq + Ord + Hash + Debug + Display + Send + Sync + Unpin + 'static
{
    /// The address in network byte order.
    type Octets: AsRef<[u8]> + Copy;
    /// A network of this family (source ranges).
    type Net: Copy + Eq + Ord + Hash + Debug + Display + Send + Sync + 'static;
    /// Length of the address in bytes (the largest, for [`IpAddr`]).
    const LEN: usize;
    /// The unspecified address (`0.0.0.0`).
    const UNSPECIFIED: Self;
    /// The all-ones address: the netmask that keeps every bit.
    const ALL_ONES: Self;

    /// The address in network byte order.
    fn octets(&self) -> Self::Octets;
    /// How many 16-bit words it has.
    #[inline]
    fn word_count(&self) -> u64 {
        self.octets().as_ref().len() as u64 / 2
    }
    /// The sum of its 16-bit words in network order (what an Internet
    /// checksum adds for it).
    #[inline]
    fn word_sum(&self) -> u64 {
        self.octets()
            .as_ref()
            .chunks_exact(2)
            .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
            .sum()
    }
    /// Its family.
    fn family(&self) -> Family;
    /// The address folded to 32 bits as IPVS's hashing schedulers fold it
    /// (`ipv6_addr_hash`: the XOR of the four 32-bit words of an IPv6
    /// address; an IPv4 address is itself), in host order.
    fn fold32(&self) -> u32 {
        self.octets()
            .as_ref()
            .chunks_exact(4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
            .fold(0, |a, w| a ^ w)
    }
    /// The address with only the bits of `mask` kept.
    fn masked(&self, mask: Self) -> Self;
    /// Whether `net` holds this address.
    fn within(&self, net: &Self::Net) -> bool;
    /// `ip` as this family's address, if it is of this family.
    fn from_ip(ip: IpAddr) -> Option<Self>;
    /// `net` as this family's network, if it is of this family.
    fn net_from(net: IpNet) -> Option<Self::Net>;
    /// This family's network as either family's.
    fn net_wide(net: Self::Net) -> IpNet;
    /// As the standard enum.
    fn ip(&self) -> IpAddr;
}

impl Address for Ipv4Addr {
    type Octets = [u8; 4];
    type Net = Ipv4Net;
    const LEN: usize = 4;
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    const ALL_ONES: Self = Ipv4Addr::BROADCAST;

    #[inline(always)]
    fn octets(&self) -> [u8; 4] {
        Ipv4Addr::octets(self)
    }
    #[inline(always)]
    fn word_count(&self) -> u64 {
        2
    }
    #[inline(always)]
    fn word_sum(&self) -> u64 {
        let v = u32::from(*self);
        u64::from(v >> 16) + u64::from(v & 0xffff)
    }
    fn family(&self) -> Family {
        Family::V4
    }
    #[inline]
    fn fold32(&self) -> u32 {
        u32::from(*self)
    }
    fn masked(&self, mask: Self) -> Self {
        Ipv4Addr::from(u32::from(*self) & u32::from(mask))
    }
    #[inline]
    fn within(&self, net: &Ipv4Net) -> bool {
        net.contains(self)
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }
    fn net_wide(net: Ipv4Net) -> IpNet {
        IpNet::V4(net)
    }
    fn net_from(net: IpNet) -> Option<Ipv4Net> {
        match net {
            IpNet::V4(n) => Some(n),
            IpNet::V6(_) => None,
        }
    }
    fn ip(&self) -> IpAddr {
        IpAddr::V4(*self)
    }
}

impl Address for Ipv6Addr {
    type Octets = [u8; 16];
    type Net = Ipv6Net;
    const LEN: usize = 16;
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    const ALL_ONES: Self = Ipv6Addr::from_bits(u128::MAX);

    #[inline]
    fn octets(&self) -> [u8; 16] {
        Ipv6Addr::octets(self)
    }
    fn family(&self) -> Family {
        Family::V6
    }
    fn masked(&self, mask: Self) -> Self {
        Ipv6Addr::from(u128::from(*self) & u128::from(mask))
    }
    #[inline]
    fn within(&self, net: &Ipv6Net) -> bool {
        net.contains(self)
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        }
    }
    fn net_wide(net: Ipv6Net) -> IpNet {
        IpNet::V6(net)
    }
    fn net_from(net: IpNet) -> Option<Ipv6Net> {
        match net {
            IpNet::V6(n) => Some(n),
            IpNet::V4(_) => None,
        }
    }
    fn ip(&self) -> IpAddr {
        IpAddr::V6(*self)
    }
}

/// Either family in one value; its octets are those of its variant.
#[derive(Debug, Clone, Copy)]
pub struct Octets {
    bytes: [u8; 16],
    len: u8,
}

impl AsRef<[u8]> for Octets {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl Address for IpAddr {
    type Octets = Octets;
    type Net = IpNet;
    const LEN: usize = 16;
    const UNSPECIFIED: Self = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    const ALL_ONES: Self = IpAddr::V4(Ipv4Addr::BROADCAST);

    #[inline]
    fn octets(&self) -> Octets {
        let mut bytes = [0; 16];
        match self {
            IpAddr::V4(a) => {
                bytes[..4].copy_from_slice(&a.octets());
                Octets { bytes, len: 4 }
            }
            IpAddr::V6(a) => Octets {
                bytes: a.octets(),
                len: 16,
            },
        }
    }
    fn family(&self) -> Family {
        match self {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    fn masked(&self, mask: Self) -> Self {
        match (self, mask) {
            (IpAddr::V4(a), IpAddr::V4(m)) => IpAddr::V4(a.masked(m)),
            (IpAddr::V6(a), IpAddr::V6(m)) => IpAddr::V6(a.masked(m)),
            (a, _) => *a,
        }
    }
    fn within(&self, net: &IpNet) -> bool {
        net.contains(self)
    }
    fn from_ip(ip: IpAddr) -> Option<Self> {
        Some(ip)
    }
    fn net_wide(net: IpNet) -> IpNet {
        net
    }
    fn net_from(net: IpNet) -> Option<IpNet> {
        Some(net)
    }
    fn ip(&self) -> IpAddr {
        *self
    }
}

/// An address and a port as ipvsadm and URLs write them: `198.18.0.1:80`,
/// `[2001:2::1]:80`.
#[derive(Debug, Clone, Copy)]
pub struct HostPort<A>(pub A, pub u16);

impl<A: Address> Display for HostPort<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.family() {
            Family::V4 => write!(f, "{}:{}", self.0, self.1),
            Family::V6 => write!(f, "[{}]:{}", self.0, self.1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round<A: Address>(a: A) -> (Family, Vec<u8>, IpAddr) {
        (a.family(), a.octets().as_ref().to_vec(), a.ip())
    }

    #[test]
    fn each_family_gives_its_octets_in_network_order() {
        let v4 = Ipv4Addr::new(198, 18, 0, 1);
        let v6: Ipv6Addr = "2001:2::1".parse().unwrap();
        assert_eq!(round(v4), (Family::V4, vec![198, 18, 0, 1], IpAddr::V4(v4)));
        assert_eq!(round(v6).0, Family::V6);
        assert_eq!(round(v6).1, v6.octets().to_vec());
        assert_eq!(round(IpAddr::V4(v4)).1, vec![198, 18, 0, 1]);
        assert_eq!(round(IpAddr::V6(v6)).1.len(), 16);
        assert_eq!(<Ipv4Addr as Address>::LEN, 4);
        assert_eq!(<Ipv6Addr as Address>::UNSPECIFIED, Ipv6Addr::UNSPECIFIED);
        assert_eq!(<Ipv6Addr as Address>::ALL_ONES.octets(), [0xff; 16]);
        assert_eq!(<Ipv4Addr as Address>::ALL_ONES, Ipv4Addr::BROADCAST);
        assert_eq!(HostPort(v4, 80).to_string(), "198.18.0.1:80");
        assert_eq!(v4.word_sum(), 0xc612 + 0x0001);
        assert_eq!(IpAddr::V4(v4).word_sum(), v4.word_sum());
        assert_eq!((v4.word_count(), v6.word_count()), (2, 8));
        assert_eq!(v6.word_sum(), 0x2001 + 0x0002 + 0x0001);
        assert_eq!(HostPort(v6, 80).to_string(), "[2001:2::1]:80");
    }
}
