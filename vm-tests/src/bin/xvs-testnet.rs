//! `xvs-testnet`: the programs end-to-end tests run inside namespaces.
//!
//! - `serve`: a TCP and UDP echo server that names itself: each TCP
//!   connection first receives `NAME\n`, then its bytes echoed; each UDP
//!   datagram comes back as `NAME:` followed by its bytes.
//! - `tcp`: a load client: N connections, C at a time, each sending a
//!   payload unique to it and checking the echo byte for byte; prints one
//!   summary line `ok=N failed=M by=NAME:COUNT,...` and exits 0 only if
//!   every connection succeeded.
//! - `udp`: the same for request/response datagrams.
//! - `http-from-port`: HTTP/1.1 requests, each on a new connection from
//!   the same client port, as a client pinned to one source port makes
//!   them (it waits for the server to close, so it never holds the port
//!   in TIME_WAIT); prints the body of each answer, or `ERR`.
//!
//! - `streams`: N long-lived connections at once, each sending numbered
//!   messages without pause and checking every echoed byte, for a fixed
//!   time; prints one `conn PORT NAME` line per connection once all are up,
//!   then `ok=N failed=M rounds=R max_stall_ms=S` (the longest wait for an
//!   echo: how long a gateway restart stopped the stream).
//!
//! - `decap`: a tunnel endpoint for a backend whose kernel has neither
//!   `ipip` nor `fou`: IPv4-in-IPv4 packets (a raw protocol-4 socket),
//!   IPv6-in-IPv6 packets (a raw IPv6 socket of next header 41) and GUE
//!   variant 1 datagrams over either family (a dual-stack UDP socket)
//!   lose their outer headers and the inner packets enter the stack
//!   through a TUN device, as if an `ipip`, `ip6tnl` or `fou` interface
//!   had decapsulated them; prints `ready` once the sockets and the
//!   device exist, then `decapsulated ipip=N gue=M ip6ip6=K` on SIGTERM
//!   or when its time is up (`ipip` counts IPv4-in-IPv4 only).
//!
//! Every operation has a timeout; loads are bounded in count and time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "xvs-testnet",
    version,
    about = "Echo servers and load clients for xvs's namespace tests"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve TCP (and optionally UDP) echo, naming this server.
    Serve {
        /// Name sent to clients.
        #[arg(long)]
        name: String,
        /// TCP listen address.
        #[arg(long)]
        tcp: SocketAddr,
        /// UDP listen address.
        #[arg(long)]
        udp: Option<SocketAddr>,
    },
    /// TCP load: connections with echo verification.
    Tcp {
        /// Address to connect to.
        #[arg(long)]
        connect: SocketAddr,
        /// Number of connections.
        #[arg(long, default_value_t = 100)]
        connections: u32,
        /// Connections in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: u32,
        /// Payload bytes per connection.
        #[arg(long, default_value_t = 1000)]
        payload: usize,
        /// Timeout of every operation, in milliseconds.
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
    /// One long-lived connection: prints `connected NAME` once the banner
    /// arrives, then echoes a small message every interval for the given
    /// time, checking each; prints `ok rounds=N` at the end.
    Hold {
        /// Address to connect to.
        #[arg(long)]
        connect: SocketAddr,
        /// How long to hold the connection, in seconds.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Time between messages, in milliseconds.
        #[arg(long, default_value_t = 50)]
        interval_ms: u64,
    },
    /// Long-lived connections, each exchanging numbered messages
    /// continuously and checking the byte stream.
    Streams {
        /// Address to connect to.
        #[arg(long)]
        connect: SocketAddr,
        /// Number of connections.
        #[arg(long, default_value_t = 50)]
        connections: u32,
        /// How long every connection exchanges data, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Time between messages, in milliseconds.
        #[arg(long, default_value_t = 20)]
        interval_ms: u64,
        /// Longest wait for one echo, in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
    },
    /// Sends UDP datagrams of `size` bytes to `to` as fast as it can for
    /// `seconds` (one socket, one source port: one flow); prints
    /// `sent=N pps=R`.
    Blast {
        /// Destination.
        #[arg(long)]
        to: SocketAddr,
        /// Duration in seconds.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Payload bytes.
        #[arg(long, default_value_t = 18)]
        size: usize,
    },
    /// Counts UDP datagrams received on `listen` for `seconds`; prints
    /// `received=N pps=R` (R over the time datagrams were arriving).
    Sink {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// How long to count, in seconds.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// HTTP requests (`Connection: close`), each on a new connection from
    /// the same local port.
    HttpFromPort {
        /// Server address.
        #[arg(long)]
        connect: SocketAddr,
        /// Local port every connection uses.
        #[arg(long)]
        local_port: u16,
        /// Number of requests.
        #[arg(long, default_value_t = 10)]
        count: u32,
        /// Timeout of every operation, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// Decapsulates IPIP and GUE to a TUN device until SIGTERM or for a
    /// bounded time, whichever comes first.
    Decap {
        /// Name of the TUN device to create.
        #[arg(long)]
        tun: String,
        /// UDP port GUE arrives on.
        #[arg(long, default_value_t = 6080)]
        gue_port: u16,
        /// The longest it runs, in seconds.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
    /// UDP request/response load.
    Udp {
        /// Address to send to.
        #[arg(long)]
        connect: SocketAddr,
        /// Number of requests.
        #[arg(long, default_value_t = 100)]
        requests: u32,
        /// Timeout of every request, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Serve { name, tcp, udp } => serve(&name, tcp, udp),
        Cmd::Tcp {
            connect,
            connections,
            concurrency,
            payload,
            timeout_ms,
        } => tcp_load(
            connect,
            connections,
            concurrency,
            payload,
            Duration::from_millis(timeout_ms),
        ),
        Cmd::Udp {
            connect,
            requests,
            timeout_ms,
        } => udp_load(connect, requests, Duration::from_millis(timeout_ms)),
        Cmd::Blast { to, seconds, size } => blast(to, seconds, size),
        Cmd::HttpFromPort {
            connect,
            local_port,
            count,
            timeout_ms,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            let mut failed = 0;
            for _ in 0..count {
                match http_from_port(connect, local_port, timeout) {
                    Ok(body) => println!("{body}"),
                    Err(e) => {
                        failed += 1;
                        println!("ERR {e}");
                    }
                }
            }
            if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Cmd::Sink { listen, seconds } => sink(listen, seconds),
        Cmd::Decap {
            tun,
            gue_port,
            seconds,
        } => match decap::run(&tun, gue_port, Duration::from_secs(seconds)) {
            Ok([ipip, gue, ip6ip6]) => {
                println!("decapsulated ipip={ipip} gue={gue} ip6ip6={ip6ip6}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("decap failed: {e}");
                ExitCode::from(1)
            }
        },
        Cmd::Streams {
            connect,
            connections,
            seconds,
            interval_ms,
            timeout_ms,
        } => streams(
            connect,
            connections,
            Duration::from_secs(seconds),
            Duration::from_millis(interval_ms),
            Duration::from_millis(timeout_ms),
        ),
        Cmd::Hold {
            connect,
            seconds,
            interval_ms,
        } => match hold(connect, seconds, Duration::from_millis(interval_ms)) {
            Ok(rounds) => {
                println!("ok rounds={rounds}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("failed: {e}");
                ExitCode::from(1)
            }
        },
    }
}

fn serve(name: &str, tcp: SocketAddr, udp: Option<SocketAddr>) -> ExitCode {
    let listener = match TcpListener::bind(tcp) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("xvs-testnet: bind {tcp}: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(addr) = udp {
        let sock = match UdpSocket::bind(addr) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("xvs-testnet: bind udp {addr}: {e}");
                return ExitCode::from(2);
            }
        };
        let prefix = format!("{name}:").into_bytes();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                let mut reply = prefix.clone();
                reply.extend_from_slice(&buf[..n]);
                let _ = sock.send_to(&reply, from);
            }
        });
    }
    println!("ready {name}");
    let _ = std::io::stdout().flush();
    let banner = format!("{name}\n").into_bytes();
    for conn in listener.incoming().flatten() {
        let banner = banner.clone();
        std::thread::spawn(move || {
            let mut conn = conn;
            let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
            if conn.write_all(&banner).is_err() {
                return;
            }
            let mut buf = [0u8; 16 * 1024];
            // Why a connection ended other than by the client's close goes
            // to stderr (the test's log): a read timeout says nothing
            // arrived for 30 s, a reset says who ended it first.
            let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            loop {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Err(e) => {
                        eprintln!("xvs-testnet serve: {peer}: read: {e}");
                        break;
                    }
                    Ok(n) => {
                        if let Err(e) = conn.write_all(&buf[..n]) {
                            eprintln!("xvs-testnet serve: {peer}: write: {e}");
                            break;
                        }
                    }
                }
            }
        });
    }
    ExitCode::SUCCESS
}

/// The length of the block a payload repeats: a prime, so that no
/// segment size divides it.
const PERIOD: usize = 65_521;

/// The payload of connection `id`: bytes no other connection sends. A
/// block of up to [`PERIOD`] bytes made byte by byte, then copies of it:
/// 512 MiB made byte by byte took a debug build 17 s of CPU per
/// connection.
fn payload_of(id: u32, len: usize) -> Vec<u8> {
    let seed = id.wrapping_mul(2_654_435_761);
    let mut v: Vec<u8> = (0..len.min(PERIOD))
        .map(|i| (seed.wrapping_add((i as u32).wrapping_mul(31)) >> 7) as u8)
        .collect();
    v.reserve(len - v.len());
    // Its length stays a multiple of the block until the last copy, so
    // every copy goes on where the one before it ended.
    while v.len() < len {
        let n = v.len().min(len - v.len());
        v.extend_from_within(..n);
    }
    v
}

/// One connection: banner, payload out, echo back and compared. The
/// payload is made (once, shared with the writer) before connecting:
/// made after the banner, a large one (512 MiB: tens of seconds in a
/// debug build on a loaded host) kept the connection idle past the
/// server's read timeout, which then closed it.
fn one_connection(
    to: SocketAddr,
    id: u32,
    len: usize,
    timeout: Duration,
) -> Result<String, String> {
    let want = Arc::new(payload_of(id, len));
    let conn = TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut name = String::new();
    reader
        .read_line(&mut name)
        .map_err(|e| format!("banner: {e}"))?;
    // Write from a thread while reading here: a payload larger than the
    // socket buffers would otherwise deadlock against its own echo.
    let mut w = conn.try_clone().map_err(|e| e.to_string())?;
    let out = Arc::clone(&want);
    let writer = std::thread::spawn(move || w.write_all(&out));
    let mut got = vec![0u8; len];
    let read = reader
        .read_exact(&mut got)
        .map_err(|e| format!("read echo: {e}"));
    let wrote = writer.join().map_err(|_| "writer panicked".to_owned())?;
    wrote.map_err(|e| format!("write: {e}"))?;
    read?;
    if got != *want {
        return Err("echo differs from what was sent".into());
    }
    Ok(name.trim().to_owned())
}

/// One `GET /` with `Connection: close` from `local_port`: the body's last
/// line. The port is bound with SO_REUSEADDR and the connection retried
/// for a while if the previous one is not gone yet (it waits for the
/// server's FIN, then closes: LAST_ACK lasts one round trip).
fn http_from_port(to: SocketAddr, local_port: u16, timeout: Duration) -> Result<String, String> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let local = SocketAddr::new(any_of(to), local_port);
    let mut attempts = 0;
    let mut stream = loop {
        let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| e.to_string())?;
        s.set_reuse_address(true).map_err(|e| e.to_string())?;
        let r = s
            .bind(&SockAddr::from(local))
            .and_then(|()| s.connect_timeout(&SockAddr::from(to), timeout));
        match r {
            Ok(()) => break TcpStream::from(s),
            Err(e)
                if attempts < 100
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                    ) =>
            {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    };
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: xvs\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    if !answer.starts_with("HTTP/1.1 200") {
        return Err(format!("answer: {answer:?}"));
    }
    Ok(answer
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned())
}

#[allow(clippy::disallowed_types)] // a load generator measures real time
fn blast(to: SocketAddr, seconds: u64, size: usize) -> ExitCode {
    let Ok(sock) = UdpSocket::bind(SocketAddr::new(any_of(to), 0)) else {
        eprintln!("xvs-testnet: cannot bind");
        return ExitCode::from(2);
    };
    let payload = vec![0x5au8; size];
    let start = std::time::Instant::now();
    let limit = Duration::from_secs(seconds);
    let mut sent = 0u64;
    while start.elapsed() < limit {
        for _ in 0..256 {
            if sock.send_to(&payload, to).is_ok() {
                sent += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("sent={sent} pps={:.0}", sent as f64 / secs);
    ExitCode::SUCCESS
}

#[allow(clippy::disallowed_types)] // a sink measures real time
fn sink(listen: SocketAddr, seconds: u64) -> ExitCode {
    let Ok(sock) = UdpSocket::bind(listen) else {
        eprintln!("xvs-testnet: cannot bind {listen}");
        return ExitCode::from(2);
    };
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    println!("ready sink");
    let _ = std::io::stdout().flush();
    let start = std::time::Instant::now();
    let mut first: Option<std::time::Instant> = None;
    let mut last = start;
    let mut received = 0u64;
    let mut buf = [0u8; 2048];
    while start.elapsed() < Duration::from_secs(seconds) {
        if sock.recv_from(&mut buf).is_ok() {
            received += 1;
            let now = std::time::Instant::now();
            first.get_or_insert(now);
            last = now;
        }
    }
    let active = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let pps = if active > 0.0 {
        received as f64 / active
    } else {
        0.0
    };
    println!("received={received} pps={pps:.0}");
    ExitCode::SUCCESS
}

fn hold(to: SocketAddr, seconds: u64, interval: Duration) -> Result<u64, String> {
    let timeout = Duration::from_secs(5);
    let conn = TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut name = String::new();
    reader
        .read_line(&mut name)
        .map_err(|e| format!("banner: {e}"))?;
    println!("connected {}", name.trim());
    let _ = std::io::stdout().flush();
    let rounds = seconds * 1000 / (interval.as_millis().max(1) as u64);
    let mut w = &conn;
    for r in 0..rounds {
        let msg = payload_of(r as u32, 64);
        w.write_all(&msg)
            .map_err(|e| format!("round {r}: write: {e}"))?;
        let mut got = [0u8; 64];
        reader
            .read_exact(&mut got)
            .map_err(|e| format!("round {r}: read: {e}"))?;
        if got[..] != msg[..] {
            return Err(format!("round {r}: echo differs"));
        }
        std::thread::sleep(interval);
    }
    Ok(rounds)
}

/// A stream's connect and banner taking longer than this is reported.
const SLOW_SETUP: Duration = Duration::from_secs(2);

/// One stream: connects, reports its local port and backend through
/// `up`, then exchanges messages until `until`; the rounds and the longest
/// wait for an echo.
#[allow(clippy::disallowed_types)] // a stream measures real time
fn stream(
    to: SocketAddr,
    until: std::time::Instant,
    interval: Duration,
    timeout: Duration,
    up: std::sync::mpsc::Sender<String>,
) -> Result<(u64, Duration), String> {
    let started = std::time::Instant::now();
    let conn = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    conn.set_nodelay(true).map_err(|e| e.to_string())?;
    let port = conn.local_addr().map_err(|e| e.to_string())?.port();
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut name = String::new();
    reader
        .read_line(&mut name)
        .map_err(|e| format!("{port}: banner: {e}"))?;
    // The streams are reported up only once all are: a slow one is
    // named at once (on stderr), so that a wait for them says which.
    let setup = started.elapsed();
    if setup > SLOW_SETUP {
        eprintln!("streams: {port} up after {} ms", setup.as_millis());
    }
    let _ = up.send(format!("conn {port} {}", name.trim()));
    let mut w = &conn;
    let (mut rounds, mut stall) = (0u64, Duration::ZERO);
    while std::time::Instant::now() < until {
        let msg = payload_of(rounds as u32, 64);
        let sent = std::time::Instant::now();
        w.write_all(&msg)
            .map_err(|e| format!("{port}: round {rounds}: write: {e}"))?;
        let mut got = [0u8; 64];
        reader
            .read_exact(&mut got)
            .map_err(|e| format!("{port}: round {rounds}: read: {e}"))?;
        if got[..] != msg[..] {
            return Err(format!("{port}: round {rounds}: echo differs"));
        }
        stall = stall.max(sent.elapsed());
        rounds += 1;
        std::thread::sleep(interval);
    }
    Ok((rounds, stall))
}

#[allow(clippy::disallowed_types)] // a stream measures real time
fn streams(
    to: SocketAddr,
    connections: u32,
    time: Duration,
    interval: Duration,
    timeout: Duration,
) -> ExitCode {
    let until = std::time::Instant::now() + time;
    let (up_tx, up_rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..connections)
        .map(|_| {
            let up = up_tx.clone();
            std::thread::spawn(move || {
                let r = stream(to, until, interval, timeout, up);
                if let Err(e) = &r {
                    eprintln!("streams: failed {e}");
                }
                r
            })
        })
        .collect();
    drop(up_tx);
    // Every connection's line once all are up (or failed to come up).
    let mut lines: Vec<String> = up_rx.iter().take(connections as usize).collect();
    lines.sort();
    for l in &lines {
        println!("{l}");
    }
    let _ = std::io::stdout().flush();
    let (mut ok, mut failed, mut rounds, mut stall) = (0u32, 0u32, 0u64, Duration::ZERO);
    for h in handles {
        match h.join() {
            Ok(Ok((r, s))) => {
                ok += 1;
                rounds += r;
                stall = stall.max(s);
            }
            Ok(Err(e)) => {
                failed += 1;
                println!("failed {e}");
            }
            Err(_) => failed += 1,
        }
    }
    println!(
        "ok={ok} failed={failed} rounds={rounds} max_stall_ms={}",
        stall.as_millis()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn report(ok: u32, failed: u32, by: &BTreeMap<String, u32>) -> ExitCode {
    let by: Vec<String> = by.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!("ok={ok} failed={failed} by={}", by.join(","));
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn tcp_load(
    to: SocketAddr,
    connections: u32,
    concurrency: u32,
    len: usize,
    timeout: Duration,
) -> ExitCode {
    let next = Arc::new(AtomicU32::new(0));
    let by = Arc::new(Mutex::new(BTreeMap::<String, u32>::new()));
    let failed = Arc::new(AtomicU32::new(0));
    let workers: Vec<_> = (0..concurrency.clamp(1, 512))
        .map(|_| {
            let (next, by, failed) = (next.clone(), by.clone(), failed.clone());
            std::thread::spawn(move || loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id >= connections {
                    break;
                }
                match one_connection(to, id, len, timeout) {
                    Ok(name) => {
                        *by.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(name)
                            .or_default() += 1
                    }
                    Err(e) => {
                        eprintln!("connection {id}: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        // A worker that panicked lost its connection: a failure.
        if w.join().is_err() {
            failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    let by = by.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let ok = by.values().sum();
    report(ok, failed.load(Ordering::Relaxed), &by)
}

/// The unspecified address of `to`'s family (what a client binds to).
fn any_of(to: SocketAddr) -> std::net::IpAddr {
    match to {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    }
}

fn udp_load(to: SocketAddr, requests: u32, timeout: Duration) -> ExitCode {
    let sock = match UdpSocket::bind(SocketAddr::new(any_of(to), 0)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xvs-testnet: udp bind: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = sock.set_read_timeout(Some(timeout));
    let mut by = BTreeMap::new();
    let mut failed = 0;
    let mut buf = [0u8; 2048];
    for id in 0..requests {
        let req = payload_of(id, 64);
        let result = sock
            .send_to(&req, to)
            .map_err(|e| e.to_string())
            .and_then(|_| {
                let (n, _) = sock.recv_from(&mut buf).map_err(|e| format!("recv: {e}"))?;
                let reply = &buf[..n];
                let colon = reply
                    .iter()
                    .position(|&b| b == b':')
                    .ok_or("reply without a name")?;
                if reply[colon + 1..] != req[..] {
                    return Err("reply differs from the request".into());
                }
                Ok(String::from_utf8_lossy(&reply[..colon]).into_owned())
            });
        match result {
            Ok(name) => *by.entry(name).or_default() += 1,
            Err(e) => {
                eprintln!("request {id}: {e}");
                failed += 1;
            }
        }
    }
    let ok = by.values().sum();
    report(ok, failed, &by)
}

/// The `decap` subcommand: a userspace stand-in for Linux's `ipip` and
/// `fou` receive paths (written by hand: a TUN device and two sockets is
/// all it needs, and the TUN crates bring async runtimes along).
#[allow(clippy::disallowed_types)] // a bounded run measures real time
mod decap {
    use std::fs::File;
    use std::io::Write;
    use std::net::UdpSocket;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Set by SIGTERM: the test has sent all its traffic.
    static STOP: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_term(_: libc::c_int) {
        STOP.store(true, Ordering::Relaxed);
    }

    /// Whether to go on: before `until` and no SIGTERM yet.
    fn running(until: Instant) -> bool {
        !STOP.load(Ordering::Relaxed) && Instant::now() < until
    }

    /// Opens the TUN device `name` (no packet information header: each
    /// write is one IP packet).
    fn open_tun(name: &str) -> std::io::Result<File> {
        if name.len() >= libc::IFNAMSIZ {
            return Err(std::io::Error::other("TUN name too long"));
        }
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")?;
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, b) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = b as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: `tun` is an open /dev/net/tun; TUNSETIFF reads and
        // writes only the ifreq it is given.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&tun),
                libc::TUNSETIFF as _,
                &mut ifr,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(tun)
    }

    /// A raw socket of `family` receiving every packet of protocol (next
    /// header) `proto`, reads bounded by `timeout`. An IPv4 one reads
    /// each packet with its outer header, an IPv6 one without (raw(7),
    /// raw(7) of IPv6).
    fn raw_socket(family: i32, proto: i32, timeout: Duration) -> std::io::Result<OwnedFd> {
        // SAFETY: socket has no memory preconditions; the result is
        // checked before it is owned.
        let fd = unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: SO_RCVTIMEO takes a timeval, given with its size.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(sock)
    }

    /// Passes the inner packets `raw` receives to `dev` until `until`,
    /// counting them in `count`: `inner` finds a packet's inner packet
    /// in what one read returned, if it has one.
    fn pass_on(
        raw: OwnedFd,
        dev: Arc<File>,
        count: Arc<AtomicU64>,
        until: Instant,
        inner: fn(&[u8]) -> Option<&[u8]>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while running(until) {
                // SAFETY: `raw` is an open socket; `buf` is writable for
                // its length.
                let n = unsafe {
                    libc::recv(
                        std::os::fd::AsRawFd::as_raw_fd(&raw),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                    )
                };
                let Ok(n) = usize::try_from(n) else { continue };
                if let Some(p) = inner(&buf[..n]) {
                    if (&*dev).write(p).is_ok() {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    }

    /// Decapsulates until SIGTERM (seen within a read timeout, `tick`)
    /// or for `run_for`; the packets passed on: IPv4-in-IPv4, GUE
    /// (either family), IPv6-in-IPv6.
    pub(crate) fn run(tun: &str, gue_port: u16, run_for: Duration) -> std::io::Result<[u64; 3]> {
        let tick = Duration::from_millis(200);
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        if unsafe { libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t) }
            == libc::SIG_ERR
        {
            return Err(std::io::Error::last_os_error());
        }
        let dev = Arc::new(open_tun(tun)?);
        let ipip = raw_socket(libc::AF_INET, libc::IPPROTO_IPIP, tick)?;
        let ip6ip6 = raw_socket(libc::AF_INET6, libc::IPPROTO_IPV6, tick)?;
        // Dual-stack (`bindv6only` is 0): GUE over IPv4 and IPv6 alike.
        let udp = UdpSocket::bind(("::", gue_port))?;
        udp.set_read_timeout(Some(tick))?;
        println!("ready");
        let until = Instant::now() + run_for;
        let counts: [Arc<AtomicU64>; 3] = Default::default();
        let threads = [
            pass_on(ipip, dev.clone(), counts[0].clone(), until, |p| {
                let ihl = usize::from(*p.first()? & 0x0f) * 4;
                p.get(ihl..)
                    .filter(|q| q.first().is_some_and(|b| b >> 4 == 4))
            }),
            pass_on(ip6ip6, dev.clone(), counts[2].clone(), until, |p| {
                p.first().is_some_and(|b| b >> 4 == 6).then_some(p)
            }),
        ];
        let mut buf = [0u8; 65536];
        while running(until) {
            let Ok(n) = udp.recv(&mut buf) else { continue };
            // GUE variant 1: the payload is the inner IP packet itself.
            if n > 0 && buf[0] >> 6 == 1 && (&*dev).write(&buf[..n]).is_ok() {
                counts[1].fetch_add(1, Ordering::Relaxed);
            }
        }
        for t in threads {
            let _ = t.join();
        }
        Ok(counts.map(|c| c.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::{payload_of, PERIOD};

    /// Past its first block the payload is copies of it, each going on
    /// where the one before ended; connections' payloads differ.
    #[test]
    fn a_payload_repeats_its_block_seamlessly() {
        let len = 3 * PERIOD + 1_000;
        let p = payload_of(7, len);
        assert_eq!(p.len(), len);
        assert_eq!(payload_of(7, 100), p[..100]);
        for i in PERIOD..len {
            assert_eq!(p[i], p[i - PERIOD], "byte {i}");
        }
        assert_ne!(payload_of(8, 4096), p[..4096]);
        assert!(payload_of(1, 0).is_empty());
    }
}
