//! `xvsadm` as an ipvsadm user runs it: command line → stdout, stderr and
//! exit status, against a running `xvs`, compared byte for byte with what
//! ipvsadm 1.31 prints for the same table (its `print_*` formats, its
//! `fail()` messages and `ipvs_strerror` texts, its exit statuses: 2 for
//! a refused option, 255 from the table, 1 for `-L` of a missing
//! service). Names without `-n` come from a hosts file in the test's
//! namespace (`/etc/netns/NS/hosts`, which `ip netns exec` puts in place
//! of `/etc/hosts`) and `/etc/services`.
//!
//! Also: `-S` → `-C` → `-R` gives back the same rules byte for byte, a
//! file written by ipvsadm with names is read back, a refused `-R`
//! changes nothing; `-Z` zeroes what `--stats` and `--rate` show while
//! Prometheus keeps counting; `conntrack -L/-C/-S/-E` with real flows.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // waits for the daemon in real time

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use xvs_vm_tests::daemon::{dir_of, Daemon};
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{backend_addr, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

/// `/etc/netns/NS/{hosts,resolv.conf}`, removed when dropped. DNS goes
/// to the namespace's own loopback, where nothing answers: a name not in
/// the hosts file stays a number, and no query leaves the namespace.
struct NsEtc(PathBuf);

impl NsEtc {
    fn new(ns: &str, hosts: &str) -> NsEtc {
        let d = Path::new("/etc/netns").join(ns);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("hosts"), hosts).unwrap();
        std::fs::write(
            d.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )
        .unwrap();
        NsEtc(d)
    }
}

impl Drop for NsEtc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        // /etc/netns itself goes too when this test made it.
        let _ = std::fs::remove_dir("/etc/netns");
    }
}

const HOSTS: &str = "127.0.0.1 localhost
198.19.0.1 web.example.net
198.19.0.2 dns.a-long-zone-name.example.net
198.18.1.10 real1.example.net
198.18.1.11 a-rather-long-real-server-name.example.net
";

/// Runs `xvsadm` as `xvsadm` (found on PATH, so messages name it so)
/// in namespace `ns`, with `stdin`.
fn xvsadm(ns: &str, socket: &Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    let path = format!(
        "{}:{}",
        bins().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "xvsadm"])
        .args(args)
        .arg("--socket")
        .arg(socket)
        .env("PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// One golden case: a command line, its input, and exactly what ipvsadm
/// prints for it.
struct Golden {
    args: &'static str,
    stdin: &'static str,
    out: &'static str,
    err: &'static str,
    status: i32,
}

const fn g(args: &'static str, out: &'static str, err: &'static str, status: i32) -> Golden {
    Golden {
        args,
        stdin: "",
        out,
        err,
        status,
    }
}

const fn r(
    args: &'static str,
    stdin: &'static str,
    out: &'static str,
    err: &'static str,
    status: i32,
) -> Golden {
    Golden {
        args,
        stdin,
        out,
        err,
        status,
    }
}

const LIST_N: &str = "\
IP Virtual Server version 1.2.1 (size=65536)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  198.19.0.1:80 rr
  -> 198.18.1.10:8080             Masq    3      0          0         
TCP  198.19.0.1:443 mh (mh-fallback,mh-port)
  -> 198.18.1.10:8443             Masq    2      0          0         
TCP  198.19.0.4:0 wlc persistent 600 mask 255.255.255.0
  -> 198.18.1.12:0                Masq    1      0          0         
UDP  198.19.0.2:53 sh (sh-port) persistent 360
  -> 198.18.1.11:53               Masq    0      0          0         
";

const LIST_NAMES: &str = "\
IP Virtual Server version 1.2.1 (size=65536)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  web.example.net:http rr
  -> real1.example.net:http-alt   Masq    3      0          0         
TCP  web.example.net:https mh (mh-fallback,mh-port)
  -> real1.example.net:8443       Masq    2      0          0         
TCP  198.19.0.4:0 wlc persistent 600 mask 255.255.255.0
  -> 198.18.1.12:0                Masq    1      0          0         
UDP  dns.a-long-zone-name.example sh (sh-port) persistent 360
  -> a-rather-long-real-server-na Masq    0      0          0         
";

const SAVE_N: &str = "\
-A -t 198.19.0.1:80 -s rr
-a -t 198.19.0.1:80 -r 198.18.1.10:8080 -m -w 3
-A -t 198.19.0.1:443 -s mh -b mh-fallback,mh-port
-a -t 198.19.0.1:443 -r 198.18.1.10:8443 -m -w 2
-A -t 198.19.0.4:0 -s wlc -p 600 -M 255.255.255.0
-a -t 198.19.0.4:0 -r 198.18.1.12:0 -m -w 1
-A -u 198.19.0.2:53 -s sh -p 360 -b sh-port
-a -u 198.19.0.2:53 -r 198.18.1.11:53 -m -w 0
";

const SAVE_NAMES: &str = "\
-A -t web.example.net:http -s rr
-a -t web.example.net:http -r real1.example.net:http-alt -m -w 3
-A -t web.example.net:https -s mh -b mh-fallback,mh-port
-a -t web.example.net:https -r real1.example.net:8443 -m -w 2
-A -t 198.19.0.4:0 -s wlc -p 600 -M 255.255.255.0
-a -t 198.19.0.4:0 -r 198.18.1.12:0 -m -w 1
-A -u dns.a-long-zone-name.example.net:domain -s sh -p 360 -b sh-port
-a -u dns.a-long-zone-name.example.net:domain -r a-rather-long-real-server-name.example.net:domain -m -w 0
";

const ONE_SERVICE: &str = "\
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  198.19.0.1:443 mh (mh-fallback,mh-port)
  -> 198.18.1.10:8443             Masq    2      0          0         
";

const THRESHOLDS: &str = "\
Prot LocalAddress:Port            Uthreshold Lthreshold ActiveConn InActConn 
  -> RemoteAddress:Port
TCP  198.19.0.1:80 rr
  -> 198.18.1.10:8080             0          0          0          0         
";

const TUN_INFO: &str = "\
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn
TCP  198.19.0.1:80 rr
  -> 198.18.1.10:8080             Masq    n/a           3      0          0         
";

const STATS_ONE: &str = "\
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes
  -> RemoteAddress:Port
TCP  198.19.0.1:80                       0        0        0        0        0
  -> 198.18.1.10:8080                    0        0        0        0        0
";

const CT_SHOWN_0: &str = concat!(
    "xvsadm conntrack v",
    env!("CARGO_PKG_VERSION"),
    " (xvs): 0 flow entries have been shown.\n"
);

const CT_DELETED_0: &str = concat!(
    "xvsadm conntrack v",
    env!("CARGO_PKG_VERSION"),
    " (xvs): 0 flow entries have been deleted.\n"
);

/// `packaging/ipvsadm-rules/ipvsadm.rules`.
const EXAMPLE_RULES: &str = include_str!("../../packaging/ipvsadm-rules/ipvsadm.rules");

const TRY: &str = "Try `xvsadm -h' or 'xvsadm --help' for more information.\n";

/// The cases, in order: the table they build is [`LIST_N`].
fn cases() -> Vec<Golden> {
    vec![
        // ipvsadm's option checks, before anything runs.
        g("--bogus", "", TRY, 255),
        g("-t 198.19.0.1:80 -A", "", TRY, 255),
        g("-C -t 198.19.0.1:80", "", "Illegal 'service-address' option with the 'flush' command\n", 2),
        g("-A -t 198.19.0.1:80 -r 198.18.1.10", "", "Illegal 'real-server' option with the 'add-service' command\n", 2),
        g("-d -t 198.19.0.1:80 -r 198.18.1.10 -w 2", "", "Illegal 'weight' option with the 'delete-server' command\n", 2),
        g("-A -s rr", "", "You need to supply the 'service-address' option for the 'add-service' command\n", 2),
        g("-a -t 198.19.0.1:80 -m", "", "You need to supply the 'real-server' option for the 'add-server' command\n", 2),
        g("-L -c -t 198.19.0.1:80", "", "The option 'service-address' conflicts with the 'connection' option in the 'list' command\n", 2),
        g("-L --timeout --daemon", "", "The option 'daemon' conflicts with the 'timeout' option in the 'list' command\n", 2),
        g("-L -c --stats", "", "options conflicts in the list command\n", 2),
        g("-A -t 198.19.0.1", "", "Zero port specified for non-persistent service\n", 2),
        g("-A -t 198.19.0.1:80 -b sh-port", "", "incompatible scheduler flag `sh-port'\n", 2),
        g("-A -t 198.19.0.1:80 -s sh -b sh-bogus", "", "invalid scheduler flag `sh-bogus'\n", 2),
        g("-a -t 198.19.0.1:80 -r 198.18.1.10 -m -w 70000", "", "illegal weight specified\n", 2),
        g("-A -t 198.19.0.1:80 -p 0", "", "invalid timeout value `0' specified\n", 2),
        g("-A -t 198.19.0.300:80", "", "illegal virtual server address[:port] specified\n", 2),
        g("-a -t 198.19.0.1:80 -r no-such-host.example.net -m", "", "illegal real server address[:port] specified\n", 2),
        g("-A -t 198.19.0.1:80 -M 255.255.300.0 -p", "", "illegal virtual server persistent mask specified\n", 2),
        g("-L --stats=1", "", "--stats=1: option does not take an argument\n", 255),
        g("-A -t", "", "-t: missing argument\n", 255),
        g("-L extra", "", "unexpected argument extra\n", 2),
        g("--set 1 2", "", "--set option requires 3 timeout values\n", 2),
        g("-A -a -t 198.19.0.1:80", "", "invalid option `-a'\n", 2),
        g("-A -t 198.19.0.1:80 -s rr -s wlc", "", "multiple 'scheduler' options specified\n", 2),
        // What ipvsadm takes and xvs does not do: refused with why.
        // No method: gatewaying, as ipvsadm; to a service that does not
        // exist, ipvsadm's own error.
        g("-a -t 198.19.0.1:80 -r 198.18.1.10", "", "Service not defined\n", 255),
        g("-a -t 198.19.0.1:80 -r 198.18.1.10 -i --tun-type gre", "", "--tun-type gre: xvs tunnels with ipip or gue (GRE is not done)\n", 2),
        g("-A -f 1", "", "-f: not supported by xvs: services are addresses and ports (no firewall-mark services)\n", 2),
        g("--start-daemon master", "", "--start-daemon: not supported by xvs: flow sync runs from the config file's [cluster.sync] (its state: -L --daemon; a takeover: --takeover)\n", 2),
        // The table: names resolve through the namespace's hosts file.
        g("-A -t web.example.net:http -s rr", "", "", 0),
        g("-A -t 198.19.0.1:80", "", "Service already exists\n", 255),
        g("-A -t 198.19.0.3:80 -s nosuch", "", "Scheduler or persistence engine not found\n", 255),
        g("-a -t 198.19.0.1:80 -r real1.example.net:8080 -m -w 3", "", "", 0),
        g("-a -t 198.19.0.1:80 -r 198.18.1.10:8080 -m", "", "Destination already exists\n", 255),
        g("-a -t 198.19.0.9:80 -r 198.18.1.10:8080 -m", "", "Service not defined\n", 255),
        g("-e -t 198.19.0.1:80 -r 198.18.1.12:8080 -m -w 1", "", "No such destination\n", 255),
        g("-d -t 198.19.0.1:80 -r 198.18.1.12:8080", "", "No such destination\n", 255),
        g("-D -t 198.19.0.9:80", "", "No such service\n", 255),
        g("-E -t 198.19.0.9:80 -s rr", "", "No such service\n", 255),
        g("-Z -t 198.19.0.9:80", "", "No such service\n", 255),
        g("-L -n -t 198.19.0.9:80", "", "No such service\n", 1),
        g("-A -u dns.a-long-zone-name.example.net:domain -s sh -b sh-port -p", "", "", 0),
        g("-a -u 198.19.0.2:53 -r 198.18.1.11 -m -w 0", "", "", 0),
        g("-A -t 198.19.0.1:443 -s mh -b mh-fallback,mh-port", "", "", 0),
        g("-a -t 198.19.0.1:443 -r 198.18.1.10:8443 -m -w 2", "", "", 0),
        g("-A -t 198.19.0.4:0 -s wlc -p 600 -M 255.255.255.0", "", "", 0),
        g("-a -t 198.19.0.4:0 -r 198.18.1.12 -m", "", "", 0),
        // -C with a service never clears the table.
        g("-C -t 198.19.0.1:80", "", "Illegal 'service-address' option with the 'flush' command\n", 2),
        // Listings.
        g("-Ln", LIST_N, "", 0),
        g("-L -n", LIST_N, "", 0),
        g("-L", LIST_NAMES, "", 0),
        g("", LIST_NAMES, "", 0),
        g("-Ln -t 198.19.0.1:443", ONE_SERVICE, "", 0),
        g("-Ln --thresholds -t 198.19.0.1:80", THRESHOLDS, "", 0),
        g("-Ln --tun-info -t 198.19.0.1:80", TUN_INFO, "", 0),
        g("-Ln --stats -t 198.19.0.1:80", STATS_ONE, "", 0),
        g("-L --daemon", "", "", 0),
        g("-Sn", SAVE_N, "", 0),
        g("-S -n", SAVE_N, "", 0),
        g("-S", SAVE_NAMES, "", 0),
        // -E is ipvsadm's: the scheduler defaults to wlc, persistence
        // goes unless given again.
        g("-E -t 198.19.0.4:0 -p 600 -M 255.255.255.0", "", "", 0),
        g("-E -t 198.19.0.1:80 -s rr", "", "", 0),
        // Restore: the saved rules come back byte for byte.
        g("-C", "", "", 0),
        g("-Ln", "IP Virtual Server version 1.2.1 (size=65536)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n", "", 0),
        r("-R", SAVE_N, "", "", 0),
        g("-Sn", SAVE_N, "", 0),
        // A file written by ipvsadm with names reads back the same.
        g("-C", "", "", 0),
        r("-R", SAVE_NAMES, "", "", 0),
        g("-Sn", SAVE_N, "", 0),
        // A refused restore names its line and changes nothing.
        r("-R", "-A -t 198.19.0.5:80 -s rr\n\n-A -t 198.19.0.1:80 -s rr\n", "", "line 3: Service already exists; nothing was restored\n", 255),
        r("-R", "# comment\n-A -t 198.19.0.5:80 -s rr\n-a -t 198.19.0.5:80 -r 198.18.1.10 -m -w 99999\n", "", "line 3: illegal weight specified\n", 2),
        r("-R", "-R\n", "", "line 1: Try `xvsadm -h' or 'xvsadm --help' for more information.\n", 255),
        g("-Sn", SAVE_N, "", 0),
        // Timeouts.
        g("--set 900 120 300", "", "", 0),
        g("-L --timeout", "Timeout (tcp tcpfin udp): 900 120 300\n", "", 0),
        g("-Z", "", "", 0),
        g("-Z -t 198.19.0.1:80", "", "", 0),
        // The packaging example restores as it is written.
        g("-C", "", "", 0),
        r("-R", EXAMPLE_RULES, "", "", 0),
        g("-Sn", EXAMPLE_RULES, "", 0),
        g("-C", "", "", 0),
        // Every IPVS scheduler.
        g("-A -t 198.19.0.6:80 -s lblc", "", "", 0),
        g("-A -t 198.19.0.6:81 -s lblcr", "", "", 0),
        g("-A -t 198.19.0.6:82 -s fo", "", "", 0),
        g("-A -t 198.19.0.6:83 -s ovf", "", "", 0),
        g("-A -t 198.19.0.6:84 -s sed", "", "", 0),
        g("-A -t 198.19.0.6:85 -s nq", "", "", 0),
        g("-Sn", "-A -t 198.19.0.6:80 -s lblc\n-A -t 198.19.0.6:81 -s lblcr\n-A -t 198.19.0.6:82 -s fo\n-A -t 198.19.0.6:83 -s ovf\n-A -t 198.19.0.6:84 -s sed\n-A -t 198.19.0.6:85 -s nq\n", "", 0),
        g("-C", "", "", 0),
        // conntrack(8)'s outputs and statuses on an empty table.
        g("conntrack -L", "", CT_SHOWN_0, 0),
        g("conntrack -C", "0\n", "", 0),
        g("conntrack -L -f ipv6 -p udp", "", CT_SHOWN_0, 0),
        g("conntrack -F", "", CT_DELETED_0, 0),
        g("conntrack -L -o xml", "", "xvsadm conntrack: -o xml: not supported by xvs: only `extended' and `timestamp'\n", 2),
        g("conntrack -L -e NEW", "", "xvsadm conntrack: -e: only with -E\n", 2),
        g("conntrack -L -C", "", "xvsadm conntrack: exactly one of -L, -D, -F, -S, -C, -E\n", 2),
        // Global options anywhere: before the subcommand too.
        g("--json conntrack -L", "[]\n", "", 0),
    ]
}

fn gateway_config(t: &Topology, socket: &Path) -> String {
    format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n[conntrack]\ncapacity = 65536\n\n[admin]\nsocket = \"{}\"\n",
        t.gateway_client_if,
        socket.display(),
    )
}

#[test]
fn xvsadm_prints_what_ipvsadm_prints() {
    if !privileged("xvsadm_prints_what_ipvsadm_prints") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let socket = dir_of(&t, "golden").join("xvs.sock");
    let (gw, _) = Daemon::start(&t, "golden", &bins(), &gateway_config(&t, &socket), &[]).unwrap();
    let ns = t.gateway.name().to_owned();
    let _etc = NsEtc::new(&ns, HOSTS);
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let args: Vec<&str> = c.args.split_whitespace().collect();
        let got = xvsadm(&ns, &gw.socket, &args, c.stdin);
        let want = (c.status, c.out.to_owned(), c.err.to_owned());
        if got != want {
            failures.push(format!(
                "case {i}: xvsadm {}\n  want status {} stdout {:?} stderr {:?}\n  got  status {} stdout {:?} stderr {:?}",
                c.args, want.0, want.1, want.2, got.0, got.1, got.2
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `-Z` zeroes the counters `--stats` shows and the rates `--rate` shows
/// (one service, then all), while the Prometheus counters keep counting;
/// conntrack's formats with real flows.
#[test]
fn zero_counters_and_conntrack_with_real_flows() {
    if !privileged("zero_counters_and_conntrack_with_real_flows") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let socket = dir_of(&t, "zero").join("xvs.sock");
    let mut cfg = gateway_config(&t, &socket);
    // Port 81 is weighted failover (fo): every flow to the heaviest.
    for (port, sched, w1) in [(80, "rr", 1), (81, "fo", 2)] {
        cfg.push_str(&format!(
            "\n[[services]]\nvip = \"198.19.0.1\"\nport = {port}\nscheduler = \"{sched}\"\nbackends = [{{ address = \"{}\", port = 8080 }}, {{ address = \"{}\", port = 8080, weight = {w1} }}]\n",
            backend_addr(0),
            backend_addr(1)
        ));
    }
    let (gw, _) = Daemon::start(&t, "zero", &bins(), &cfg, &[]).unwrap();

    // conntrack -E sees the flows as they start (bounded: 6 s).
    let mut events = Command::new("timeout");
    events
        .args(["-s", "INT", "6"])
        .arg(bins().join("xvsadm"))
        .args(["conntrack", "-E", "-p", "tcp", "--socket"])
        .arg(&gw.socket)
        .stdout(Stdio::piped());
    let events = events.spawn().unwrap();
    // The closes alone, time-stamped (`conntrack -E -e UPDATES -o
    // timestamp`).
    let mut closes = Command::new("timeout");
    closes
        .args(["-s", "INT", "6"])
        .arg(bins().join("xvsadm"))
        .args([
            "conntrack",
            "-E",
            "-e",
            "UPDATES",
            "-o",
            "timestamp",
            "--socket",
        ])
        .arg(&gw.socket)
        .stdout(Stdio::piped());
    let closes = closes.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let load = t.tcp_load(TESTNET, "198.19.0.1:80", 20, 5000);
    assert_eq!(load, "ok=20 failed=0 by=b0:10,b1:10");
    let load = t.tcp_load(TESTNET, "198.19.0.1:81", 20, 5000);
    assert_eq!(load, "ok=20 failed=0 by=b1:20");
    let events = String::from_utf8(events.wait_with_output().unwrap().stdout).unwrap();
    let new: Vec<&str> = events
        .lines()
        .filter(|l| l.starts_with("    [NEW] tcp      6 src="))
        .collect();
    assert_eq!(new.len(), 40, "{events}");
    assert!(
        new.iter().all(|l| l.contains(" dst=198.19.0.1 ")
            && l.contains(" [UNREPLIED] src=198.18.1.1")
            && l.contains(" dst=198.18.1.2 ")),
        "{events}"
    );
    // Every connection's close, and nothing else, each line stamped
    // with the wall-clock second it happened in.
    let closes = String::from_utf8(closes.wait_with_output().unwrap().stdout).unwrap();
    #[allow(clippy::disallowed_types)] // the stamps are wall-clock time
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut closed = std::collections::HashSet::new();
    for l in closes.lines() {
        let (stamp, rest) = l.split_once("]\t").unwrap_or_else(|| panic!("{l}"));
        let (secs, micros) = stamp[1..].split_once('.').unwrap();
        let secs: u64 = secs.parse().unwrap();
        assert!(now - secs < 30 && micros.len() == 6, "{l}");
        assert!(
            rest.starts_with(" [UPDATE] tcp      6 src=198.18.0."),
            "{l}"
        );
        closed.insert(rest.split(" src=").nth(1).unwrap().to_owned());
    }
    assert_eq!(closed.len(), 40, "{closes}");

    // conntrack -L: every flow closed cleanly (TIME_WAIT, assured), the
    // summary on stderr, -C agrees, -S starts with conntrack's fields.
    let (status, list, summary) = gw.adm(&["conntrack", "-L"]);
    assert_eq!(status, 0);
    assert_eq!(list.lines().count(), 40, "{list}");
    for l in list.lines() {
        let w: Vec<&str> = l.split(' ').filter(|w| !w.is_empty()).collect();
        assert_eq!(&w[..2], ["tcp", "6"], "{l}");
        assert!(w[2].parse::<u32>().is_ok(), "{l}");
        assert_eq!(w[3], "TIME_WAIT", "{l}");
        assert!(
            w[4].starts_with("src=198.18.0.") && w[5] == "dst=198.19.0.1",
            "{l}"
        );
        assert!(
            w[8].starts_with("src=198.18.1.1") && w[9] == "dst=198.18.1.2",
            "{l}"
        );
        assert_eq!(&w[12..], ["[ASSURED]", "mark=0", "use=1"], "{l}");
    }
    assert!(
        summary.ends_with(" 40 flow entries have been shown.\n"),
        "{summary}"
    );
    assert_eq!(gw.adm_ok(&["conntrack", "-C"]), "40\n");
    assert_eq!(gw.adm_ok(&["conntrack", "-C", "--dport", "81"]), "20\n");
    let extended = gw.adm_ok(&["conntrack", "-L", "-o", "extended", "--dport", "80"]);
    assert!(
        extended
            .lines()
            .all(|l| l.starts_with("ipv4     2 tcp      6 ")),
        "{extended}"
    );
    assert_eq!(gw.adm_ok(&["conntrack", "-L", "-f", "ipv6"]), "");
    let stats = gw.adm_ok(&["conntrack", "-S"]);
    assert!(
        stats.starts_with("cpu=0   \tfound=")
            && stats.contains(
                " insert=40 insert_failed=0 drop=0 early_drop=0 error=0 search_restart=0 "
            ),
        "{stats}"
    );

    // --stats counts 20 connections per service; -Z -t zeroes one.
    let conns = |port: u16| -> u64 {
        let out = gw.adm_ok(&[
            "-Ln",
            "--stats",
            "--exact",
            "-t",
            &format!("198.19.0.1:{port}"),
        ]);
        let line = out.lines().nth(2).unwrap().to_owned();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    assert_eq!((conns(80), conns(81)), (20, 20));
    gw.adm_ok(&["-Z", "-t", "198.19.0.1:80"]);
    assert_eq!((conns(80), conns(81)), (0, 20));
    let one = gw.adm_ok(&["-Ln", "--stats", "-t", "198.19.0.1:80"]);
    assert!(
        one.lines()
            .skip(2)
            .all(|l| l.split_whitespace().skip(2).all(|v| v == "0")),
        "{one}"
    );
    // Traffic after the zeroing counts from 0.
    let load = t.tcp_load(TESTNET, "198.19.0.1:80", 5, 5000);
    assert!(load.starts_with("ok=5 failed=0"), "{load}");
    assert_eq!(conns(80), 5);
    // Rates: a sample after the traffic shows it (the daemon's estimator,
    // every 2 s); -Z sets them to 0 at once.
    std::thread::sleep(Duration::from_millis(2500));
    let rates = gw.adm_ok(&["-Ln", "--rate", "--exact", "-t", "198.19.0.1:80"]);
    let service = rates.lines().find(|l| l.starts_with("TCP  198.19.0.1:80"));
    assert!(
        service.is_some_and(|l| l.split_whitespace().skip(2).any(|v| v != "0")),
        "{rates}"
    );
    gw.adm_ok(&["-Z"]);
    assert_eq!((conns(80), conns(81)), (0, 0));
    let rates = gw.adm_ok(&["-Ln", "--rate", "--exact"]);
    for l in rates.lines().skip(3) {
        assert!(l.split_whitespace().skip(2).all(|v| v == "0"), "{rates}");
    }
    // Prometheus counters never go back.
    let metrics = gw.get("/metrics");
    let total: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("xvs_service_connections_total{") && l.contains("port=\"80\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(total, 25, "{metrics}");
}
