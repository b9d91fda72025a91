//! The XDP steering program (`bpf/steer.bpf.c`, compiled by build.rs and
//! embedded): loading it, attaching it to an interface (taking over from
//! an earlier xvs), and updating its maps — the addresses xvs owns (alone,
//! or shared with the host), the SNAT port range, the AF_XDP socket of each
//! queue and each queue's liveness mark for the hold window.
//!
//! Invariants: a [`Steering`] owns its attachment. Dropping it detaches
//! the program (only if it is still the one attached) on every exit path
//! that unwinds, unless [`Steering::keep_attached`] said the hold window
//! takes over. Attaching never replaces a program xvs did not attach
//! (recognised by its name, `xvs_steer`): the error names the program and
//! the command that removes it. Replacing xvs's own program is atomic
//! (`XDP_FLAGS_REPLACE`) when the attach mode stays the same.

use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libxdp_sys as sys;
use xvs_config::XdpAttachMode;

/// The compiled steering program.
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

/// The program's name: how a program left by an earlier xvs is known.
pub const PROGRAM_NAME: &str = "xvs_steer";

const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_FLAGS_HW_MODE: u32 = 1 << 3;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;
/// `owned` value: every packet to the address is xvs's.
const OWN_XVS: u8 = 1;
/// `owned` value: the host's address too; xvs gets only its SNAT ports.
const OWN_SHARED: u8 = 2;
/// `settings` flag: every packet goes to xvs.
const SETTINGS_ALL: u32 = 1;
/// Entries of the `alive` map (one per queue), as the program declares.
const ALIVE_SLOTS: usize = 256;
/// Least time between two liveness marks, in nanoseconds. The steering
/// program reads the mark's cache line for every packet it steers (on
/// the CPU that receives them); written on every turn of a busy-polling
/// loop (millions a second), that line was in another core's cache at
/// nearly every read: a cross-core miss per packet on the receiving CPU.
/// One write a millisecond keeps the mark 1 ms fresh at worst against a
/// hold window of seconds. Reading the mark to decide leaves the line
/// shared, not taken from the reader.
const MARK_EVERY_NS: u64 = 1_000_000;

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
    /// Another program is attached to the interface.
    #[error(
        "{ifname} already has XDP program \"{name}\" (id {id}, {mode} mode), which is not xvs's; \
         xvs does not replace it. Remove it with `ip link set dev {ifname} {off} off` \
         (see `ip -d link show dev {ifname}`), then start xvs again"
    )]
    Foreign {
        /// The interface.
        ifname: String,
        /// The program's name.
        name: String,
        /// The program's id.
        id: u32,
        /// Where it runs: "native", "generic" or "offloaded".
        mode: &'static str,
        /// The `ip link` keyword that removes it.
        off: &'static str,
    },
}

fn bpf_err(what: impl Into<String>, ret: i32) -> SteerError {
    SteerError::Bpf {
        what: what.into(),
        source: std::io::Error::from_raw_os_error(ret.unsigned_abs() as i32),
    }
}

/// What attaching found on the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Takeover {
    /// The id of the xvs program replaced, if one was attached.
    pub previous: Option<u32>,
    /// Packets that program held (dropped in its hold window).
    pub held: u64,
}

/// How one attach ended.
enum Attempt {
    /// Attached, over what the look found.
    Done(Takeover),
    /// The interface changed since the look: look again (or, once the
    /// looks are spent, this error).
    Changed(SteerError),
}

/// The program attached to an interface: id, name, mode flag, and a
/// descriptor that keeps it loaded (so a replace or detach that names it
/// means this program, even if it was detached since the look).
#[derive(Debug)]
struct Attached {
    /// Program id.
    id: u32,
    /// Program name (truncated to 15 bytes by the kernel).
    name: String,
    mode: u32,
    fd: Fd,
}

impl Attached {
    /// Whether xvs attached it.
    fn is_xvs(&self) -> bool {
        self.name == PROGRAM_NAME
    }

    fn mode_name(&self) -> (&'static str, &'static str) {
        mode_name(self.mode)
    }
}

/// An attach mode flag's name, and the `ip link` keyword that detaches
/// a program attached in it.
fn mode_name(flags: u32) -> (&'static str, &'static str) {
    match flags {
        XDP_FLAGS_DRV_MODE => ("native", "xdpdrv"),
        XDP_FLAGS_SKB_MODE => ("generic", "xdpgeneric"),
        _ => ("offloaded", "xdpoffload"),
    }
}

fn ifindex_of(ifname: &str) -> Result<i32, SteerError> {
    let cname = CString::new(ifname).map_err(|_| SteerError::NoInterface(ifname.to_owned()))?;
    // SAFETY: `cname` is a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(SteerError::NoInterface(ifname.to_owned()));
    }
    Ok(ifindex as i32)
}

/// An owned file descriptor from libbpf (closed on drop).
#[derive(Debug)]
struct Fd(i32);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor was returned to us and is closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Looks at an interface again after it changed under a look or an
/// attach (another process attached or detached in between); bounded so
/// that an interface flapping without end is an error, not a hang.
const LOOKS: u32 = 4;

/// The program attached to interface `ifindex` (`ifname`) in any mode,
/// if any. A program detached (and freed) between the query and opening
/// it is looked for again.
fn attached_at(ifname: &str, ifindex: i32) -> Result<Option<Attached>, SteerError> {
    let mut looks = 0;
    loop {
        looks += 1;
        // SAFETY: bpf_xdp_query_opts is plain old data; zero is valid.
        let mut q: sys::bpf_xdp_query_opts = unsafe { std::mem::zeroed() };
        q.sz = std::mem::size_of::<sys::bpf_xdp_query_opts>();
        // SAFETY: `q` is a valid, sized options struct for the call.
        let ret = unsafe { sys::bpf_xdp_query(ifindex, 0, &mut q) };
        if ret != 0 {
            return Err(bpf_err(format!("ask which program {ifname} runs"), ret));
        }
        let (id, mode) = if q.drv_prog_id != 0 {
            (q.drv_prog_id, XDP_FLAGS_DRV_MODE)
        } else if q.skb_prog_id != 0 {
            (q.skb_prog_id, XDP_FLAGS_SKB_MODE)
        } else if q.hw_prog_id != 0 {
            (q.hw_prog_id, XDP_FLAGS_HW_MODE)
        } else {
            return Ok(None);
        };
        // SAFETY: plain syscall wrapper.
        let raw = unsafe { sys::bpf_prog_get_fd_by_id(id) };
        if raw == -libc::ENOENT && looks < LOOKS {
            continue;
        }
        if raw < 0 {
            return Err(bpf_err(format!("open program {id} on {ifname}"), raw));
        }
        let fd = Fd(raw);
        // SAFETY: bpf_prog_info is plain old data; zero is valid (and asks
        // for no arrays).
        let mut info: sys::bpf_prog_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<sys::bpf_prog_info>() as u32;
        // SAFETY: `info` is writable for `len` bytes.
        let ret = unsafe { sys::bpf_prog_get_info_by_fd(fd.0, &mut info, &mut len) };
        if ret != 0 {
            return Err(bpf_err(format!("read program {id} on {ifname}"), ret));
        }
        return Ok(Some(Attached {
            id,
            name: c_name(&info.name),
            mode,
            fd,
        }));
    }
}

/// A name the kernel fills in (NUL-terminated, at most 16 bytes).
fn c_name(raw: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Packets the program open at `fd` held, summed over CPUs (its `held`
/// map); 0 if it has none.
fn held_by(fd: &Fd) -> u64 {
    let mut ids = [0u32; 16];
    // SAFETY: plain old data; zero is valid.
    let mut info: sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    info.nr_map_ids = ids.len() as u32;
    info.map_ids = ids.as_mut_ptr() as u64;
    let mut len = std::mem::size_of::<sys::bpf_prog_info>() as u32;
    // SAFETY: `info` is writable for `len` bytes and `map_ids` points at
    // `nr_map_ids` writable u32s, live for the call.
    if unsafe { sys::bpf_prog_get_info_by_fd(fd.0, &mut info, &mut len) } != 0 {
        return 0;
    }
    let n = (info.nr_map_ids as usize).min(ids.len());
    for &map_id in &ids[..n] {
        // SAFETY: plain syscall wrapper.
        let raw = unsafe { sys::bpf_map_get_fd_by_id(map_id) };
        if raw < 0 {
            continue;
        }
        let map = Fd(raw);
        // SAFETY: plain old data; zero is valid.
        let mut mi: sys::bpf_map_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<sys::bpf_map_info>() as u32;
        // SAFETY: `mi` is writable for `len` bytes.
        if unsafe { sys::bpf_map_get_info_by_fd(map.0, &mut mi, &mut len) } != 0 {
            continue;
        }
        if c_name(&mi.name) != "held" || mi.value_size != 8 {
            continue;
        }
        // SAFETY: sysconf has no memory preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        let mut values = vec![0u64; cpus.max(1024)];
        let key = 0u32;
        // SAFETY: a per-CPU map's lookup writes one 8-byte value per
        // possible CPU; `values` holds more than the kernel's maximum the
        // machine can have configured here.
        let ret = unsafe {
            sys::bpf_map_lookup_elem(
                map.0,
                (&key as *const u32).cast(),
                values.as_mut_ptr().cast(),
            )
        };
        if ret == 0 {
            return values.iter().sum();
        }
    }
    0
}

/// Detaches `ifname`'s program if it is xvs's and still program `id`
/// (when given): how a stopped xvs's hold window ends. Returns the id
/// detached.
pub fn release(ifname: &str, id: Option<u32>) -> Result<Option<u32>, SteerError> {
    let ifindex = ifindex_of(ifname)?;
    let Some(a) = attached_at(ifname, ifindex)? else {
        return Ok(None);
    };
    if !a.is_xvs() || id.is_some_and(|id| id != a.id) {
        return Ok(None);
    }
    let opts = attach_opts(a.fd.0);
    // SAFETY: plain syscall wrapper with a valid options struct; REPLACE
    // makes the kernel detach only if `a`'s program is still attached.
    let ret = unsafe { sys::bpf_xdp_detach(ifindex, a.mode | XDP_FLAGS_REPLACE, &opts) };
    if ret != 0 && ret != -libc::EEXIST {
        return Err(bpf_err(
            format!("detach program {} from {ifname}", a.id),
            ret,
        ));
    }
    Ok((ret == 0).then_some(a.id))
}

/// Attach options naming the program expected on the interface. Their
/// size ends at the last field: libbpf refuses options whose bytes past it
/// are not zero, and the padding of a Rust value is not guaranteed to be.
fn attach_opts(old_prog_fd: i32) -> sys::bpf_xdp_attach_opts {
    sys::bpf_xdp_attach_opts {
        sz: std::mem::offset_of!(sys::bpf_xdp_attach_opts, old_prog_fd)
            + std::mem::size_of::<i32>(),
        old_prog_fd,
    }
}

/// The mapped `alive` map of one program: one cache line per queue.
struct AliveMap {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is shared memory the kernel keeps valid until
// munmap; every access is an atomic store/load of an aligned u64.
unsafe impl Send for AliveMap {}
// SAFETY: as above.
unsafe impl Sync for AliveMap {}

impl AliveMap {
    /// Maps the marks: the program's `alive` map (a BPF_F_MMAPABLE
    /// array of ALIVE_SLOTS 64-byte values), shared; with `None`,
    /// anonymous memory of the same shape.
    fn map(fd: Option<i32>) -> std::io::Result<AliveMap> {
        let len = ALIVE_SLOTS * 64;
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new mapping at an address the kernel picks, of `len`
        // bytes (the map's size); no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(AliveMap { base, len })
    }

    fn slot(&self, queue: u32) -> Option<&[AtomicU64; 2]> {
        let q = queue as usize;
        if q >= ALIVE_SLOTS {
            return None;
        }
        // SAFETY: the mapping holds ALIVE_SLOTS values of 64 bytes each,
        // page-aligned, so slot `q` (two leading u64s) is in bounds and
        // 8-byte aligned; AtomicU64 has u64's layout.
        Some(unsafe { &*self.base.as_ptr().add(q * 64).cast::<[AtomicU64; 2]>() })
    }
}

impl Drop for AliveMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `AliveMap::map`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A worker's liveness mark on every interface's program: refreshed on
/// each turn of its loop, read by the program to decide whether a packet
/// for a queue without a socket is held.
#[derive(Clone, Default)]
pub struct Liveness {
    maps: Vec<(Arc<AliveMap>, u32)>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("maps", &self.maps.len())
            .finish()
    }
}

impl Liveness {
    /// Adds `other`'s marks (the same queue on another interface).
    pub fn join(&mut self, other: Liveness) {
        self.maps.extend(other.maps);
    }

    /// Marks the queue alive at `now_ns` (CLOCK_MONOTONIC), unless the
    /// stored mark is less than a millisecond (`MARK_EVERY_NS`) old.
    #[inline]
    pub fn mark(&self, now_ns: u64) {
        for (map, q) in &self.maps {
            if let Some(slot) = map.slot(*q) {
                if now_ns.wrapping_sub(slot[0].load(Ordering::Relaxed)) >= MARK_EVERY_NS {
                    slot[0].store(now_ns, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Nanoseconds on CLOCK_MONOTONIC: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Seconds on CLOCK_MONOTONIC: the workers' clock (flow timeouts, sync
/// records' stamps).
pub fn monotonic_secs() -> u32 {
    (monotonic_ns() / 1_000_000_000) as u32
}

/// The steering program, loaded for one interface and (once
/// [`Steering::attach`] succeeded) attached to it.
pub struct Steering {
    obj: NonNull<sys::bpf_object>,
    ifindex: i32,
    ifname: String,
    /// The attach mode flag; 0 while not attached.
    flags: u32,
    /// Leave the program attached when dropped (the hold window).
    keep: bool,
    prog_fd: i32,
    owned_fd: i32,
    owned6_fd: i32,
    xsks_fd: i32,
    settings_fd: i32,
    alive: Arc<AliveMap>,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("ifname", &self.ifname)
            .field("flags", &self.flags)
            .finish()
    }
}

impl Steering {
    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The XDP mode the program is attached in (`native`, `generic`), or
    /// `detached`.
    pub fn mode(&self) -> &'static str {
        match self.flags {
            0 => "detached",
            f => mode_name(f).0,
        }
    }

    /// Loads the program for `ifname` and attaches it in `mode` (auto:
    /// native, else generic), taking over from an earlier xvs.
    pub fn attach(ifname: &str, mode: XdpAttachMode) -> Result<Steering, SteerError> {
        let mut s = Steering::load(ifname)?;
        s.attach_mode(mode)?;
        Ok(s)
    }

    /// Loads the program for `ifname` without attaching it, so its maps
    /// can be filled first.
    pub fn load(ifname: &str) -> Result<Steering, SteerError> {
        let ifindex = ifindex_of(ifname)?;
        // SAFETY: OBJECT is a valid ELF image for the whole call (it is
        // static); libbpf copies what it keeps; null options are allowed.
        let obj = unsafe {
            sys::bpf_object__open_mem(OBJECT.as_ptr().cast(), OBJECT.len() as _, std::ptr::null())
        };
        let obj =
            NonNull::new(obj).ok_or_else(|| bpf_err("open the steering program", -libc::EINVAL))?;
        let close = |obj: NonNull<sys::bpf_object>| {
            // SAFETY: `obj` came from bpf_object__open_mem; closed once,
            // on the error paths before a Steering owns it.
            unsafe { sys::bpf_object__close(obj.as_ptr()) }
        };
        // SAFETY: `obj` was returned by bpf_object__open_mem.
        let ret = unsafe { sys::bpf_object__load(obj.as_ptr()) };
        if ret != 0 {
            close(obj);
            return Err(bpf_err(
                "load the steering program (is the process privileged?)",
                ret,
            ));
        }
        let fds = (|| {
            let map = |name: &str| map_fd(obj, name);
            let name = CString::new(PROGRAM_NAME)
                .map_err(|_| bpf_err("name the program", -libc::EINVAL))?;
            // SAFETY: valid object and NUL-terminated name.
            let prog =
                unsafe { sys::bpf_object__find_program_by_name(obj.as_ptr(), name.as_ptr()) };
            if prog.is_null() {
                return Err(bpf_err("find program xvs_steer", -libc::ENOENT));
            }
            // SAFETY: `prog` belongs to the loaded object.
            let prog_fd = unsafe { sys::bpf_program__fd(prog) };
            let alive = AliveMap::map(Some(map("alive")?)).map_err(|source| SteerError::Bpf {
                what: "map the liveness marks".into(),
                source,
            })?;
            Ok((
                prog_fd,
                (map("owned")?, map("owned6")?),
                map("xsks")?,
                map("settings")?,
                alive,
            ))
        })();
        let (prog_fd, (owned_fd, owned6_fd), xsks_fd, settings_fd, alive) = match fds {
            Ok(f) => f,
            Err(e) => {
                close(obj);
                return Err(e);
            }
        };
        Ok(Steering {
            obj,
            ifindex,
            ifname: ifname.to_owned(),
            flags: 0,
            keep: false,
            prog_fd,
            owned_fd,
            owned6_fd,
            xsks_fd,
            settings_fd,
            alive: Arc::new(alive),
        })
    }

    /// Attaches the loaded program in `mode`. A program left by an
    /// earlier xvs is replaced (atomically when it runs in the same
    /// mode); any other program is an error that says how to remove it.
    /// If the interface changes between the look and the attach (the
    /// earlier xvs's hold window ends and its guard detaches, or another
    /// instance attaches), it is looked at again and the rules applied to
    /// what is there now.
    pub fn attach_mode(&mut self, mode: XdpAttachMode) -> Result<Takeover, SteerError> {
        self.attach_mode_with_gap(mode, || {})
    }

    /// [`Steering::attach_mode`], running `gap` after each look at the
    /// interface and before changing it: the window in which another
    /// process can change what is attached. Tests land a change there.
    #[doc(hidden)]
    pub fn attach_mode_with_gap(
        &mut self,
        mode: XdpAttachMode,
        mut gap: impl FnMut(),
    ) -> Result<Takeover, SteerError> {
        let modes: &[u32] = match mode {
            XdpAttachMode::Native => &[XDP_FLAGS_DRV_MODE],
            XdpAttachMode::Generic => &[XDP_FLAGS_SKB_MODE],
            XdpAttachMode::Auto => &[XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE],
        };
        let mut looks = 0;
        loop {
            looks += 1;
            let seen = attached_at(&self.ifname, self.ifindex)?;
            gap();
            match self.attach_over(seen, modes, mode)? {
                Attempt::Done(takeover) => return Ok(takeover),
                Attempt::Changed(e) if looks >= LOOKS => return Err(e),
                Attempt::Changed(_) => {}
            }
        }
    }

    /// One attach, given what a look found on the interface.
    fn attach_over(
        &mut self,
        seen: Option<Attached>,
        modes: &[u32],
        mode: XdpAttachMode,
    ) -> Result<Attempt, SteerError> {
        let mut takeover = Takeover::default();
        if let Some(old) = seen {
            if !old.is_xvs() {
                let (mode, off) = old.mode_name();
                return Err(SteerError::Foreign {
                    ifname: self.ifname.clone(),
                    name: old.name,
                    id: old.id,
                    mode,
                    off,
                });
            }
            takeover = Takeover {
                previous: Some(old.id),
                held: held_by(&old.fd),
            };
            let opts = attach_opts(old.fd.0);
            if modes.contains(&old.mode) {
                // SAFETY: plain syscall wrapper with valid options: the
                // kernel swaps the programs only if `old` is still there.
                let ret = unsafe {
                    sys::bpf_xdp_attach(
                        self.ifindex,
                        self.prog_fd,
                        old.mode | XDP_FLAGS_REPLACE,
                        &opts,
                    )
                };
                if ret != 0 {
                    let e = bpf_err(
                        format!("replace program {} on {}", old.id, self.ifname),
                        ret,
                    );
                    // EEXIST: `old` is no longer the program attached.
                    return if ret == -libc::EEXIST {
                        Ok(Attempt::Changed(e))
                    } else {
                        Err(e)
                    };
                }
                self.flags = old.mode;
                return Ok(Attempt::Done(takeover));
            }
            // Another mode than asked for: off, then on in the new mode.
            // SAFETY: as above; detaches only `old`.
            let ret =
                unsafe { sys::bpf_xdp_detach(self.ifindex, old.mode | XDP_FLAGS_REPLACE, &opts) };
            if ret != 0 && ret != -libc::EEXIST {
                return Err(bpf_err(
                    format!("detach program {} from {}", old.id, self.ifname),
                    ret,
                ));
            }
        }
        let mut last = 0;
        for &m in modes {
            let flags = m | XDP_FLAGS_UPDATE_IF_NOEXIST;
            // SAFETY: plain syscall wrapper; null options are allowed.
            last =
                unsafe { sys::bpf_xdp_attach(self.ifindex, self.prog_fd, flags, std::ptr::null()) };
            if last == 0 {
                self.flags = m;
                return Ok(Attempt::Done(takeover));
            }
            // EBUSY (a program in this mode) or EEXIST (one in the other
            // mode): something was attached since the look.
            if last == -libc::EBUSY || last == -libc::EEXIST {
                return Ok(Attempt::Changed(self.attach_error(mode, last)));
            }
        }
        Err(self.attach_error(mode, last))
    }

    /// The error of an attach (if-none) in `mode` that failed with `ret`.
    fn attach_error(&self, mode: XdpAttachMode, ret: i32) -> SteerError {
        bpf_err(
            format!(
                "attach the steering program to {} ({mode} mode)",
                self.ifname
            ),
            ret,
        )
    }

    /// Leaves the program attached when this handle drops: the hold
    /// window, then whoever releases it ([`release`]), take over.
    pub fn keep_attached(&mut self) {
        self.keep = true;
    }

    /// The id of the loaded program.
    pub fn program_id(&self) -> Option<u32> {
        // SAFETY: plain old data; zero is valid.
        let mut info: sys::bpf_prog_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<sys::bpf_prog_info>() as u32;
        // SAFETY: `info` is writable for `len` bytes.
        let ret = unsafe { sys::bpf_prog_get_info_by_fd(self.prog_fd, &mut info, &mut len) };
        (ret == 0).then_some(info.id)
    }

    /// Sets queue `queue`'s hold window to `hold_ns` and marks it alive
    /// now: until a worker serves it, packets for it are held.
    pub fn hold(&self, queue: u32, hold_ns: u64) -> Result<(), SteerError> {
        let slot = self
            .alive
            .slot(queue)
            .ok_or_else(|| bpf_err(format!("hold queue {queue}"), -libc::EINVAL))?;
        slot[1].store(hold_ns, Ordering::Relaxed);
        slot[0].store(monotonic_ns(), Ordering::Relaxed);
        Ok(())
    }

    /// The liveness mark of `queue`, for its worker.
    pub fn liveness(&self, queue: u32) -> Liveness {
        Liveness {
            maps: vec![(self.alive.clone(), queue)],
        }
    }

    /// Hands every packet to xvs (`steering = "all"`), not only what it
    /// owns.
    pub fn steer_all(&self, ports: xvs_config::PortRange) -> Result<(), SteerError> {
        self.write_settings(ports, SETTINGS_ALL)
    }

    /// Whether the program runs in the driver (else generic mode).
    pub fn is_native(&self) -> bool {
        self.flags == XDP_FLAGS_DRV_MODE
    }

    /// Starts steering packets for `addr` (a VIP or SNAT address, of
    /// either family) to xvs.
    pub fn add_address(&self, addr: impl Into<IpAddr>) -> Result<(), SteerError> {
        self.set_address(addr.into(), OWN_XVS)
    }

    /// Starts steering to xvs the packets for `addr`, an address of the
    /// host too, that belong to the SNAT port range (see
    /// [`Steering::set_snat_ports`]); the kernel keeps the others.
    pub fn share_address(&self, addr: Ipv4Addr) -> Result<(), SteerError> {
        self.set_address(addr.into(), OWN_SHARED)
    }

    /// The SNAT port range (for shared addresses).
    pub fn set_snat_ports(&self, ports: xvs_config::PortRange) -> Result<(), SteerError> {
        self.write_settings(ports, 0)
    }

    fn write_settings(&self, ports: xvs_config::PortRange, flags: u32) -> Result<(), SteerError> {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Settings {
            first: u16,
            last: u16,
            flags: u32,
        }
        let value = Settings {
            first: ports.first,
            last: ports.last,
            flags,
        };
        // SAFETY: the settings map's key is a u32 and its value the
        // 8-byte `struct settings` Settings mirrors.
        let ret = unsafe { map_update(self.settings_fd, &0u32, &value) };
        if ret != 0 {
            return Err(bpf_err("write the steering settings", ret));
        }
        Ok(())
    }

    /// The owned map of `addr`'s family and `addr`'s key in it: the
    /// address in network order (4 bytes in `owned`, 16 in `owned6`).
    fn owned_key(&self, addr: IpAddr) -> (i32, impl AsRef<[u8]>) {
        let fd = match addr {
            IpAddr::V4(_) => self.owned_fd,
            IpAddr::V6(_) => self.owned6_fd,
        };
        (fd, xvs_config::Address::octets(&addr))
    }

    fn set_address(&self, addr: IpAddr, kind: u8) -> Result<(), SteerError> {
        let (fd, key) = self.owned_key(addr);
        // SAFETY: `key` holds the map's key size (see owned_key) and
        // `kind` its value size, a u8; both live for the call.
        let ret = unsafe {
            sys::bpf_map_update_elem(
                fd,
                key.as_ref().as_ptr().cast(),
                (&kind as *const u8).cast(),
                0,
            )
        };
        if ret != 0 {
            return Err(bpf_err(format!("add {addr} to the steering map"), ret));
        }
        Ok(())
    }

    /// Stops steering packets for `addr` (absent addresses are fine).
    pub fn remove_address(&self, addr: impl Into<IpAddr>) -> Result<(), SteerError> {
        let addr = addr.into();
        let (fd, key) = self.owned_key(addr);
        // SAFETY: `key` holds the map's key size (see owned_key).
        let ret = unsafe { sys::bpf_map_delete_elem(fd, key.as_ref().as_ptr().cast()) };
        if ret != 0 && ret != -libc::ENOENT {
            return Err(bpf_err(format!("remove {addr} from the steering map"), ret));
        }
        Ok(())
    }

    /// Every address in the steering maps, with whether it is shared with
    /// the host, read back from the kernel; sorted.
    pub fn addresses(&self) -> Result<Vec<(IpAddr, bool)>, SteerError> {
        let mut out: Vec<(IpAddr, bool)> = read_owned::<4>(self.owned_fd)?
            .into_iter()
            .map(|(k, v)| (IpAddr::V4(Ipv4Addr::from(k)), v == OWN_SHARED))
            .collect();
        out.extend(
            read_owned::<16>(self.owned6_fd)?
                .into_iter()
                .map(|(k, v)| (IpAddr::V6(Ipv6Addr::from(k)), v == OWN_SHARED)),
        );
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
        if self.flags != 0 && !self.keep {
            let opts = attach_opts(self.prog_fd);
            // SAFETY: plain syscall wrapper; REPLACE detaches only our
            // program (a successor's stays).
            let ret =
                unsafe { sys::bpf_xdp_detach(self.ifindex, self.flags | XDP_FLAGS_REPLACE, &opts) };
            if ret != 0 && ret != -libc::EEXIST {
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

/// Every (key, value) of an owned-address map whose keys are `N` bytes
/// (the address in network order) and values a u8.
fn read_owned<const N: usize>(fd: i32) -> Result<Vec<([u8; N], u8)>, SteerError> {
    let mut out = Vec::new();
    let mut key = [0u8; N];
    let mut first = true;
    loop {
        let mut next = [0u8; N];
        let prev: *const libc::c_void = if first {
            std::ptr::null()
        } else {
            key.as_ptr().cast()
        };
        // SAFETY: `prev` is null or points at an N-byte key; `next` is a
        // writable N-byte buffer, the map's key size.
        let ret = unsafe { sys::bpf_map_get_next_key(fd, prev, next.as_mut_ptr().cast()) };
        if ret == -libc::ENOENT {
            break;
        }
        if ret != 0 {
            return Err(bpf_err("read the steering map", ret));
        }
        let mut value = 0u8;
        // SAFETY: `next` is an N-byte key, `value` a writable u8, the
        // map's value size.
        let ret = unsafe {
            sys::bpf_map_lookup_elem(fd, next.as_ptr().cast(), (&mut value as *mut u8).cast())
        };
        if ret == 0 {
            out.push((next, value));
        }
        key = next;
        first = false;
    }
    Ok(out)
}

fn map_fd(obj: NonNull<sys::bpf_object>, name: &str) -> Result<i32, SteerError> {
    let cname = CString::new(name).map_err(|_| bpf_err("name a map", -libc::EINVAL))?;
    // SAFETY: valid loaded object and NUL-terminated name.
    let fd = unsafe { sys::bpf_object__find_map_fd_by_name(obj.as_ptr(), cname.as_ptr()) };
    if fd < 0 {
        return Err(bpf_err(format!("find map {name}"), fd));
    }
    Ok(fd)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_written_at_most_once_a_millisecond() {
        let map = Arc::new(AliveMap::map(None).unwrap());
        let live = Liveness {
            maps: vec![(map.clone(), 3)],
        };
        let read = || map.slot(3).unwrap()[0].load(Ordering::Relaxed);
        let t = 5_000_000_000;
        live.mark(t);
        assert_eq!(read(), t);
        live.mark(t + MARK_EVERY_NS / 2);
        assert_eq!(read(), t, "a mark half a period newer is not written");
        live.mark(t + MARK_EVERY_NS);
        assert_eq!(read(), t + MARK_EVERY_NS);
        assert_eq!(
            map.slot(2).unwrap()[0].load(Ordering::Relaxed),
            0,
            "other queues untouched"
        );
        assert!(map.slot(ALIVE_SLOTS as u32).is_none());
    }
}
