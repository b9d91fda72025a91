//! The on-disk shape of `/etc/xvs/xvs.toml`, as serde reads it: every field
//! the operator can write, each with its source span so validation can point
//! at it. Nothing here is trusted; [`crate::validate`] turns it into the
//! model.
//!
//! Numbers are read as `i64` (TOML's integer) and range-checked by
//! validation, so an out-of-range value gets the project's message, not
//! serde's. Addresses, ranges and paths are read as strings for the same
//! reason. Unknown keys are rejected everywhere (`deny_unknown_fields`): a
//! typo must not silently become a default.

use serde::Deserialize;
use toml::Spanned;

use crate::names::{
    ArmMode, CheckKind, Encap, ForwardMethod, PollMode, Protocol, Scheduler, SchedulerFlag,
};
use crate::names::{Steering, UnknownPort, XdpAttachMode, ZeroCopy};

pub(crate) type Sp<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    pub(crate) interfaces: Option<Sp<RawInterfaces>>,
    pub(crate) snat: Option<Sp<RawSnat>>,
    #[serde(default)]
    pub(crate) conntrack: RawConntrack,
    #[serde(default)]
    pub(crate) vips: RawVips,
    #[serde(default)]
    pub(crate) admin: RawAdmin,
    #[serde(default)]
    pub(crate) kubernetes: RawKubernetes,
    #[serde(default)]
    pub(crate) restart: RawRestart,
    #[serde(default)]
    pub(crate) tunnel: RawTunnel,
    #[serde(default)]
    pub(crate) cluster: RawCluster,
    #[serde(default)]
    pub(crate) services: Vec<Sp<RawService>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInterfaces {
    pub(crate) mode: Option<ArmMode>,
    pub(crate) client: Sp<String>,
    pub(crate) backend: Option<Sp<String>>,
    pub(crate) queues: Option<Sp<Vec<Sp<i64>>>>,
    pub(crate) cores: Option<Sp<Vec<Sp<i64>>>>,
    pub(crate) poll: Option<PollMode>,
    pub(crate) steering: Option<Steering>,
    pub(crate) xdp_mode: Option<XdpAttachMode>,
    pub(crate) zero_copy: Option<ZeroCopy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSnat {
    pub(crate) addresses: Sp<Vec<Sp<String>>>,
    pub(crate) ports: Option<Sp<String>>,
    pub(crate) worker_ports: Option<Sp<Vec<Sp<String>>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConntrack {
    pub(crate) capacity: Option<Sp<i64>>,
    pub(crate) conn_reuse_mode: Option<bool>,
    pub(crate) expire_nodest_conn: Option<bool>,
    pub(crate) expire_quiescent_template: Option<bool>,
    #[serde(default)]
    pub(crate) timeouts: RawTimeouts,
}

/// Field names double as the keys of the `[conntrack.timeouts]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTimeouts {
    pub(crate) established: Option<Sp<i64>>,
    pub(crate) syn_sent: Option<Sp<i64>>,
    pub(crate) syn_recv: Option<Sp<i64>>,
    pub(crate) fin_wait: Option<Sp<i64>>,
    pub(crate) time_wait: Option<Sp<i64>>,
    pub(crate) close: Option<Sp<i64>>,
    pub(crate) close_wait: Option<Sp<i64>>,
    pub(crate) last_ack: Option<Sp<i64>>,
    pub(crate) synack: Option<Sp<i64>>,
    pub(crate) udp: Option<Sp<i64>>,
    pub(crate) icmp: Option<Sp<i64>>,
    pub(crate) syn_recv_pressure: Option<Sp<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVips {
    pub(crate) unknown_port: Option<UnknownPort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub(crate) socket: Option<Sp<String>>,
    pub(crate) tcp: Option<Sp<String>>,
    pub(crate) token_file: Option<Sp<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKubernetes {
    pub(crate) enabled: Option<bool>,
    pub(crate) kubeconfig: Option<Sp<String>>,
    pub(crate) service_proxy_name: Option<Sp<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRestart {
    pub(crate) hold: Option<Sp<String>>,
    pub(crate) state_dir: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawService {
    pub(crate) name: Option<String>,
    pub(crate) vip: Sp<String>,
    pub(crate) protocol: Option<Protocol>,
    pub(crate) port: Sp<i64>,
    pub(crate) scheduler: Option<Sp<Scheduler>>,
    pub(crate) flags: Option<Sp<Vec<Sp<SchedulerFlag>>>>,
    pub(crate) persistence: Option<Sp<RawPersistence>>,
    #[serde(default)]
    pub(crate) source_ranges: Vec<Sp<String>>,
    pub(crate) maglev_table_size: Option<Sp<i64>>,
    #[serde(default)]
    pub(crate) backends: Vec<Sp<RawBackend>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPersistence {
    pub(crate) timeout: Option<Sp<i64>>,
    pub(crate) netmask: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    pub(crate) address: Sp<String>,
    pub(crate) port: Option<Sp<i64>>,
    pub(crate) weight: Option<Sp<i64>>,
    pub(crate) forward: Option<ForwardMethod>,
    pub(crate) encap: Option<Encap>,
    pub(crate) check: Option<Sp<RawCheck>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCheck {
    pub(crate) kind: Option<CheckKind>,
    pub(crate) port: Option<Sp<i64>>,
    pub(crate) interval: Option<Sp<String>>,
    pub(crate) timeout: Option<Sp<String>>,
    pub(crate) rise: Option<Sp<i64>>,
    pub(crate) fall: Option<Sp<i64>>,
    pub(crate) http_path: Option<Sp<String>>,
    pub(crate) expect_status: Option<Sp<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTunnel {
    pub(crate) source: Option<Sp<String>>,
    pub(crate) source6: Option<Sp<String>>,
    pub(crate) client_source_net: Option<Sp<String>>,
    pub(crate) gue_port: Option<Sp<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub(crate) hash_seed: Option<Sp<i64>>,
    pub(crate) sync: Option<Sp<RawSync>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSync {
    pub(crate) node: Sp<i64>,
    pub(crate) id: Option<Sp<i64>>,
    pub(crate) listen: Sp<String>,
    pub(crate) peers: Sp<Vec<Sp<String>>>,
    pub(crate) key_file: Option<Sp<String>>,
    pub(crate) role: Option<crate::names::SyncRole>,
    pub(crate) peer_timeout: Option<Sp<String>>,
}
