//! ipvsadm 1.31's command line, as its `parse_options`,
//! `generic_opt_check` and `process_options` read it, so that every
//! command line ipvsadm refuses is refused here with the same message
//! and exit status, and every one it takes means the same.
//!
//! The option syntax is popt's: `--long value`, `--long=value`, short
//! options bundled (`-Ln`) with an argument attached or next (`-t1.2.3.4`,
//! `-t 1.2.3.4`), `-p`'s optional argument taken only when the next word
//! does not start with `-`, `--` ending the options, other words left over
//! (`--set`'s three values, else "unexpected argument"). The first option
//! must be a command; later commands are "invalid option".
//!
//! Exit statuses: 2 for a refused option (`fail(2, ...)`), 255 for popt's
//! own errors and the "Try ... --help" line (ipvsadm returns -1).
//!
//! Then xvs's own limits: what ipvsadm accepts but xvs does not do
//! (firewall marks, IPv6, SCTP, thresholds, sync daemons, direct routing
//! and tunnels, ...) is refused after ipvsadm's checks, with why
//! ([`unsupported`]), so a command line is first judged as
//! ipvsadm would.
//!
//! Pure: names (`web.example.net`, `http`) resolve through [`Resolve`].

use std::net::{IpAddr, Ipv4Addr};

/// ipvsadm's option names, in its `optnames` order (bit i of the option
/// set).
pub const OPT_NAMES: [&str; 34] = [
    "numeric",
    "connection",
    "service-address",
    "scheduler",
    "persistent",
    "netmask",
    "real-server",
    "forwarding-method",
    "weight",
    "u-threshold",
    "l-threshold",
    "mcast-interface",
    "timeout",
    "daemon",
    "stats",
    "rate",
    "thresholds",
    "persistent-conn",
    "nosort",
    "syncid",
    "exact",
    "ops",
    "pe",
    "sched-flags",
    "mcast-group",
    "mcast-port",
    "mcast-ttl",
    "sync-maxlen",
    "tun-info",
    "tun-type",
    "tun-port",
    "tun-nocsum",
    "tun-csum",
    "tun-remcsum",
];

/// Option bit numbers (`OPTC_*`).
#[allow(missing_docs)]
pub mod optc {
    pub const NUMERIC: usize = 0;
    pub const CONNECTION: usize = 1;
    pub const SERVICE: usize = 2;
    pub const SCHEDULER: usize = 3;
    pub const PERSISTENT: usize = 4;
    pub const NETMASK: usize = 5;
    pub const SERVER: usize = 6;
    pub const FORWARD: usize = 7;
    pub const WEIGHT: usize = 8;
    pub const UTHRESHOLD: usize = 9;
    pub const LTHRESHOLD: usize = 10;
    pub const MCAST: usize = 11;
    pub const TIMEOUT: usize = 12;
    pub const DAEMON: usize = 13;
    pub const STATS: usize = 14;
    pub const RATE: usize = 15;
    pub const THRESHOLDS: usize = 16;
    pub const PERSISTENTCONN: usize = 17;
    pub const NOSORT: usize = 18;
    pub const SYNCID: usize = 19;
    pub const EXACT: usize = 20;
    pub const ONEPACKET: usize = 21;
    pub const PE: usize = 22;
    pub const SCHED_FLAGS: usize = 23;
    pub const MCAST_GROUP: usize = 24;
    pub const MCAST_PORT: usize = 25;
    pub const MCAST_TTL: usize = 26;
    pub const SYNC_MAXLEN: usize = 27;
    pub const TUN_INFO: usize = 28;
    pub const TUN_TYPE: usize = 29;
    pub const TUN_PORT: usize = 30;
    pub const TUN_NOCSUM: usize = 31;
    pub const TUN_CSUM: usize = 32;
    pub const TUN_REMCSUM: usize = 33;
}

/// A command (`CMD_*`), in ipvsadm's order, then xvs's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// `-A`.
    Add,
    /// `-E`.
    Edit,
    /// `-D`.
    Del,
    /// `-C`.
    Flush,
    /// `-L`, `-l`.
    List,
    /// `-a`.
    AddDest,
    /// `-d`.
    DelDest,
    /// `-e`.
    EditDest,
    /// `--set`.
    Timeout,
    /// `--start-daemon`.
    StartDaemon,
    /// `--stop-daemon`.
    StopDaemon,
    /// `-R`.
    Restore,
    /// `-S`.
    Save,
    /// `-Z`.
    Zero,
    /// xvs: `--reload`.
    Reload,
    /// xvs: `--set-timeout STATE SECONDS`.
    SetTimeout,
}

impl Cmd {
    /// ipvsadm's name for it (`cmdnames`), or xvs's.
    pub fn name(self) -> &'static str {
        match self {
            Cmd::Add => "add-service",
            Cmd::Edit => "edit-service",
            Cmd::Del => "delete-service",
            Cmd::Flush => "flush",
            Cmd::List => "list",
            Cmd::AddDest => "add-server",
            Cmd::DelDest => "delete-server",
            Cmd::EditDest => "edit-server",
            Cmd::Timeout => "set",
            Cmd::StartDaemon => "start-daemon",
            Cmd::StopDaemon => "stop-daemon",
            Cmd::Restore => "restore",
            Cmd::Save => "save",
            Cmd::Zero => "zero",
            Cmd::Reload => "reload",
            Cmd::SetTimeout => "set-timeout",
        }
    }

    /// Its row of [`COMMANDS_V_OPTIONS`] (xvs's commands take no option).
    fn row(self) -> &'static [u8; 34] {
        let i = match self {
            Cmd::Add => 0,
            Cmd::Edit => 1,
            Cmd::Del => 2,
            Cmd::Flush | Cmd::Reload | Cmd::SetTimeout => 3,
            Cmd::List => 4,
            Cmd::AddDest => 5,
            Cmd::DelDest => 6,
            Cmd::EditDest => 7,
            Cmd::Timeout => 8,
            Cmd::StartDaemon => 9,
            Cmd::StopDaemon => 10,
            Cmd::Restore => 11,
            Cmd::Save => 12,
            Cmd::Zero => 13,
        };
        &COMMANDS_V_OPTIONS[i]
    }

    /// ipvsadm's commands, in table order.
    pub const IPVSADM: [Cmd; 14] = [
        Cmd::Add,
        Cmd::Edit,
        Cmd::Del,
        Cmd::Flush,
        Cmd::List,
        Cmd::AddDest,
        Cmd::DelDest,
        Cmd::EditDest,
        Cmd::Timeout,
        Cmd::StartDaemon,
        Cmd::StopDaemon,
        Cmd::Restore,
        Cmd::Save,
        Cmd::Zero,
    ];
}

/// ipvsadm's `commands_v_options`: `+` compulsory, `x` illegal, `1`
/// exclusive (one of them at most), ` ` optional. Copied cell for cell.
#[rustfmt::skip]
pub const COMMANDS_V_OPTIONS: [[u8; 34]; 14] = [
    // One byte per option, in OPT_NAMES order (-n -c svc -s -p -M -r fwd -w
    // -x -y mcast-if timeout daemon stats rate thresholds persistent-conn
    // nosort syncid exact ops pe -b mcast-group/port/ttl sync-maxlen
    // tun-info tun-type tun-port tun-nocsum tun-csum tun-remcsum).
    /*ADD*/      *b"xx+   xxxxxxxxxxxxxxx   xxxxxxxxxx",
    /*EDIT*/     *b"xx+   xxxxxxxxxxxxxxx   xxxxxxxxxx",
    /*DEL*/      *b"xx+xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    /*FLUSH*/    *b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    /*LIST*/     *b" 11xxxxxxxxx11       xxxxxxx xxxxx",
    /*ADDSRV*/   *b"xx+xxx+    xxxxxxxxxxxxxxxxxx     ",
    /*DELSRV*/   *b"xx+xxx+xxxxxxxxxxxxxxxxxxxxxxxxxxx",
    /*EDITSRV*/  *b"xx+xxx+    xxxxxxxxxxxxxxxxxx     ",
    /*TIMEOUT*/  *b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    /*STARTD*/   *b"xxxxxxxxxxx xxxxxxx xxxx    xxxxxx",
    /*STOPD*/    *b"xxxxxxxxxxxxxxxxxxx xxxxxxxxxxxxxx",
    /*RESTORE*/  *b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    /*SAVE*/     *b" xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    /*ZERO*/     *b"xx xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

/// A refusal: the message (one line, printed on stderr) and the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// Exit status.
    pub status: u8,
    /// What to print on stderr (without the newline).
    pub message: String,
}

/// `fail(2, ...)`.
fn fail(message: impl Into<String>) -> Exit {
    Exit {
        status: 2,
        message: message.into(),
    }
}

/// `tryhelp_exit(argv[0], -1)`.
fn tryhelp(program: &str) -> Exit {
    Exit {
        status: 255,
        message: format!("Try `{program} -h' or '{program} --help' for more information."),
    }
}

/// Names to addresses and ports (ipvsadm's `host_to_addr` and
/// `service_to_port`), for addresses written as names.
pub trait Resolve {
    /// The first IPv4 address of host `name`.
    fn host(&self, name: &str) -> Option<Ipv4Addr>;
    /// The port of service `name` for `tcp` or `udp`.
    fn service(&self, name: &str, proto: Proto) -> Option<u16>;
}

/// The protocol of a service option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// `-t`.
    Tcp,
    /// `-u`.
    Udp,
    /// `--sctp-service` (refused by xvs).
    Sctp,
}

impl Proto {
    /// `tcp`, `udp`, `sctp`.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

/// A virtual service as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `-t`, `-u`, `--sctp-service`: address (IPv6 accepted, refused by
    /// xvs later) and port (0 when not given).
    Addr(Proto, IpAddr, u16),
    /// `-f MARK`.
    Fwmark(u32),
}

/// Forwarding method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fwd {
    /// `-m`.
    Masq,
    /// `-g` (ipvsadm's default).
    Droute,
    /// `-i`.
    Tunnel,
}

/// Scheduler flag bits (`IP_VS_SVC_F_SCHED1..3`).
pub const SCHED1: u32 = 1;
/// See [`SCHED1`].
pub const SCHED2: u32 = 2;
/// See [`SCHED1`].
pub const SCHED3: u32 = 4;

/// Output format flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Format {
    /// `-n`.
    pub numeric: bool,
    /// `--stats`.
    pub stats: bool,
    /// `--rate`.
    pub rate: bool,
    /// `--exact`.
    pub exact: bool,
    /// `--thresholds`.
    pub thresholds: bool,
    /// `--persistent-conn`.
    pub persistent_conn: bool,
    /// `--nosort`.
    pub nosort: bool,
    /// `--tun-info`.
    pub tun_info: bool,
}

/// A command line ipvsadm would run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The command.
    pub cmd: Cmd,
    /// Bit `optc::*` for every option given.
    pub options: u64,
    /// `-t`/`-u`/`--sctp-service`/`-f`.
    pub service: Option<Service>,
    /// `-s` (wlc for `-A`/`-E` when not given).
    pub scheduler: Option<String>,
    /// `-p`: the timeout (360 when given without a value).
    pub persistent: Option<u32>,
    /// `-M` (255.255.255.255 unless given; for an IPv6 service a prefix
    /// length, kept as its mask).
    pub netmask: IpAddr,
    /// `-b`, as [`SCHED1`] bits.
    pub sched_flags: u32,
    /// `-r`: address and port (the service's port when not given, and
    /// always for `-g`/`-i`).
    pub dest: Option<(IpAddr, u16)>,
    /// `-m`/`-g`/`-i` (`-g` when none).
    pub fwd: Fwd,
    /// `--tun-type` (`ipip` unless given): an index of [`TUN_NAMES`].
    pub tun_type: usize,
    /// `--tun-port`.
    pub tun_port: Option<u16>,
    /// `-w` (1 unless given).
    pub weight: u32,
    /// Listing format.
    pub format: Format,
    /// `--set`'s three values.
    pub timeouts: Option<[u32; 3]>,
    /// `--set-timeout`'s state and seconds.
    pub set_timeout: Option<(String, String)>,
}

impl Command {
    /// Whether option `o` was given.
    pub fn has(&self, o: usize) -> bool {
        self.options & (1 << o) != 0
    }
}

/// What a command line asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `-h`.
    Help,
    /// `-v`.
    Version,
    /// A command.
    Run(Command),
}

/// ipvsadm's IPVS_SVC_PERSISTENT_TIMEOUT: the code's default for `-p`
/// without a value (its man page says 300).
pub const DEFAULT_PERSISTENT_TIMEOUT: u32 = 360;
/// ipvsadm's MAX_TIMEOUT: 31 days.
pub const MAX_TIMEOUT: u32 = 86400 * 31;

/// What an option takes after it (popt's `argInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// Nothing.
    None,
    /// A value.
    Required,
    /// A value, when the next word does not start with `-` (`-p`).
    Optional,
}

/// Option identities (popt's `val`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tag {
    Cmd(Cmd),
    Help,
    Version,
    Tcp,
    Udp,
    Sctp,
    Fwmark,
    Scheduler,
    Persistent,
    Netmask,
    Real,
    Masq,
    Ipip,
    Gatewaying,
    Weight,
    UThreshold,
    LThreshold,
    Numeric,
    Connection,
    McastInterface,
    Syncid,
    Timeout,
    Daemon,
    Stats,
    Rate,
    Thresholds,
    PersistentConn,
    NoSort,
    Sort,
    Exact,
    Ipv6,
    Ops,
    Pe,
    SchedFlags,
    McastGroup,
    McastPort,
    McastTtl,
    SyncMaxlen,
    TunInfo,
    TunType,
    TunPort,
    TunNocsum,
    TunCsum,
    TunRemcsum,
}

/// ipvsadm's popt table (long name, short name, argument, tag, help),
/// plus xvs's `--reload` and `--set-timeout`.
const TABLE: &[(&str, char, Arg, Tag, &str)] = &[
    ("add-service", 'A', Arg::None, Tag::Cmd(Cmd::Add), "add a virtual service with options"),
    ("edit-service", 'E', Arg::None, Tag::Cmd(Cmd::Edit), "edit a virtual service with options"),
    ("delete-service", 'D', Arg::None, Tag::Cmd(Cmd::Del), "delete a virtual service"),
    ("clear", 'C', Arg::None, Tag::Cmd(Cmd::Flush), "clear the whole table"),
    ("list", 'L', Arg::None, Tag::Cmd(Cmd::List), "list the table (or one virtual service)"),
    ("list", 'l', Arg::None, Tag::Cmd(Cmd::List), "list the table (or one virtual service)"),
    ("zero", 'Z', Arg::None, Tag::Cmd(Cmd::Zero), "zero the counters of a service or of all services"),
    ("add-server", 'a', Arg::None, Tag::Cmd(Cmd::AddDest), "add a real server with options"),
    ("edit-server", 'e', Arg::None, Tag::Cmd(Cmd::EditDest), "edit a real server with options"),
    ("delete-server", 'd', Arg::None, Tag::Cmd(Cmd::DelDest), "delete a real server"),
    ("set", '\0', Arg::None, Tag::Cmd(Cmd::Timeout), "set the tcp, tcpfin and udp timeouts (seconds; 0 leaves one unchanged)"),
    ("help", 'h', Arg::None, Tag::Help, "display the help message"),
    ("version", 'v', Arg::None, Tag::Version, "display the version"),
    ("restore", 'R', Arg::None, Tag::Cmd(Cmd::Restore), "restore rules from standard input (all lines or none)"),
    ("save", 'S', Arg::None, Tag::Cmd(Cmd::Save), "save the rules to standard output"),
    (
        "start-daemon",
        '\0',
        Arg::Required,
        Tag::Cmd(Cmd::StartDaemon),
        "refused: flow sync is configured in [cluster.sync] of xvs.toml(5)",
    ),
    (
        "stop-daemon",
        '\0',
        Arg::Required,
        Tag::Cmd(Cmd::StopDaemon),
        "refused: flow sync is configured in [cluster.sync] of xvs.toml(5)",
    ),
    ("tcp-service", 't', Arg::Required, Tag::Tcp, "a TCP virtual service, host[:port]"),
    ("udp-service", 'u', Arg::Required, Tag::Udp, "a UDP virtual service, host[:port]"),
    ("sctp-service", '\0', Arg::Required, Tag::Sctp, "refused: xvs does not do SCTP"),
    ("fwmark-service", 'f', Arg::Required, Tag::Fwmark, "refused: xvs does not do firewall-mark services"),
    ("scheduler", 's', Arg::Required, Tag::Scheduler, "rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, fo, ovf, mh, or xvs's random and twos (default wlc)"),
    ("persistent", 'p', Arg::Optional, Tag::Persistent, "persistent service, for timeout seconds (360 without a value, as ipvsadm's code does)"),
    ("netmask", 'M', Arg::Required, Tag::Netmask, "the persistence granularity mask"),
    ("real-server", 'r', Arg::Required, Tag::Real, "a real server, host[:port]"),
    ("masquerading", 'm', Arg::None, Tag::Masq, "masquerading: full NAT through a SNAT address"),
    ("ipip", 'i', Arg::None, Tag::Ipip, "IPIP (or GUE, --tun-type) tunnelling; replies bypass xvs"),
    ("gatewaying", 'g', Arg::None, Tag::Gatewaying, "gatewaying: direct routing (the default); the real server holds the VIP"),
    ("weight", 'w', Arg::Required, Tag::Weight, "the real server's capacity"),
    ("u-threshold", 'x', Arg::Required, Tag::UThreshold, "refused: xvs has no connection thresholds"),
    ("l-threshold", 'y', Arg::Required, Tag::LThreshold, "refused: xvs has no connection thresholds"),
    ("numeric", 'n', Arg::None, Tag::Numeric, "numeric output of addresses and ports"),
    ("connection", 'c', Arg::None, Tag::Connection, "list the connections (flows)"),
    ("mcast-interface", '\0', Arg::Required, Tag::McastInterface, "refused: flow sync is configured in [cluster.sync]"),
    ("syncid", '\0', Arg::Required, Tag::Syncid, "refused: flow sync is configured in [cluster.sync]"),
    ("timeout", '\0', Arg::None, Tag::Timeout, "list the timeouts (tcp tcpfin udp)"),
    ("daemon", '\0', Arg::None, Tag::Daemon, "list the flow sync's state: role, peers heard, counters"),
    ("stats", '\0', Arg::None, Tag::Stats, "list with statistics"),
    ("rate", '\0', Arg::None, Tag::Rate, "list with rates"),
    ("thresholds", '\0', Arg::None, Tag::Thresholds, "list with thresholds (always 0)"),
    ("persistent-conn", '\0', Arg::None, Tag::PersistentConn, "refused: not supported by xvs"),
    ("nosort", '\0', Arg::None, Tag::NoSort, "do not sort services and servers"),
    ("sort", '\0', Arg::None, Tag::Sort, "does nothing (compatibility)"),
    ("exact", 'X', Arg::None, Tag::Exact, "expand numbers (exact values)"),
    ("ipv6", '6', Arg::None, Tag::Ipv6, "refused: IPv6 addresses are given in brackets instead"),
    ("ops", 'o', Arg::None, Tag::Ops, "refused: one-packet scheduling is not supported"),
    ("pe", '\0', Arg::Required, Tag::Pe, "refused: persistence engines are not supported"),
    ("sched-flags", 'b', Arg::Required, Tag::SchedFlags, "scheduler flags (comma-separated): sh-fallback, sh-port, mh-fallback, mh-port, flag-1, flag-2"),
    ("mcast-group", '\0', Arg::Required, Tag::McastGroup, "refused: flow sync is configured in [cluster.sync]"),
    ("mcast-port", '\0', Arg::Required, Tag::McastPort, "refused: flow sync is configured in [cluster.sync]"),
    ("mcast-ttl", '\0', Arg::Required, Tag::McastTtl, "refused: flow sync is configured in [cluster.sync]"),
    ("sync-maxlen", '\0', Arg::Required, Tag::SyncMaxlen, "refused: flow sync is configured in [cluster.sync]"),
    ("tun-info", '\0', Arg::None, Tag::TunInfo, "list with tunnel information"),
    ("tun-type", '\0', Arg::Required, Tag::TunType, "the tunnel type: ipip (default) or gue"),
    ("tun-port", '\0', Arg::Required, Tag::TunPort, "the GUE port (tunnel.gue_port, 6080)"),
    ("tun-nocsum", '\0', Arg::None, Tag::TunNocsum, "GUE without a UDP checksum (what xvs sends)"),
    ("tun-csum", '\0', Arg::None, Tag::TunCsum, "GUE with a UDP checksum"),
    ("tun-remcsum", '\0', Arg::None, Tag::TunRemcsum, "GUE with remote checksum offload"),
    ("reload", '\0', Arg::None, Tag::Cmd(Cmd::Reload), "xvs: re-read the config file (an invalid one changes nothing)"),
    ("set-timeout", '\0', Arg::None, Tag::Cmd(Cmd::SetTimeout), "xvs: set one state's timeout by its [conntrack.timeouts] name: state seconds"),
];

/// One option of the table, for the man page and the shell completions
/// (made from the parser's own table, so they cannot name an option it
/// does not read).
#[derive(Debug, Clone)]
pub struct OptionDoc {
    /// Long name, without `--`.
    pub long: &'static str,
    /// Short names (`--list` has two).
    pub short: Vec<char>,
    /// Its value.
    pub takes: Arg,
    /// One line of help.
    pub help: &'static str,
}

/// Every option of the table, once each, in the table's order.
pub fn options() -> Vec<OptionDoc> {
    let mut out: Vec<OptionDoc> = Vec::new();
    for &(long, short, arg, _, help) in TABLE {
        let short = (short != '\0').then_some(short);
        if let Some(seen) = out.iter_mut().find(|o| o.long == long) {
            seen.short.extend(short);
            continue;
        }
        out.push(OptionDoc {
            long,
            short: short.into_iter().collect(),
            takes: arg,
            help,
        });
    }
    out
}

/// popt's failures.
enum PoptError {
    BadOpt,
    NoArg,
    UnwantedArg,
}

impl PoptError {
    fn text(&self) -> &'static str {
        match self {
            PoptError::BadOpt => "unknown option",
            PoptError::NoArg => "missing argument",
            PoptError::UnwantedArg => "option does not take an argument",
        }
    }
}

/// popt's option walk over `argv[1..]`.
struct Popt<'a> {
    argv: &'a [String],
    next: usize,
    /// The rest of a short-option bundle.
    chars: Option<(usize, usize)>,
    rest_leftover: bool,
    leftovers: Vec<&'a str>,
    /// The argv element of the last option (poptBadOption).
    last: usize,
}

impl<'a> Popt<'a> {
    fn new(argv: &'a [String]) -> Self {
        Popt {
            argv,
            next: 1,
            chars: None,
            rest_leftover: false,
            leftovers: Vec::new(),
            last: 0,
        }
    }

    fn bad_option(&self) -> &str {
        self.argv
            .get(self.last)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The next option and its argument; `None` at the end.
    fn next_opt(&mut self) -> Option<Result<(Tag, Option<&'a str>), PoptError>> {
        loop {
            let (opt, attached): (&(&str, char, Arg, Tag, &str), Option<&'a str>) =
                if let Some((el, at)) = self.chars {
                    let word = &self.argv[el];
                    let c = word[at..].chars().next()?;
                    let rest = at + c.len_utf8();
                    self.chars = (rest < word.len()).then_some((el, rest));
                    self.last = el;
                    let Some(opt) = TABLE.iter().find(|o| o.1 == c && c != '\0') else {
                        return Some(Err(PoptError::BadOpt));
                    };
                    (opt, None)
                } else {
                    let word = self.argv.get(self.next)?;
                    let el = self.next;
                    self.next += 1;
                    if self.rest_leftover || !word.starts_with('-') || word == "-" {
                        self.leftovers.push(word);
                        continue;
                    }
                    if word == "--" {
                        self.rest_leftover = true;
                        continue;
                    }
                    self.last = el;
                    if let Some(long) = word.strip_prefix("--") {
                        let (name, value) = match long.split_once('=') {
                            Some((n, v)) => (n, Some(v)),
                            None => (long, None),
                        };
                        let Some(opt) = TABLE.iter().find(|o| o.0 == name) else {
                            return Some(Err(PoptError::BadOpt));
                        };
                        (opt, value)
                    } else {
                        self.chars = Some((el, 1));
                        continue;
                    }
                };
            let (_, _, arg, tag, _) = *opt;
            if arg == Arg::None {
                let eq = self
                    .chars
                    .is_some_and(|(el, at)| self.argv[el][at..].starts_with('='));
                if attached.is_some() || eq {
                    return Some(Err(PoptError::UnwantedArg));
                }
                return Some(Ok((tag, None)));
            }
            if let Some(v) = attached {
                return Some(Ok((tag, Some(v))));
            }
            if let Some((el, at)) = self.chars.take() {
                let rest = &self.argv[el][at..];
                return Some(Ok((tag, Some(rest.strip_prefix('=').unwrap_or(rest)))));
            }
            let Some(word) = self.argv.get(self.next) else {
                if arg == Arg::Optional {
                    return Some(Ok((tag, None)));
                }
                return Some(Err(PoptError::NoArg));
            };
            if arg == Arg::Optional && word.starts_with('-') {
                return Some(Ok((tag, None)));
            }
            self.next += 1;
            self.last = self.next - 1;
            return Some(Ok((tag, Some(word))));
        }
    }
}

/// `string_to_number`: a whole decimal number in `min..=max`.
fn number(s: &str, min: i64, max: i64) -> Option<i64> {
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s.trim_start()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = digits.parse().ok()?;
    let v = if neg { -v } else { v };
    (min..=max).contains(&v).then_some(v)
}

/// `inet_aton`: dotted quad with 1 to 4 parts, each decimal, octal (0)
/// or hex (0x).
pub fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut vals = Vec::new();
    for p in &parts {
        let v = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            u32::from_str_radix(h, 16).ok()?
        } else if p.len() > 1 && p.starts_with('0') {
            u32::from_str_radix(&p[1..], 8).ok()?
        } else if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
            p.parse().ok()?
        } else {
            return None;
        };
        vals.push(v);
    }
    let last = *vals.last()?;
    let head = &vals[..vals.len() - 1];
    if head.iter().any(|&v| v > 255) {
        return None;
    }
    let room = 32 - 8 * head.len() as u32;
    if room < 32 && last >> room != 0 {
        return None;
    }
    let mut addr = 0u32;
    for (i, v) in head.iter().enumerate() {
        addr |= v << (24 - 8 * i);
    }
    Some(Ipv4Addr::from(addr | last))
}

/// `parse_service`: `host[:port]` or `[v6]:port`; `None` when the
/// address does not parse (or the whole word is digits), else the
/// address and the port if one was given.
fn parse_service(buf: &str, proto: Proto, names: &dyn Resolve) -> Option<(IpAddr, Option<u16>)> {
    if buf.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (host, port) = if let Some(rest) = buf.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let p = after.strip_prefix(':')?;
        (h, Some(p))
    } else if buf.parse::<std::net::Ipv6Addr>().is_ok() {
        (buf, None)
    } else {
        match buf.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (buf, None),
        }
    };
    let addr = if let Ok(v6) = host.parse::<std::net::Ipv6Addr>() {
        IpAddr::V6(v6)
    } else if let Some(v4) = inet_aton(host) {
        IpAddr::V4(v4)
    } else {
        IpAddr::V4(names.host(host)?)
    };
    let port = match port {
        None => None,
        Some(p) => Some(match number(p, 0, 65535) {
            Some(n) => n as u16,
            None => names.service(p, proto)?,
        }),
    };
    Some((addr, port))
}

/// `parse_sched_flags` for scheduler `sched` (wlc when not given).
fn parse_sched_flags(sched: Option<&str>, arg: &str) -> Result<u32, Exit> {
    let sched = sched.filter(|s| !s.is_empty()).unwrap_or("wlc");
    let mut flags = 0;
    // strtok: empty tokens are skipped; an all-separator argument leaves
    // one (NULL) token, which ipvsadm would dereference: refused here.
    let tokens: Vec<&str> = arg.split(',').filter(|t| !t.is_empty()).collect();
    if tokens.is_empty() {
        return Err(fail(format!("invalid scheduler flag `{arg}'")));
    }
    for flag in tokens {
        let (bit, needs) = match flag {
            "flag-1" => (SCHED1, None),
            "flag-2" => (SCHED2, None),
            "flag-3" => (SCHED3, None),
            "sh-fallback" => (SCHED1, Some("sh")),
            "sh-port" => (SCHED2, Some("sh")),
            "mh-fallback" => (SCHED1, Some("mh")),
            "mh-port" => (SCHED2, Some("mh")),
            _ => return Err(fail(format!("invalid scheduler flag `{flag}'"))),
        };
        flags |= bit;
        if needs.is_some_and(|n| n != sched) {
            return Err(fail(format!("incompatible scheduler flag `{flag}'")));
        }
    }
    Ok(flags)
}

/// `set_option`: an option given twice is refused.
fn set_option(options: &mut u64, o: usize) -> Result<(), Exit> {
    if *options & (1 << o) != 0 {
        return Err(fail(format!(
            "multiple '{}' options specified",
            OPT_NAMES[o]
        )));
    }
    *options |= 1 << o;
    Ok(())
}

/// `generic_opt_check`.
fn generic_opt_check(cmd: Cmd, options: u64) -> Result<(), Exit> {
    let row = cmd.row();
    let mut last = 0;
    let mut count = 0;
    for (j, &cell) in row.iter().enumerate() {
        if options & (1 << j) == 0 {
            if cell == b'+' {
                return Err(fail(format!(
                    "You need to supply the '{}' option for the '{}' command",
                    OPT_NAMES[j],
                    cmd.name()
                )));
            }
        } else {
            if cell == b'x' {
                return Err(fail(format!(
                    "Illegal '{}' option with the '{}' command",
                    OPT_NAMES[j],
                    cmd.name()
                )));
            }
            if cell == b'1' {
                count += 1;
                if count == 1 {
                    last = j;
                    continue;
                }
                return Err(fail(format!(
                    "The option '{}' conflicts with the '{}' option in the '{}' command",
                    OPT_NAMES[j],
                    OPT_NAMES[last],
                    cmd.name()
                )));
            }
        }
    }
    Ok(())
}

/// Tunnel types and their options (`tunnel_types_v_options`).
pub const TUN_NAMES: [&str; 3] = ["ipip", "gue", "gre"];
const TUN_OPTS: [usize; 4] = [
    optc::TUN_PORT,
    optc::TUN_NOCSUM,
    optc::TUN_CSUM,
    optc::TUN_REMCSUM,
];
const TUNNEL_V_OPTIONS: [[u8; 4]; 3] = [*b"xxxx", *b"+111", *b"x11x"];

fn tunnel_opt_check(tun: usize, options: u64) -> Result<(), Exit> {
    let mut last = 0;
    let mut count = 0;
    for (j, &k) in TUN_OPTS.iter().enumerate() {
        let cell = TUNNEL_V_OPTIONS[tun][j];
        if options & (1 << k) == 0 {
            if cell == b'+' {
                return Err(fail(format!(
                    "You need to supply the '{}' option for the '{}' tunnel type",
                    OPT_NAMES[k], TUN_NAMES[tun]
                )));
            }
        } else {
            if cell == b'x' {
                return Err(fail(format!(
                    "Illegal '{}' option with the '{}' tunnel type",
                    OPT_NAMES[k], TUN_NAMES[tun]
                )));
            }
            if cell == b'1' {
                count += 1;
                if count == 1 {
                    last = k;
                    continue;
                }
                return Err(fail(format!(
                    "The option '{}' conflicts with the '{}' option in the '{}' tunnel type",
                    OPT_NAMES[k], OPT_NAMES[last], TUN_NAMES[tun]
                )));
            }
        }
    }
    Ok(())
}

/// Parses `argv` (program name first) as ipvsadm's `process_options`
/// does, up to the point where it would call the kernel. `in_restore`:
/// the line comes from `-R`'s input (a nested `-R` is refused).
pub fn parse(argv: &[String], in_restore: bool, names: &dyn Resolve) -> Result<Invocation, Exit> {
    let program = argv.first().map(String::as_str).unwrap_or("ipvsadm");
    let mut p = Popt::new(argv);
    let first = match p.next_opt() {
        Some(Ok((tag, arg))) => (tag, arg),
        _ => return Err(tryhelp(program)),
    };
    let mut c = Command {
        cmd: Cmd::List,
        options: 0,
        service: None,
        scheduler: None,
        persistent: None,
        netmask: IpAddr::V4(Ipv4Addr::BROADCAST),
        sched_flags: 0,
        dest: None,
        fwd: Fwd::Droute,
        tun_type: 0,
        tun_port: None,
        weight: 1,
        format: Format::default(),
        timeouts: None,
        set_timeout: None,
    };
    c.cmd = match first {
        (Tag::Cmd(cmd), arg) => {
            if let Some(a) = arg {
                if a != "master" && a != "backup" {
                    return Err(fail(if cmd == Cmd::StartDaemon {
                        "illegal start-daemon parameter specified"
                    } else {
                        "illegal start_daemon specified"
                    }));
                }
            }
            cmd
        }
        (Tag::Help, _) => return Ok(Invocation::Help),
        (Tag::Version, _) => return Ok(Invocation::Version),
        _ => return Err(tryhelp(program)),
    };
    let mut svc_port_given = false;
    let mut svc_proto = Proto::Tcp;
    let mut dest_port: Option<u16> = None;
    let mut sched_flags_arg: Option<String> = None;
    let set = set_option;
    // An output option: the option, then its format flag.
    let output = |c: &mut Command, o: usize, flag: fn(&mut Format) -> &mut bool| {
        set_option(&mut c.options, o)?;
        *flag(&mut c.format) = true;
        Ok::<(), Exit>(())
    };
    loop {
        let (tag, arg) = match p.next_opt() {
            None => break,
            Some(Ok(x)) => x,
            Some(Err(e)) => {
                return Err(Exit {
                    status: 255,
                    message: format!("{}: {}", p.bad_option(), e.text()),
                })
            }
        };
        let a = arg.unwrap_or_default();
        match tag {
            Tag::Tcp | Tag::Udp | Tag::Sctp => {
                set(&mut c.options, optc::SERVICE)?;
                svc_proto = match tag {
                    Tag::Tcp => Proto::Tcp,
                    Tag::Udp => Proto::Udp,
                    _ => Proto::Sctp,
                };
                let (addr, port) = parse_service(a, svc_proto, names)
                    .ok_or_else(|| fail("illegal virtual server address[:port] specified"))?;
                svc_port_given = port.is_some();
                c.service = Some(Service::Addr(svc_proto, addr, port.unwrap_or(0)));
            }
            Tag::Fwmark => {
                set(&mut c.options, optc::SERVICE)?;
                let mark = number(a, 1, i64::from(u32::MAX))
                    .ok_or_else(|| fail(format!("invalid fwmark value `{a}' specified")))?;
                c.service = Some(Service::Fwmark(mark as u32));
            }
            Tag::Scheduler => {
                set(&mut c.options, optc::SCHEDULER)?;
                // IP_VS_SCHEDNAME_MAXLEN - 1.
                c.scheduler = Some(a.chars().take(15).collect());
            }
            Tag::Persistent => {
                set(&mut c.options, optc::PERSISTENT)?;
                c.persistent = Some(match arg {
                    None => DEFAULT_PERSISTENT_TIMEOUT,
                    Some(v) => number(v, 1, i64::from(MAX_TIMEOUT))
                        .ok_or_else(|| fail(format!("invalid timeout value `{v}' specified")))?
                        as u32,
                });
            }
            Tag::Netmask => {
                set(&mut c.options, optc::NETMASK)?;
                // ipvsadm reads -M by the family of the service given
                // before it: a prefix length for IPv6.
                c.netmask =
                    if matches!(c.service, Some(Service::Addr(_, IpAddr::V6(_), _))) {
                        let len = number(a, 1, 128)
                            .ok_or_else(|| fail("illegal ipv6 netmask specified"))?;
                        IpAddr::V6(xvs_config::prefix_mask6(len as u8))
                    } else {
                        IpAddr::V4(inet_aton(a).or_else(|| names.host(a)).ok_or_else(|| {
                            fail("illegal virtual server persistent mask specified")
                        })?)
                    };
            }
            Tag::Real => {
                set(&mut c.options, optc::SERVER)?;
                let (addr, port) = parse_service(a, svc_proto, names)
                    .ok_or_else(|| fail("illegal real server address[:port] specified"))?;
                dest_port = port;
                c.dest = Some((addr, 0));
            }
            Tag::Ipip => {
                set(&mut c.options, optc::FORWARD)?;
                c.fwd = Fwd::Tunnel;
            }
            Tag::Gatewaying => {
                set(&mut c.options, optc::FORWARD)?;
                c.fwd = Fwd::Droute;
            }
            Tag::Masq => {
                set(&mut c.options, optc::FORWARD)?;
                c.fwd = Fwd::Masq;
            }
            Tag::Weight => {
                set(&mut c.options, optc::WEIGHT)?;
                c.weight =
                    number(a, 0, 65535).ok_or_else(|| fail("illegal weight specified"))? as u32;
            }
            Tag::UThreshold => {
                set(&mut c.options, optc::UTHRESHOLD)?;
                number(a, 0, i64::from(i32::MAX))
                    .ok_or_else(|| fail("illegal u_threshold specified"))?;
            }
            Tag::LThreshold => {
                set(&mut c.options, optc::LTHRESHOLD)?;
                number(a, 0, i64::from(i32::MAX))
                    .ok_or_else(|| fail("illegal l_threshold specified"))?;
            }
            Tag::Connection => set(&mut c.options, optc::CONNECTION)?,
            Tag::Numeric => output(&mut c, optc::NUMERIC, |f| &mut f.numeric)?,
            Tag::McastInterface => set(&mut c.options, optc::MCAST)?,
            Tag::Syncid => {
                set(&mut c.options, optc::SYNCID)?;
                number(a, 0, 255).ok_or_else(|| fail("illegal syncid specified"))?;
            }
            Tag::Timeout => set(&mut c.options, optc::TIMEOUT)?,
            Tag::Daemon => set(&mut c.options, optc::DAEMON)?,
            Tag::Stats => output(&mut c, optc::STATS, |f| &mut f.stats)?,
            Tag::Rate => output(&mut c, optc::RATE, |f| &mut f.rate)?,
            Tag::Thresholds => output(&mut c, optc::THRESHOLDS, |f| &mut f.thresholds)?,
            Tag::PersistentConn => {
                output(&mut c, optc::PERSISTENTCONN, |f| &mut f.persistent_conn)?
            }
            Tag::NoSort => output(&mut c, optc::NOSORT, |f| &mut f.nosort)?,
            Tag::Sort => {}
            Tag::Exact => output(&mut c, optc::EXACT, |f| &mut f.exact)?,
            Tag::Ipv6 => {
                if !matches!(c.service, Some(Service::Fwmark(_))) {
                    // ipvsadm's message ends with a newline of its own.
                    return Err(fail("-6 used before -f\n"));
                }
            }
            Tag::Ops => set(&mut c.options, optc::ONEPACKET)?,
            Tag::Pe => set(&mut c.options, optc::PE)?,
            Tag::SchedFlags => {
                set(&mut c.options, optc::SCHED_FLAGS)?;
                // sched_flags_arg[128].
                sched_flags_arg = Some(a.chars().take(127).collect());
            }
            Tag::McastGroup => {
                set(&mut c.options, optc::MCAST_GROUP)?;
                let ok = if a.contains(':') {
                    a.parse::<std::net::Ipv6Addr>()
                        .is_ok_and(|g| g.is_multicast())
                } else {
                    a.parse::<Ipv4Addr>().is_ok_and(|g| g.is_multicast())
                };
                if !ok {
                    let fam = if a.contains(':') { "IPv6" } else { "IPv4" };
                    return Err(fail(format!("invalid {fam} mcast-group `{a}'")));
                }
            }
            Tag::McastPort => {
                set(&mut c.options, optc::MCAST_PORT)?;
                number(a, 1, 65535).ok_or_else(|| fail("illegal mcast-port specified"))?;
            }
            Tag::McastTtl => {
                set(&mut c.options, optc::MCAST_TTL)?;
                number(a, 1, 255).ok_or_else(|| fail("illegal mcast-ttl specified"))?;
            }
            Tag::SyncMaxlen => {
                set(&mut c.options, optc::SYNC_MAXLEN)?;
                number(a, 1, 65535 - 20 - 8)
                    .ok_or_else(|| fail("illegal sync-maxlen specified"))?;
            }
            Tag::TunInfo => output(&mut c, optc::TUN_INFO, |f| &mut f.tun_info)?,
            Tag::TunType => {
                set(&mut c.options, optc::TUN_TYPE)?;
                c.tun_type = TUN_NAMES
                    .iter()
                    .position(|n| *n == a)
                    .ok_or_else(|| fail("illegal tunnel type specified"))?;
            }
            Tag::TunPort => {
                set(&mut c.options, optc::TUN_PORT)?;
                c.tun_port = Some(
                    number(a, 1, 65535).ok_or_else(|| fail("illegal tunnel port specified"))?
                        as u16,
                );
            }
            Tag::TunNocsum => set(&mut c.options, optc::TUN_NOCSUM)?,
            Tag::TunCsum => set(&mut c.options, optc::TUN_CSUM)?,
            Tag::TunRemcsum => set(&mut c.options, optc::TUN_REMCSUM)?,
            Tag::Cmd(_) | Tag::Help | Tag::Version => {
                return Err(fail(format!("invalid option `{}'", p.bad_option())));
            }
        }
    }
    let mut left = p.leftovers.iter();
    if c.cmd == Cmd::Timeout {
        let (Some(a), Some(b), Some(d)) = (left.next(), left.next(), left.next()) else {
            return Err(fail("--set option requires 3 timeout values"));
        };
        let t = |v: &str| {
            number(v, 0, i64::from(MAX_TIMEOUT))
                .map(|n| n as u32)
                .ok_or_else(|| fail(format!("invalid timeout value `{v}' specified")))
        };
        c.timeouts = Some([t(a)?, t(b)?, t(d)?]);
    }
    if c.cmd == Cmd::SetTimeout {
        let (Some(state), Some(secs)) = (left.next(), left.next()) else {
            return Err(fail(
                "--set-timeout requires a state and a number of seconds",
            ));
        };
        c.set_timeout = Some((state.to_string(), secs.to_string()));
    }
    if let Some(extra) = left.next() {
        return Err(fail(format!("unexpected argument {extra}")));
    }
    if let Some(arg) = &sched_flags_arg {
        c.sched_flags = parse_sched_flags(c.scheduler.as_deref(), arg)?;
    }
    generic_opt_check(c.cmd, c.options)?;
    if matches!(c.cmd, Cmd::Add | Cmd::Edit) {
        let port0 = matches!(c.service, Some(Service::Addr(_, _, 0)));
        if port0 && c.persistent.is_none() {
            return Err(fail("Zero port specified for non-persistent service"));
        }
        if c.has(optc::ONEPACKET) && !matches!(c.service, Some(Service::Addr(Proto::Udp, ..))) {
            let fwmark = matches!(c.service, Some(Service::Fwmark(_)));
            if !fwmark {
                return Err(fail(
                    "One-Packet Scheduling is only for UDP virtual services",
                ));
            }
        }
        if c.scheduler.as_deref().is_none_or(str::is_empty) {
            c.scheduler = Some("wlc".into());
        }
    }
    if matches!(c.cmd, Cmd::AddDest | Cmd::EditDest) {
        let (svc_af6, svc_port) = match c.service {
            Some(Service::Addr(_, a, port)) => (a.is_ipv6(), Some(port)),
            _ => (false, None),
        };
        if let Some((addr, port)) = &mut c.dest {
            // "copy vport to dport if not specified", and always for -g/-i
            // (not for firewall-mark services).
            *port = dest_port.unwrap_or(svc_port.unwrap_or(0));
            if let Some(sp) = svc_port {
                if c.fwd != Fwd::Masq {
                    *port = sp;
                }
            }
            if addr.is_ipv6() != svc_af6 && c.fwd != Fwd::Tunnel {
                return Err(fail(
                    "Different address family is allowed only for tunneling servers",
                ));
            }
        }
        let tun_opts = [
            optc::TUN_TYPE,
            optc::TUN_PORT,
            optc::TUN_NOCSUM,
            optc::TUN_CSUM,
            optc::TUN_REMCSUM,
        ];
        if tun_opts.iter().any(|&o| c.has(o)) && c.fwd != Fwd::Tunnel {
            return Err(fail("Tunnel options conflict with forward method"));
        }
        tunnel_opt_check(c.tun_type, c.options)?;
    } else if let Some((_, port)) = &mut c.dest {
        *port = dest_port.unwrap_or(match c.service {
            Some(Service::Addr(_, _, p)) => p,
            _ => 0,
        });
    }
    if c.cmd == Cmd::List {
        let o = |x: usize| c.has(x);
        if ((o(optc::CONNECTION) || o(optc::TIMEOUT) || o(optc::DAEMON))
            && (o(optc::STATS) || o(optc::RATE) || o(optc::THRESHOLDS)))
            || ((o(optc::TIMEOUT) || o(optc::DAEMON)) && o(optc::PERSISTENTCONN))
        {
            return Err(fail("options conflicts in the list command"));
        }
    }
    if c.cmd == Cmd::Restore && in_restore {
        return Err(tryhelp(program));
    }
    let _ = svc_port_given;
    Ok(Invocation::Run(c))
}

/// Why xvs does not do what a valid ipvsadm command line asks, if it
/// does not: `OPTION: not supported by xvs: WHY` (exit status 2), or
/// the forwarding-method message.
pub fn unsupported(c: &Command) -> Option<Exit> {
    let no = |what: &str, why: &str| Some(fail(format!("{what}: not supported by xvs: {why}")));
    match c.cmd {
        Cmd::StartDaemon | Cmd::StopDaemon => {
            return no(
                &format!("--{}", c.cmd.name()),
                "flow sync runs from the config file's [cluster.sync] (its state: -L --daemon; a takeover: --takeover)",
            )
        }
        Cmd::List if c.has(optc::PERSISTENTCONN) => {
            return no(
                "--persistent-conn",
                "persistence templates are not counted per real server",
            )
        }
        _ => {}
    }
    match c.service {
        Some(Service::Fwmark(_)) => {
            return no(
                "-f",
                "services are addresses and ports (no firewall-mark services)",
            )
        }
        Some(Service::Addr(Proto::Sctp, ..)) => {
            return no("--sctp-service", "TCP and UDP services only")
        }
        _ => {}
    }
    let options: [(usize, &str, &str); 5] = [
        (
            optc::UTHRESHOLD,
            "-x",
            "no connection thresholds on real servers",
        ),
        (
            optc::LTHRESHOLD,
            "-y",
            "no connection thresholds on real servers",
        ),
        (
            optc::ONEPACKET,
            "-o",
            "no one-packet scheduling (every UDP flow is tracked)",
        ),
        (optc::PE, "--pe", "no persistence engines (sip)"),
        (optc::SYNCID, "--syncid", "the sync id is [cluster.sync] id"),
    ];
    for (o, name, why) in options {
        if c.has(o) {
            return no(name, why);
        }
    }
    if matches!(c.cmd, Cmd::AddDest | Cmd::EditDest) && c.fwd == Fwd::Tunnel {
        if TUN_NAMES[c.tun_type] == "gre" {
            return Some(fail(
                "--tun-type gre: xvs tunnels with ipip or gue (GRE is not done)",
            ));
        }
        if let Some(p) = c.tun_port.filter(|&p| p != xvs_config::DEFAULT_GUE_PORT) {
            return Some(fail(format!(
                "--tun-port {p}: xvs sends GUE to one port for every real server (tunnel.gue_port, {})",
                xvs_config::DEFAULT_GUE_PORT
            )));
        }
        if c.has(optc::TUN_CSUM) || c.has(optc::TUN_REMCSUM) {
            return Some(fail(
                "--tun-csum/--tun-remcsum: xvs sends GUE over IPv4 without a UDP checksum (--tun-nocsum)",
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A hosts file and a services file.
    struct Names(HashMap<&'static str, Ipv4Addr>, HashMap<&'static str, u16>);

    impl Resolve for Names {
        fn host(&self, name: &str) -> Option<Ipv4Addr> {
            self.0.get(name).copied()
        }
        fn service(&self, name: &str, _: Proto) -> Option<u16> {
            self.1.get(name).copied()
        }
    }

    fn names() -> Names {
        Names(
            [("web.example.net", Ipv4Addr::new(198, 19, 0, 1))].into(),
            [("http", 80), ("domain", 53)].into(),
        )
    }

    fn run(args: &[&str]) -> Result<Invocation, Exit> {
        let argv: Vec<String> = std::iter::once("ipvsadm")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        parse(&argv, false, &names())
    }

    fn cmd(args: &[&str]) -> Command {
        match run(args) {
            Ok(Invocation::Run(c)) => c,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn err(args: &[&str]) -> (u8, String) {
        match run(args) {
            Err(e) => (e.status, e.message),
            other => panic!("{args:?} was accepted: {other:?}"),
        }
    }

    /// A sample of each option (bit i), valid for any command.
    const SAMPLES: [&[&str]; 34] = [
        &["-n"],
        &["-c"],
        &["-t", "198.19.0.1:80"],
        &["-s", "rr"],
        &["-p", "60"],
        &["-M", "255.255.255.0"],
        &["-r", "198.18.1.10:80"],
        &["-m"],
        &["-w", "2"],
        &["-x", "10"],
        &["-y", "5"],
        &["--mcast-interface", "eth0"],
        &["--timeout"],
        &["--daemon"],
        &["--stats"],
        &["--rate"],
        &["--thresholds"],
        &["--persistent-conn"],
        &["--nosort"],
        &["--syncid", "1"],
        &["--exact"],
        &["-o"],
        &["--pe", "sip"],
        &["-b", "flag-1"],
        &["--mcast-group", "224.0.0.81"],
        &["--mcast-port", "8848"],
        &["--mcast-ttl", "1"],
        &["--sync-maxlen", "1472"],
        &["--tun-info"],
        &["--tun-type", "gue"],
        &["--tun-port", "6080"],
        &["--tun-nocsum"],
        &["--tun-csum"],
        &["--tun-remcsum"],
    ];

    fn command_words(c: Cmd) -> (Vec<&'static str>, Vec<&'static str>) {
        match c {
            Cmd::Add => (vec!["-A"], vec![]),
            Cmd::Edit => (vec!["-E"], vec![]),
            Cmd::Del => (vec!["-D"], vec![]),
            Cmd::Flush => (vec!["-C"], vec![]),
            Cmd::List => (vec!["-L"], vec![]),
            Cmd::AddDest => (vec!["-a"], vec![]),
            Cmd::DelDest => (vec!["-d"], vec![]),
            Cmd::EditDest => (vec!["-e"], vec![]),
            Cmd::Timeout => (vec!["--set"], vec!["900", "120", "300"]),
            Cmd::StartDaemon => (vec!["--start-daemon", "master"], vec![]),
            Cmd::StopDaemon => (vec!["--stop-daemon", "master"], vec![]),
            Cmd::Restore => (vec!["-R"], vec![]),
            Cmd::Save => (vec!["-S"], vec![]),
            Cmd::Zero => (vec!["-Z"], vec![]),
            Cmd::Reload | Cmd::SetTimeout => unreachable!(),
        }
    }

    /// The command with its compulsory options, except `skip`, plus
    /// `extra` options.
    fn line(c: Cmd, skip: Option<usize>, extra: &[usize]) -> Vec<&'static str> {
        let (head, tail) = command_words(c);
        let mut v = head;
        for (j, &cell) in c.row().iter().enumerate() {
            if cell == b'+' && Some(j) != skip {
                v.extend(SAMPLES[j]);
            }
        }
        for &j in extra {
            v.extend(SAMPLES[j]);
        }
        v.extend(tail);
        v
    }

    /// Whether a refusal is one of generic_opt_check's.
    fn is_table_error(message: &str) -> bool {
        message.starts_with("You need to supply")
            || message.starts_with("Illegal '")
            || message.starts_with("The option '")
    }

    #[test]
    fn every_cell_of_commands_v_options() {
        let mut checked = 0;
        for c in Cmd::IPVSADM {
            let row = c.row();
            for (j, &cell) in row.iter().enumerate() {
                match cell {
                    b'x' => {
                        let args = line(c, None, &[j]);
                        assert_eq!(
                            err(&args),
                            (
                                2,
                                format!(
                                    "Illegal '{}' option with the '{}' command",
                                    OPT_NAMES[j],
                                    c.name()
                                )
                            ),
                            "{args:?}"
                        );
                    }
                    b'+' => {
                        let args = line(c, Some(j), &[]);
                        assert_eq!(
                            err(&args),
                            (
                                2,
                                format!(
                                    "You need to supply the '{}' option for the '{}' command",
                                    OPT_NAMES[j],
                                    c.name()
                                )
                            ),
                            "{args:?}"
                        );
                    }
                    b'1' => {
                        // With every other exclusive option after it.
                        for k in (j + 1)..34 {
                            if row[k] != b'1' {
                                continue;
                            }
                            let args = line(c, None, &[j, k]);
                            assert_eq!(
                                err(&args),
                                (
                                    2,
                                    format!(
                                        "The option '{}' conflicts with the '{}' option in the '{}' command",
                                        OPT_NAMES[k],
                                        OPT_NAMES[j],
                                        c.name()
                                    )
                                ),
                                "{args:?}"
                            );
                        }
                        let args = line(c, None, &[j]);
                        if let Err(e) = run(&args) {
                            assert!(!is_table_error(&e.message), "{args:?}: {e:?}");
                        }
                    }
                    b' ' => {
                        let args = line(c, None, &[j]);
                        if let Err(e) = run(&args) {
                            assert!(!is_table_error(&e.message), "{args:?}: {e:?}");
                        }
                    }
                    other => panic!("cell {other}"),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 14 * 34);
    }

    #[test]
    fn the_table_is_ipvsadm_s() {
        // Spot checks against ipvsadm.c's rows, read column by column.
        let cell = |c: Cmd, o: usize| c.row()[o];
        assert_eq!(cell(Cmd::List, optc::NUMERIC), b' ');
        assert_eq!(cell(Cmd::List, optc::CONNECTION), b'1');
        assert_eq!(cell(Cmd::List, optc::SERVICE), b'1');
        assert_eq!(cell(Cmd::List, optc::TIMEOUT), b'1');
        assert_eq!(cell(Cmd::List, optc::DAEMON), b'1');
        assert_eq!(cell(Cmd::List, optc::EXACT), b' ');
        assert_eq!(cell(Cmd::List, optc::ONEPACKET), b'x');
        assert_eq!(cell(Cmd::List, optc::TUN_INFO), b' ');
        assert_eq!(cell(Cmd::List, optc::TUN_TYPE), b'x');
        assert_eq!(cell(Cmd::Add, optc::PE), b' ');
        assert_eq!(cell(Cmd::Add, optc::SCHED_FLAGS), b' ');
        assert_eq!(cell(Cmd::Add, optc::MCAST_GROUP), b'x');
        assert_eq!(cell(Cmd::AddDest, optc::FORWARD), b' ');
        assert_eq!(cell(Cmd::AddDest, optc::LTHRESHOLD), b' ');
        assert_eq!(cell(Cmd::AddDest, optc::MCAST), b'x');
        assert_eq!(cell(Cmd::AddDest, optc::TUN_INFO), b'x');
        assert_eq!(cell(Cmd::AddDest, optc::TUN_TYPE), b' ');
        assert_eq!(cell(Cmd::AddDest, optc::TUN_REMCSUM), b' ');
        assert_eq!(cell(Cmd::StartDaemon, optc::MCAST), b' ');
        assert_eq!(cell(Cmd::StartDaemon, optc::SYNCID), b' ');
        assert_eq!(cell(Cmd::StartDaemon, optc::MCAST_GROUP), b' ');
        assert_eq!(cell(Cmd::StartDaemon, optc::SYNC_MAXLEN), b' ');
        assert_eq!(cell(Cmd::StartDaemon, optc::TUN_INFO), b'x');
        assert_eq!(cell(Cmd::StopDaemon, optc::SYNCID), b' ');
        assert_eq!(cell(Cmd::Save, optc::NUMERIC), b' ');
        assert_eq!(cell(Cmd::Zero, optc::SERVICE), b' ');
        let optional = |c: Cmd| c.row().iter().filter(|&&x| x != b'x').count();
        assert_eq!(optional(Cmd::Add), 7);
        assert_eq!(optional(Cmd::List), 13);
        assert_eq!(optional(Cmd::AddDest), 11);
        assert_eq!(optional(Cmd::Flush), 0);
    }

    #[test]
    fn flush_with_a_service_is_refused() {
        assert_eq!(
            err(&["-C", "-t", "198.19.0.1:80"]),
            (
                2,
                "Illegal 'service-address' option with the 'flush' command".into()
            )
        );
    }

    #[test]
    fn defaults_follow_ipvsadm_s_code() {
        let c = cmd(&["-A", "-t", "198.19.0.1:80", "-p"]);
        assert_eq!(c.persistent, Some(360));
        assert_eq!(c.scheduler.as_deref(), Some("wlc"));
        // -M without -p: the service stays non-persistent.
        let c = cmd(&["-A", "-t", "198.19.0.1:80", "-M", "255.255.255.0"]);
        assert_eq!(c.persistent, None);
        // -p takes the next word unless it is an option.
        let c = cmd(&["-A", "-t", "198.19.0.1:80", "-p", "-s", "rr"]);
        assert_eq!(
            (c.persistent, c.scheduler.as_deref()),
            (Some(360), Some("rr"))
        );
        let c = cmd(&["-A", "-t", "198.19.0.1:80", "-p", "120"]);
        assert_eq!(c.persistent, Some(120));
        // -a without a method is direct routing, with the service's port.
        let c = cmd(&["-a", "-t", "198.19.0.1:80", "-r", "198.18.1.10:8080"]);
        assert_eq!(c.fwd, Fwd::Droute);
        assert_eq!(c.dest, Some(("198.18.1.10".parse().unwrap(), 80)));
        assert_eq!(c.weight, 1);
        let c = cmd(&["-a", "-t", "198.19.0.1:80", "-r", "198.18.1.10:8080", "-m"]);
        assert_eq!(c.dest, Some(("198.18.1.10".parse().unwrap(), 8080)));
        let c = cmd(&["-a", "-t", "198.19.0.1:80", "-r", "198.18.1.10", "-m"]);
        assert_eq!(c.dest, Some(("198.18.1.10".parse().unwrap(), 80)));
    }

    #[test]
    fn popt_syntax() {
        // Bundles, attached arguments, --long=value.
        let c = cmd(&["-Ln"]);
        assert!(c.format.numeric);
        let c = cmd(&["-At198.19.0.1:80", "--scheduler=rr"]);
        assert_eq!(c.scheduler.as_deref(), Some("rr"));
        assert!(matches!(c.service, Some(Service::Addr(Proto::Tcp, _, 80))));
        // Names through the resolver.
        let c = cmd(&["-A", "-t", "web.example.net:http"]);
        assert_eq!(
            c.service,
            Some(Service::Addr(Proto::Tcp, "198.19.0.1".parse().unwrap(), 80))
        );
        // popt's own errors: 255.
        assert_eq!(
            err(&["-L", "--bogus"]),
            (255, "--bogus: unknown option".into())
        );
        assert_eq!(err(&["-A", "-t"]), (255, "-t: missing argument".into()));
        assert_eq!(
            err(&["-L", "--stats=yes"]),
            (255, "--stats=yes: option does not take an argument".into())
        );
        // The first option must be a command.
        assert_eq!(
            err(&["-t", "198.19.0.1:80", "-A"]),
            (
                255,
                "Try `ipvsadm -h' or 'ipvsadm --help' for more information.".into()
            )
        );
        assert_eq!(err(&["--bogus"]).0, 255);
        assert_eq!(err(&["list"]).0, 255);
        // A second command is an invalid option.
        assert_eq!(
            err(&["-A", "-a", "-t", "198.19.0.1:80"]),
            (2, "invalid option `-a'".into())
        );
        assert_eq!(
            err(&["-L", "extra"]),
            (2, "unexpected argument extra".into())
        );
        assert_eq!(
            err(&["-A", "-t", "198.19.0.1:80", "-s", "rr", "-s", "wlc"]),
            (2, "multiple 'scheduler' options specified".into())
        );
        assert_eq!(run(&["-h"]), Ok(Invocation::Help));
        assert_eq!(run(&["--version"]), Ok(Invocation::Version));
    }

    #[test]
    fn value_errors() {
        let t = |a: &[&str]| err(a).1;
        let cases: [(&[&str], &str); 16] = [
            (
                &["-A", "-t", "198.19.0.300:80"][..],
                "illegal virtual server address[:port] specified",
            ),
            (
                &["-A", "-t", "12345"][..],
                "illegal virtual server address[:port] specified",
            ),
            (
                &["-a", "-t", "198.19.0.1:80", "-r", "nowhere", "-m"][..],
                "illegal real server address[:port] specified",
            ),
            (
                &[
                    "-a",
                    "-t",
                    "198.19.0.1:80",
                    "-r",
                    "198.18.1.1",
                    "-w",
                    "65536",
                ][..],
                "illegal weight specified",
            ),
            (
                &["-A", "-t", "198.19.0.1:80", "-p", "0"][..],
                "invalid timeout value `0' specified",
            ),
            (
                &["-A", "-t", "198.19.0.1:80", "-M", "bad.mask"][..],
                "illegal virtual server persistent mask specified",
            ),
            (
                &["-A", "-t", "198.19.0.1:80", "-b", "sh-port"][..],
                "incompatible scheduler flag `sh-port'",
            ),
            (
                &["-A", "-t", "198.19.0.1:80", "-s", "sh", "-b", "sh-portx"][..],
                "invalid scheduler flag `sh-portx'",
            ),
            (
                &["-A", "-t", "198.19.0.1"][..],
                "Zero port specified for non-persistent service",
            ),
            (
                &["-L", "-c", "--stats"][..],
                "options conflicts in the list command",
            ),
            (
                &["--set", "900", "120"][..],
                "--set option requires 3 timeout values",
            ),
            (
                &["--set", "900", "120", "x"][..],
                "invalid timeout value `x' specified",
            ),
            (
                &["-f", "0", "-A"][..],
                "Try `ipvsadm -h' or 'ipvsadm --help' for more information.",
            ),
            (&["-A", "-f", "0"][..], "invalid fwmark value `0' specified"),
            (
                &[
                    "-a",
                    "-t",
                    "198.19.0.1:80",
                    "-r",
                    "198.18.1.1",
                    "-m",
                    "--tun-type",
                    "gue",
                ][..],
                "Tunnel options conflict with forward method",
            ),
            (
                &[
                    "-a",
                    "-t",
                    "198.19.0.1:80",
                    "-r",
                    "198.18.1.1",
                    "-i",
                    "--tun-port",
                    "1",
                ][..],
                "Illegal 'tun-port' option with the 'ipip' tunnel type",
            ),
        ];
        for (args, message) in cases {
            assert_eq!(t(args), message, "{args:?}");
        }
        let c = cmd(&[
            "-A",
            "-t",
            "198.19.0.1:80",
            "-s",
            "sh",
            "-b",
            "sh-port,sh-fallback",
        ]);
        assert_eq!(c.sched_flags, SCHED1 | SCHED2);
        assert_eq!(t(&["-R", "-R"]), "invalid option `-R'");
    }

    #[test]
    fn restore_lines_cannot_restore() {
        let argv: Vec<String> = ["ipvsadm", "-R"].iter().map(|s| s.to_string()).collect();
        assert_eq!(parse(&argv, true, &names()).unwrap_err().status, 255);
    }

    #[test]
    fn xvs_refuses_what_it_does_not_do_after_ipvsadm_s_checks() {
        let why = |a: &[&str]| unsupported(&cmd(a)).map(|e| (e.status, e.message));
        // -g (also what -a without a method means), -i, -m: all done.
        for m in [
            &[][..],
            &["-g"],
            &["-m"],
            &["-i"],
            &["-i", "--tun-type", "gue", "--tun-port", "6080"],
        ] {
            let mut a = vec!["-a", "-t", "198.19.0.1:80", "-r", "198.18.1.10"];
            a.extend_from_slice(m);
            assert_eq!(why(&a), None, "{m:?}");
        }
        assert_eq!(
            why(&[
                "-a",
                "-t",
                "198.19.0.1:80",
                "-r",
                "198.18.1.10",
                "-i",
                "--tun-type",
                "gre"
            ]),
            Some((
                2,
                "--tun-type gre: xvs tunnels with ipip or gue (GRE is not done)".into()
            ))
        );
        assert_eq!(
            why(&["-a", "-t", "198.19.0.1:80", "-r", "198.18.1.10", "-i", "--tun-type", "gue", "--tun-port", "7000"]),
            Some((2, "--tun-port 7000: xvs sends GUE to one port for every real server (tunnel.gue_port, 6080)".into()))
        );
        assert!(why(&["-A", "-f", "1"])
            .unwrap()
            .1
            .starts_with("-f: not supported by xvs: "));
        assert!(why(&["-A", "--sctp-service", "198.19.0.1:80"])
            .unwrap()
            .1
            .starts_with("--sctp-service: not supported by xvs"));
        assert_eq!(why(&["-A", "-t", "[2001:2::1]:80"]), None, "IPv6 is served");
        assert!(why(&[
            "-a",
            "-t",
            "198.19.0.1:80",
            "-r",
            "198.18.1.10",
            "-m",
            "-x",
            "5"
        ])
        .unwrap()
        .1
        .starts_with("-x: not supported by xvs"));
        assert!(why(&["--start-daemon", "master"])
            .unwrap()
            .1
            .starts_with("--start-daemon: not supported by xvs"));
        assert_eq!(
            why(&["-a", "-t", "198.19.0.1:80", "-r", "198.18.1.10", "-m"]),
            None
        );
        assert_eq!(why(&["-L", "--daemon"]), None);
        assert_eq!(why(&["-L", "--thresholds"]), None);
    }

    #[test]
    fn inet_aton_takes_what_ipvsadm_takes() {
        assert_eq!(inet_aton("198.19.0.1"), Some(Ipv4Addr::new(198, 19, 0, 1)));
        assert_eq!(inet_aton("0xc6.19.0.1"), Some(Ipv4Addr::new(198, 19, 0, 1)));
        assert_eq!(inet_aton("198.19.1"), Some(Ipv4Addr::new(198, 19, 0, 1)));
        assert_eq!(inet_aton("010.0.0.1"), Some(Ipv4Addr::new(8, 0, 0, 1)));
        assert_eq!(inet_aton("198.19.0.256"), None);
        assert_eq!(inet_aton("web"), None);
        assert_eq!(inet_aton(""), None);
    }

    #[test]
    fn ipv6_services_and_real_servers_in_brackets_and_prefix_length_masks() {
        let c = cmd(&[
            "-A",
            "-t",
            "[2001:2:ff::1]:80",
            "-s",
            "mh",
            "-p",
            "60",
            "-M",
            "64",
        ]);
        let v6: std::net::Ipv6Addr = "2001:2:ff::1".parse().unwrap();
        assert_eq!(
            c.service,
            Some(Service::Addr(Proto::Tcp, IpAddr::V6(v6), 80))
        );
        assert_eq!(c.netmask, IpAddr::V6(xvs_config::prefix_mask6(64)));
        // A mask for an IPv6 service is a prefix length, as ipvsadm reads it.
        assert_eq!(
            err(&["-A", "-t", "[2001:2:ff::1]:80", "-p", "60", "-M", "129"]).1,
            "illegal ipv6 netmask specified"
        );
        let c = cmd(&[
            "-a",
            "-u",
            "[2001:2:ff::1]:53",
            "-r",
            "[2001:2:0:1::10]:5353",
            "-m",
            "-w",
            "3",
        ]);
        let b: std::net::Ipv6Addr = "2001:2:0:1::10".parse().unwrap();
        assert_eq!(c.dest, Some((IpAddr::V6(b), 5353)));
        assert_eq!(unsupported(&c).map(|e| e.message), None);
        // ipvsadm's own refusal of mixed families stays.
        assert_eq!(
            err(&[
                "-a",
                "-t",
                "[2001:2:ff::1]:80",
                "-r",
                "198.18.1.10:80",
                "-m"
            ])
            .1,
            "Different address family is allowed only for tunneling servers"
        );
    }
}
