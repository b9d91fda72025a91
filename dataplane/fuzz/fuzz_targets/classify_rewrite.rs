//! Fuzzes the packet core: any frame is classified, and whatever it
//! classifies as is rewritten, translated and answered — never a panic. A
//! successful forward must leave a frame that still classifies. IPv6
//! frames (extension-header walk, neighbour discovery, ICMPv6 errors) go
//! through the IPv6 rewrites and answers.
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use xvs_dataplane::wire::answer::{arp_reply, icmp_echo_reply, icmp_port_unreachable, tcp_reset};
use xvs_dataplane::wire::{
    answer6, classify, icmp_error, nat, nat6, ndp, Endpoint, Frame, IcmpErrorNat, Nat, L4,
};

const MAC: smoltcp::wire::EthernetAddress = smoltcp::wire::EthernetAddress([2, 0, 0, 0, 0, 1]);

/// Random bytes almost never carry a valid IPv4 header checksum, which
/// would stop the fuzzer at the first check: also try each input with its
/// header checksum made valid.
fn with_valid_ip_checksum(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < 34 || data[12..14] != [0x08, 0x00] {
        return None;
    }
    let ihl = usize::from(data[14] & 0x0f) * 4;
    if ihl < 20 || data.len() < 14 + ihl {
        return None;
    }
    let mut f = data.to_vec();
    f[24..26].fill(0);
    let c = !smoltcp::wire::checksum::data(&f[14..14 + ihl]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    Some(f)
}

fuzz_target!(|data: &[u8]| {
    exercise(data);
    if let Some(fixed) = with_valid_ip_checksum(data) {
        exercise(&fixed);
    }
});

fn exercise(data: &[u8]) {
    let e = Endpoint {
        addr: Ipv4Addr::new(198, 18, 1, 1),
        port: 8080,
    };
    let n = Nat { src: e, dst: e };
    match classify(data) {
        Ok(Frame::Ipv4(ip)) => {
            let mut f = data.to_vec();
            if nat::forward(&mut f, &ip, &n, MAC, MAC).is_ok() {
                assert!(classify(&f).is_ok(), "a forwarded frame must still classify");
            }
            let m = IcmpErrorNat {
                outer_src: e.addr,
                outer_dst: e.addr,
                inner: n,
            };
            let _ = icmp_error::translate(&mut data.to_vec(), &ip, &m);
            let _ = icmp_echo_reply(&mut data.to_vec(), &ip);
            let _ = tcp_reset(&mut data.to_vec(), &ip);
            let mut big = data.to_vec();
            big.resize(2048, 0);
            let _ = icmp_port_unreachable(&mut big, &ip);
        }
        Ok(Frame::Ipv6(ip)) => {
            let e = Endpoint {
                addr: Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1),
                port: 8080,
            };
            let n = Nat { src: e, dst: e };
            let mut f = data.to_vec();
            if nat6::forward6(&mut f, &ip, &n, MAC, MAC).is_ok() {
                assert!(classify(&f).is_ok(), "a forwarded frame must still classify");
            }
            let m = IcmpErrorNat {
                outer_src: e.addr,
                outer_dst: e.addr,
                inner: n,
            };
            let _ = nat6::icmp_error_forward6(&mut data.to_vec(), &ip, &m, MAC, MAC);
            let _ = answer6::echo_reply6(&mut data.to_vec(), &ip);
            let _ = answer6::tcp_reset6(&mut data.to_vec(), &ip);
            let mut big = data.to_vec();
            big.resize(2048, 0);
            let _ = answer6::port_unreachable6(&mut big.clone(), &ip);
            let _ = answer6::time_exceeded6(&mut big, &ip);
            if let L4::Neighbour(ns) = ip.l4 {
                let _ = ndp::advertise(&mut data.to_vec(), &ns, ip.src, MAC, MAC);
            }
        }
        Ok(Frame::Arp(arp)) => {
            let _ = arp_reply(&mut data.to_vec(), &arp, MAC);
        }
        Err(_) => {}
    }
}
