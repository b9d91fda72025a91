//! Host and service names as ipvsadm resolves them: the C library's
//! resolver (`/etc/hosts`, DNS as `nsswitch.conf` says, `/etc/services`),
//! so `xvsadm` prints and reads the same names as `ipvsadm` on the same
//! host. Written against libc directly: getservbyport/getservbyname have
//! no Rust equivalent, and the host lookups must be the C library's own
//! to agree with ipvsadm's.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use super::ipvs_opts::{Proto, Resolve};

/// Addresses and ports to names, for listings without `-n`.
pub trait Names {
    /// The host name of `addr` (`gethostbyaddr`).
    fn host(&self, addr: IpAddr) -> Option<String>;
    /// The service name of `port` for `tcp` or `udp` (`getservbyport`).
    fn service(&self, port: u16, proto: &str) -> Option<String>;
}

/// `-n`: numbers only.
pub struct Numeric;

impl Names for Numeric {
    fn host(&self, _: IpAddr) -> Option<String> {
        None
    }
    fn service(&self, _: u16, _: &str) -> Option<String> {
        None
    }
}

/// The C library's resolver.
pub struct System;

impl Names for System {
    fn host(&self, addr: IpAddr) -> Option<String> {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match addr {
            IpAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: 0,
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(a).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: a sockaddr_in fits in a sockaddr_storage.
                unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            IpAddr::V6(a) => {
                // SAFETY: all-zero is a valid sockaddr_in6.
                let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_addr.s6_addr = a.octets();
                // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
                unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        let mut host = [0 as libc::c_char; 1025];
        // SAFETY: `ss` holds a valid sockaddr of the length given; `host`
        // is writable for its length; no service buffer is asked for.
        let rc = unsafe {
            libc::getnameinfo(
                (&ss as *const libc::sockaddr_storage).cast(),
                len as libc::socklen_t,
                host.as_mut_ptr(),
                host.len() as libc::socklen_t,
                std::ptr::null_mut(),
                0,
                libc::NI_NAMEREQD,
            )
        };
        if rc != 0 {
            return None;
        }
        // SAFETY: getnameinfo wrote a NUL-terminated string into `host`.
        let name = unsafe { CStr::from_ptr(host.as_ptr()) };
        Some(name.to_string_lossy().into_owned())
    }

    fn service(&self, port: u16, proto: &str) -> Option<String> {
        let proto = CString::new(proto).ok()?;
        // SAFETY: getservbyport reads the NUL-terminated protocol name and
        // returns NULL or a pointer to static storage, read at once (xvsadm
        // resolves on one thread).
        unsafe {
            let s = libc::getservbyport(libc::c_int::from(port.to_be()), proto.as_ptr());
            if s.is_null() || (*s).s_name.is_null() {
                return None;
            }
            Some(CStr::from_ptr((*s).s_name).to_string_lossy().into_owned())
        }
    }
}

impl Resolve for System {
    fn host(&self, name: &str) -> Option<Ipv4Addr> {
        (name, 0).to_socket_addrs().ok()?.find_map(|a| match a {
            SocketAddr::V4(v4) => Some(*v4.ip()),
            SocketAddr::V6(_) => None,
        })
    }

    fn service(&self, name: &str, proto: Proto) -> Option<u16> {
        let name = CString::new(name).ok()?;
        let proto = CString::new(proto.name()).ok()?;
        // SAFETY: both arguments are NUL-terminated; the result is NULL or
        // static storage, read at once on this thread.
        unsafe {
            let s = libc::getservbyname(name.as_ptr(), proto.as_ptr());
            if s.is_null() {
                return None;
            }
            Some(u16::from_be((*s).s_port as u16))
        }
    }
}

/// ipvsadm's `addrport_to_anyname`: `host:service` (`[host]:service`
/// for IPv6), each the number when it has no name (or with `names` =
/// [`Numeric`]), cut to 59 characters (its 60-byte buffer).
pub fn addrport(names: &dyn Names, addr: IpAddr, port: u16, proto: &str) -> String {
    let host = names.host(addr).unwrap_or_else(|| addr.to_string());
    let service = names
        .service(port, proto)
        .unwrap_or_else(|| port.to_string());
    let mut s = match addr {
        IpAddr::V4(_) => format!("{host}:{service}"),
        IpAddr::V6(_) => format!("[{host}]:{service}"),
    };
    if s.len() > 59 {
        let mut cut = 59;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_services_resolve_both_ways() {
        // /etc/services is part of netbase, present wherever ipvsadm is.
        if !std::path::Path::new("/etc/services").exists() {
            return;
        }
        assert_eq!(Names::service(&System, 80, "tcp").as_deref(), Some("http"));
        assert_eq!(
            Names::service(&System, 53, "udp").as_deref(),
            Some("domain")
        );
        assert_eq!(Resolve::service(&System, "http", Proto::Tcp), Some(80));
        assert_eq!(
            Resolve::service(&System, "no-such-service", Proto::Tcp),
            None
        );
        assert_eq!(
            Resolve::host(&System, "localhost"),
            Some(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn names_are_cut_like_ipvsadm() {
        struct Long;
        impl Names for Long {
            fn host(&self, _: IpAddr) -> Option<String> {
                Some("a".repeat(70))
            }
            fn service(&self, _: u16, _: &str) -> Option<String> {
                None
            }
        }
        assert_eq!(
            addrport(&Long, Ipv4Addr::LOCALHOST.into(), 80, "tcp").len(),
            59
        );
        assert_eq!(
            addrport(&Numeric, Ipv4Addr::new(198, 19, 0, 1).into(), 0, "udp"),
            "198.19.0.1:0"
        );
    }
}
