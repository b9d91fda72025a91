//! The XDP steering program (`bpf/steer.bpf.c`, compiled by build.rs and
//! embedded): loading it, attaching it to an interface, and updating its
//! maps — the addresses xvs owns (alone, or shared with the host), the
//! SNAT port range, and the AF_XDP socket of each queue.
//!
//! Invariant: a [`Steering`] owns its attachment. Dropping it detaches the
//! program from the interface and frees the BPF object, on every exit path
//! that unwinds (normal return, error, panic), so no stale program is left
//! on an interface. Attaching refuses to replace a program someone else
//! attached.

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::ptr::NonNull;

use libxdp_sys as sys;
use xvs_config::XdpAttachMode;

/// The compiled steering program.
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
/// `owned` value: every packet to the address is xvs's.
const OWN_XVS: u8 = 1;
/// `owned` value: the host's address too; xvs gets only its SNAT ports.
const OWN_SHARED: u8 = 2;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Why the steering program could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    /// no interface named {0}
    #[error("no interface named {0}")]
    NoInterface(String),
    /// cannot {what}: {source}
    #[error("cannot {what}: {source}")]
    Bpf {
        /// What failed.
        what: String,
        /// The error libbpf returned.
        source: std::io::Error,
    },
}

fn bpf_err(what: impl Into<String>, ret: i32) -> SteerError {
    SteerError::Bpf {
        what: what.into(),
        source: std::io::Error::from_raw_os_error(ret.unsigned_abs() as i32),
    }
}

/// The steering program attached to one interface.
#[derive(Debug)]
pub struct Steering {
    obj: NonNull<sys::bpf_object>,
    ifindex: i32,
    ifname: String,
    flags: u32,
    owned_fd: i32,
    xsks_fd: i32,
    ports_fd: i32,
}

impl Steering {
    /// Loads the program and attaches it to `ifname` in `mode` (auto:
    /// native, else generic).
    pub fn attach(ifname: &str, mode: XdpAttachMode) -> Result<Steering, SteerError> {
        let cname = CString::new(ifname).map_err(|_| SteerError::NoInterface(ifname.to_owned()))?;
        // SAFETY: `cname` is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(SteerError::NoInterface(ifname.to_owned()));
        }
        // SAFETY: OBJECT is a valid ELF image for the whole call (it is
        // static); libbpf copies what it keeps; null options are allowed.
        let obj = unsafe {
            sys::bpf_object__open_mem(OBJECT.as_ptr().cast(), OBJECT.len() as _, std::ptr::null())
        };
        let obj =
            NonNull::new(obj).ok_or_else(|| bpf_err("open the steering program", -libc::EINVAL))?;
        let mut s = Steering {
            obj,
            ifindex: ifindex as i32,
            ifname: ifname.to_owned(),
            flags: 0,
            owned_fd: -1,
            xsks_fd: -1,
            ports_fd: -1,
        };
        // SAFETY: `obj` was returned by bpf_object__open_mem and is not
        // closed until `s` drops.
        let ret = unsafe { sys::bpf_object__load(s.obj.as_ptr()) };
        if ret != 0 {
            return Err(bpf_err(
                "load the steering program (is the process privileged?)",
                ret,
            ));
        }
        s.owned_fd = s.map_fd("owned")?;
        s.xsks_fd = s.map_fd("xsks")?;
        s.ports_fd = s.map_fd("snat_ports")?;
        let name =
            CString::new("xvs_steer").map_err(|_| bpf_err("name the program", -libc::EINVAL))?;
        // SAFETY: valid object and NUL-terminated name.
        let prog = unsafe { sys::bpf_object__find_program_by_name(s.obj.as_ptr(), name.as_ptr()) };
        if prog.is_null() {
            return Err(bpf_err("find program xvs_steer", -libc::ENOENT));
        }
        // SAFETY: `prog` belongs to the loaded object.
        let prog_fd = unsafe { sys::bpf_program__fd(prog) };
        let modes: &[u32] = match mode {
            XdpAttachMode::Native => &[XDP_FLAGS_DRV_MODE],
            XdpAttachMode::Generic => &[XDP_FLAGS_SKB_MODE],
            XdpAttachMode::Auto => &[XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE],
        };
        let mut last = 0;
        for &m in modes {
            let flags = m | XDP_FLAGS_UPDATE_IF_NOEXIST;
            // SAFETY: plain syscall wrapper; null options are allowed.
            last = unsafe { sys::bpf_xdp_attach(s.ifindex, prog_fd, flags, std::ptr::null()) };
            if last == 0 {
                s.flags = m;
                return Ok(s);
            }
        }
        Err(bpf_err(
            format!("attach the steering program to {ifname} ({mode} mode)"),
            last,
        ))
    }

    fn map_fd(&self, name: &str) -> Result<i32, SteerError> {
        let cname = CString::new(name).map_err(|_| bpf_err("name a map", -libc::EINVAL))?;
        // SAFETY: valid loaded object and NUL-terminated name.
        let fd = unsafe { sys::bpf_object__find_map_fd_by_name(self.obj.as_ptr(), cname.as_ptr()) };
        if fd < 0 {
            return Err(bpf_err(format!("find map {name}"), fd));
        }
        Ok(fd)
    }

    /// Whether the program runs in the driver (else generic mode).
    pub fn is_native(&self) -> bool {
        self.flags == XDP_FLAGS_DRV_MODE
    }

    /// Starts steering packets for `addr` (a VIP or SNAT address) to xvs.
    pub fn add_address(&self, addr: Ipv4Addr) -> Result<(), SteerError> {
        self.set_address(addr, OWN_XVS)
    }

    /// Starts steering to xvs the packets for `addr`, an address of the
    /// host too, that belong to the SNAT port range (see
    /// [`Steering::set_snat_ports`]); the kernel keeps the others.
    pub fn share_address(&self, addr: Ipv4Addr) -> Result<(), SteerError> {
        self.set_address(addr, OWN_SHARED)
    }

    /// The SNAT port range (for shared addresses).
    pub fn set_snat_ports(&self, ports: xvs_config::PortRange) -> Result<(), SteerError> {
        let value: [u16; 2] = [ports.first, ports.last];
        // SAFETY: the ports map's key is a u32 and its value two u16s.
        let ret = unsafe { map_update(self.ports_fd, &0u32, &value) };
        if ret != 0 {
            return Err(bpf_err("set the SNAT port range", ret));
        }
        Ok(())
    }

    fn set_address(&self, addr: Ipv4Addr, kind: u8) -> Result<(), SteerError> {
        let key = u32::from_ne_bytes(addr.octets());
        // SAFETY: the owned map's key is a u32 (the address) and its value
        // a u8 (the kind).
        let ret = unsafe { map_update(self.owned_fd, &key, &kind) };
        if ret != 0 {
            return Err(bpf_err(format!("add {addr} to the steering map"), ret));
        }
        Ok(())
    }

    /// Stops steering packets for `addr` (absent addresses are fine).
    pub fn remove_address(&self, addr: Ipv4Addr) -> Result<(), SteerError> {
        let key = u32::from_ne_bytes(addr.octets());
        // SAFETY: key points at an initialised u32, the map's key size.
        let ret = unsafe { sys::bpf_map_delete_elem(self.owned_fd, (&key as *const u32).cast()) };
        if ret != 0 && ret != -libc::ENOENT {
            return Err(bpf_err(format!("remove {addr} from the steering map"), ret));
        }
        Ok(())
    }

    /// Every address in the steering map, with whether it is shared with
    /// the host, read back from the kernel; sorted.
    pub fn addresses(&self) -> Result<Vec<(Ipv4Addr, bool)>, SteerError> {
        let mut out = Vec::new();
        let mut key = 0u32;
        let mut first = true;
        loop {
            let mut next = 0u32;
            let prev: *const libc::c_void = if first {
                std::ptr::null()
            } else {
                (&key as *const u32).cast()
            };
            // SAFETY: `prev` is null or points at a u32 key; `next` is a
            // writable u32, the map's key size.
            let ret = unsafe {
                sys::bpf_map_get_next_key(self.owned_fd, prev, (&mut next as *mut u32).cast())
            };
            if ret == -libc::ENOENT {
                break;
            }
            if ret != 0 {
                return Err(bpf_err("read the steering map", ret));
            }
            let mut value = 0u8;
            // SAFETY: `next` is a u32 key, `value` a writable u8, the
            // map's value size.
            let ret = unsafe {
                sys::bpf_map_lookup_elem(
                    self.owned_fd,
                    (&next as *const u32).cast(),
                    (&mut value as *mut u8).cast(),
                )
            };
            if ret == 0 {
                out.push((Ipv4Addr::from(next.to_ne_bytes()), value == OWN_SHARED));
            }
            key = next;
            first = false;
        }
        out.sort();
        Ok(out)
    }

    /// Sends the owned traffic of RX `queue` to the AF_XDP socket `xsk_fd`.
    pub fn register_socket(&self, queue: u32, xsk_fd: i32) -> Result<(), SteerError> {
        // SAFETY: the XSKMAP's key is a u32 (the queue) and its value a
        // 32-bit socket fd.
        let ret = unsafe { map_update(self.xsks_fd, &queue, &xsk_fd) };
        if ret != 0 {
            return Err(bpf_err(
                format!("register the socket of queue {queue}"),
                ret,
            ));
        }
        Ok(())
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        if self.flags != 0 {
            // SAFETY: plain syscall wrapper; detaches what we attached.
            let ret = unsafe { sys::bpf_xdp_detach(self.ifindex, self.flags, std::ptr::null()) };
            if ret != 0 {
                tracing::error!(
                    interface = %self.ifname,
                    "cannot detach the steering program: error {ret}"
                );
            }
        }
        // SAFETY: `obj` came from bpf_object__open_mem and is closed once.
        unsafe { sys::bpf_object__close(self.obj.as_ptr()) };
    }
}

/// Writes `key` → `value` into the BPF map `fd`; libbpf's return code.
///
/// # Safety
///
/// `K` and `V` have exactly the map's key and value sizes: the kernel
/// reads that many bytes from each pointer.
unsafe fn map_update<K: Copy, V: Copy>(fd: i32, key: &K, value: &V) -> i32 {
    // SAFETY: both pointers come from references to initialised values,
    // live for the call; their sizes are the map's (the caller's contract).
    unsafe { sys::bpf_map_update_elem(fd, (key as *const K).cast(), (value as *const V).cast(), 0) }
}
