//! Network namespaces and the commands run in them (`ip`, `ethtool`,
//! `sysctl`, test programs), with errors that say which command failed and
//! what it printed.
//!
//! Invariant: every namespace this module creates is named with the
//! [`PREFIX`] of the test suite, so a leak check can find any left behind;
//! a [`Netns`] deletes its namespace when dropped (also while a test
//! unwinds from a panic), which removes every link inside it.

use std::fmt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace the test suites create.
pub const PREFIX: &str = "xvst";

/// A command that failed.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// `{cmd}` could not start: {source}
    #[error("`{cmd}` could not start: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        source: std::io::Error,
    },
    /// `{cmd}` failed ({status}): {stderr}
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// could not read {what}
    #[error("could not read {what}")]
    Parse {
        /// What was read.
        what: String,
    },
}

/// Runs a program with arguments; its output if it exited 0.
pub fn run(program: &str, args: &[&str]) -> Result<Output, CmdError> {
    let cmd = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| CmdError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(CmdError::Failed {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// A unique, short tag for one test's objects (namespace names and the
/// like): the process id and a counter.
pub fn unique_tag() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{n:x}", std::process::id() & 0xffff)
}

/// A network namespace, deleted on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `PREFIX-<tag>-<role>` with its loopback up.
    pub fn create(tag: &str, role: &str) -> Result<Netns, CmdError> {
        let name = format!("{PREFIX}-{tag}-{role}");
        run("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        // No duplicate address detection on the links to come (every
        // address here is unique by construction): during it a fresh
        // link's link-local address is tentative for about a second and
        // the kernel sends no neighbour solicitation without one, so a
        // host that answers from an address of another interface (an
        // LVS-DR real server answering from the VIP on `lo`) cannot
        // reach its first clients: their handshakes stall for seconds.
        for conf in ["all", "default"] {
            ns.sysctl(&format!("net.ipv6.conf.{conf}.accept_dad"), "0")?;
        }
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A handle on a namespace that exists, for entering it from another
    /// thread. It is not deleted on drop.
    pub fn existing(name: &str) -> ExistingNetns {
        ExistingNetns {
            inner: std::mem::ManuallyDrop::new(Netns {
                name: name.to_owned(),
            }),
        }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `program args` inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<Output, CmdError> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Runs `ip args` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<Output, CmdError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// The MAC address of `ifname` inside the namespace.
    pub fn mac(&self, ifname: &str) -> Result<[u8; 6], CmdError> {
        let out = self.ip(&["link", "show", ifname])?.stdout;
        let text = String::from_utf8_lossy(&out);
        let bytes: Vec<u8> = text
            .split("link/ether ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_default()
            .split(':')
            .filter_map(|h| u8::from_str_radix(h, 16).ok())
            .collect();
        bytes.try_into().map_err(|_| CmdError::Parse {
            what: format!("the MAC address of {ifname} in `{}`", text.trim()),
        })
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), CmdError> {
        self.exec("sysctl", &["-qw", &format!("{key}={value}")])
            .map(|_| ())
    }

    /// A counter of the namespace's kernel from `/proc/net/snmp` or
    /// `/proc/net/netstat` (`group` as the file names it, e.g. `Tcp`,
    /// `Ip`, `TcpExt`; `field`, e.g. `PassiveOpens`, `InReceives`).
    pub fn snmp(&self, group: &str, field: &str) -> Result<u64, CmdError> {
        let out = self.exec("cat", &["/proc/net/snmp", "/proc/net/netstat"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let prefix = format!("{group}:");
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
        rows.chunks(2)
            .find_map(|pair| {
                let names = pair.first()?.split_whitespace();
                let values = pair.get(1)?.split_whitespace();
                names
                    .zip(values)
                    .find(|(n, _)| *n == field)
                    .and_then(|(_, v)| v.parse().ok())
            })
            .ok_or_else(|| CmdError::Parse {
                what: format!("{group}:{field} in /proc/net/snmp of {}", self.name),
            })
    }

    /// The TCP segments this namespace has sent, retransmissions included
    /// (the kernel counts a retransmitted segment in `RetransSegs`, not in
    /// `OutSegs`), read once the count has stopped moving: a client that
    /// closes first acknowledges the server's FIN after its program has
    /// returned. Reads every 200 ms until two agree, at most 5 s.
    pub fn tcp_segments_sent_settled(&self) -> Result<u64, CmdError> {
        let sent = || -> Result<u64, CmdError> {
            Ok(self.snmp("Tcp", "OutSegs")? + self.snmp("Tcp", "RetransSegs")?)
        };
        let mut last = sent()?;
        for _ in 0..25 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now = sent()?;
            if now == last {
                break;
            }
            last = now;
        }
        Ok(last)
    }

    /// A counter of the namespace's IPv6 stack from `/proc/net/snmp6`
    /// (e.g. `Icmp6OutPktTooBigs`).
    pub fn snmp6(&self, field: &str) -> Result<u64, CmdError> {
        let out = self.exec("cat", &["/proc/net/snmp6"])?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == field).then(|| w.next()?.parse().ok())?
            })
            .ok_or_else(|| CmdError::Parse {
                what: format!("{field} in /proc/net/snmp6 of {}", self.name),
            })
    }

    /// A link's packet counters: `(rx packets, rx dropped, tx packets, tx
    /// dropped)`, as `ip -s link` shows them.
    pub fn link_stats(&self, ifname: &str) -> Result<(u64, u64, u64, u64), CmdError> {
        let out = self.ip(&["-j", "-s", "link", "show", "dev", ifname])?;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|_| CmdError::Parse {
                what: format!("ip -j -s link show {ifname}"),
            })?;
        let s = &v[0]["stats64"];
        let n = |dir: &str, k: &str| s[dir][k].as_u64();
        match (
            n("rx", "packets"),
            n("rx", "dropped"),
            n("tx", "packets"),
            n("tx", "dropped"),
        ) {
            (Some(a), Some(b), Some(c), Some(d)) => Ok((a, b, c, d)),
            _ => Err(CmdError::Parse {
                what: format!("the counters of {ifname}"),
            }),
        }
    }

    /// Moves the calling thread into the namespace, for work that must
    /// happen inside it (attaching XDP programs, binding AF_XDP sockets).
    /// Use a thread of its own: it stays there.
    pub fn enter_current_thread(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(format!("/run/netns/{}", self.name))?;
        // SAFETY: `f` is an open namespace file for the duration of the
        // call; setns changes only the calling thread's network namespace.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// A `Command` that runs `program` inside the namespace (for
    /// long-running processes; see [`crate::procs`]).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes every link inside it.
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

impl fmt::Debug for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Netns({})", self.name)
    }
}

/// A namespace this handle does not own (never deleted by it).
#[derive(Debug)]
pub struct ExistingNetns {
    inner: std::mem::ManuallyDrop<Netns>,
}

impl std::ops::Deref for ExistingNetns {
    type Target = Netns;

    fn deref(&self) -> &Netns {
        &self.inner
    }
}

/// Namespaces named with [`PREFIX`] that exist now (for leak checks).
pub fn leftover_namespaces() -> Vec<String> {
    let out = run("ip", &["netns", "list"])
        .map(|o| o.stdout)
        .unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{PREFIX}-")))
        .map(str::to_owned)
        .collect()
}
