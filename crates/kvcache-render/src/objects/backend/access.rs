//! Who may reach a backend's store Pods (docs/isolation.md): the NetworkPolicies the operator
//! keeps beside the leader and the members, following the Bindings. Each port is open to the
//! peers its work needs and to nobody else, co-tenants of a shared backend included.
//!
//! - The leader's RPC port (50051): the backend's own Pods and the Pods of the namespaces that
//!   hold a Binding to a pool on the backend (their engines put and get through the master).
//! - The leader's admin port (9003: `/metrics`, `/health` and the tenant ledger's
//!   `/api/v1/tenant_quotas`, one port in Mooncake 0.3.13): the operator's Pods, the addresses
//!   `--store-admin-from` names (an operator that runs outside a Pod) and the namespaces
//!   `--store-metrics-from` names: an explicit grant of the admin API, ledger writes included
//!   (the port is shared). Prometheus needs none: the operator re-exports the masters' series
//!   ([`crate::observe::store_series`]).
//! - The leader elector's port (8090, its `/identity`), with `memberAddressing: Lease`: the
//!   backend's own Pods, so that a member can ask who the master at the Lease's address is
//!   before it mounts there (`crates/kvcache-elector/src/member.rs`).
//! - The members' transfer ports: the backend's own Pods and the bound namespaces. The store's
//!   client reads and writes a member's segment through the member's transfer engine: its
//!   handshake listener and its TCP data listener, each picked at random in the range
//!   `MC_MIN_RPC_PORT`..`MC_MAX_RPC_PORT` (upstream `mooncake-transfer-engine/src/`
//!   `transfer_engine_impl.cpp` and `transport/tcp_transport/tcp_transport.cpp`, v0.3.12.post1,
//!   both through `findAvailableTcpPort`; `MC_HANDSHAKE_PORT` is not read with
//!   `P2PHANDSHAKE`). The render pins that range to eight ports ([`TRANSFER_PORTS`]) and the
//!   policy names them. A member never dials a client back (the client starts every read and
//!   write), so engines need no such port open.
//! - A member with a disk tier also serves the tier's reads on an offload RPC server that binds
//!   port 0, a port the kernel picks (upstream `mooncake-store/src/real_client.cpp`,
//!   v0.3.12.post1: `coro_rpc_server(1, 0, "0.0.0.0")`, no setting names it; a client reading a
//!   block held only on the tier calls it). It cannot be pinned, so those members admit the
//!   kernel's ephemeral range ([`EPHEMERAL_PORTS`]) from the same peers, still not the REST port.
//! - The members' REST port (`mc_store_rest_server`'s HTTP API, 8080 and up: put, get and remove
//!   as the member's tenant, `unmount_local_disk`): the operator's Pods and the
//!   `--store-admin-from` addresses, never a bound namespace. The member's own preStop hook
//!   calls it on loopback, which no policy filters.
//!
//! A member group on the host network (an RDMA fabric) is not covered by any NetworkPolicy: its
//! Pods carry the node's address. [`uncovered_groups`] names them for the backend's status.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::MemberAddressing;

use super::pod::{ADMIN_PORT, ELECTOR_PORT, RPC_PORT, meta};
pub use super::pod::{TRANSFER_PORT_ENV, TRANSFER_PORTS};
use crate::names::{self, backend_labels, backend_selector};

/// The labels every operator Pod carries (`deploy/operator.yaml`, the Helm chart).
pub(crate) const OPERATOR_POD_LABELS: [(&str, &str); 1] =
    [("app.kubernetes.io/name", "kvcache-operator")];

/// The ports the kernel picks from when a process binds port 0: Linux's default
/// `net.ipv4.ip_local_port_range`, which every new network namespace (a Pod's) starts with.
/// A member's disk-tier offload RPC server listens on one of them.
pub const EPHEMERAL_PORTS: (i32, i32) = (32768, 60999);

/// The range the store's transfer engine falls back to when its settings are absent or refused.
const STORE_DEFAULT_TRANSFER_PORTS: (i32, i32) = (15000, 17000);

/// A range of at most this many ports is written port by port (every enforcer matches those);
/// a longer one as one `port`..`endPort` entry.
const NAMED_PORTS_MAX: i32 = 16;

/// Who besides the backend's own Pods and its bound namespaces may reach a store: what the
/// operator's flags say about where it and the monitoring run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreAccess {
    /// Addresses (CIDRs) that reach the admin port besides the operator's Pods: an operator
    /// run outside a Pod (`--store-admin-from`).
    pub admin_from: Vec<String>,
    /// Namespaces whose Pods may reach the leader's admin port, `/metrics` and the tenant
    /// ledger alike (`--store-metrics-from`): an explicit grant of the admin API; none is
    /// needed for metrics, which the operator re-exports.
    pub metrics_from: Vec<String>,
}

impl StoreAccess {
    /// An operator in a Pod and no monitoring namespace: the flags' defaults.
    pub const IN_CLUSTER: StoreAccess = StoreAccess {
        admin_from: Vec::new(),
        metrics_from: Vec::new(),
    };
}

/// What a member Pod listens on beyond loopback, read from its DaemonSet as rendered (a group's
/// `extraEnv` included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPorts {
    /// `mc_store_rest_server`'s HTTP API (the container's `rest` port).
    pub rest: i32,
    /// First and last port of the range the transfer engine picks its handshake and TCP data
    /// listeners from.
    pub transfer: (i32, i32),
    /// Whether the disk tier's offload RPC server runs (`MOONCAKE_OFFLOAD_ENABLED`), on a port
    /// the kernel picks.
    pub offload_rpc: bool,
}

/// The ports of the member container of a member DaemonSet; `None` for a DaemonSet without
/// one.
pub fn member_ports(ds: &DaemonSet) -> Option<MemberPorts> {
    let container = member_container(ds)?;
    let rest = container
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == Some("rest"))?
        .container_port;
    let value = |name: &str| literal_env(container, name);
    // The store reads each end under its name, else under the old misspelt one.
    let min = value(TRANSFER_PORT_ENV[0]).or_else(|| value("MC_MIN_PRC_PORT"));
    let max = value(TRANSFER_PORT_ENV[1]).or_else(|| value("MC_MAX_PRC_PORT"));
    Some(MemberPorts {
        rest,
        transfer: transfer_port_range(min.as_deref(), max.as_deref()),
        offload_rpc: value("MOONCAKE_OFFLOAD_ENABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1"),
    })
}

/// The range the store's transfer engine picks its ports from, given the values of
/// `MC_MIN_RPC_PORT` and `MC_MAX_RPC_PORT` (`None`: unset). As the store reads them (upstream
/// `mooncake-transfer-engine/src/config.cpp`, v0.3.12.post1, `loadGlobalConfig` and
/// `ValidatePortRange`; the 0.3.13.post1 wheel's `engine.so` and `store.so` hold the same names
/// and messages): each value as C's `atoi`, an unset end at its default, and the whole range
/// back to 15000..17000 when an end is below 1024, above 65535 or among the kernel's ephemeral
/// ports, or the ends are reversed.
pub(crate) fn transfer_port_range(min: Option<&str>, max: Option<&str>) -> (i32, i32) {
    let (default_min, default_max) = STORE_DEFAULT_TRANSFER_PORTS;
    let min = min.map_or(i64::from(default_min), atoi);
    let max = max.map_or(i64::from(default_max), atoi);
    let valid = |p: i64| {
        (1024..=65535).contains(&p)
            && !(i64::from(EPHEMERAL_PORTS.0)..=i64::from(EPHEMERAL_PORTS.1)).contains(&p)
    };
    match (i32::try_from(min), i32::try_from(max)) {
        (Ok(lo), Ok(hi)) if valid(min) && valid(max) && lo <= hi => (lo, hi),
        _ => STORE_DEFAULT_TRANSFER_PORTS,
    }
}

/// C's `atoi` on the digits it reads: leading white space, an optional sign, then digits up to
/// the first other character (none: 0). Saturates where C's would be undefined.
fn atoi(text: &str) -> i64 {
    let t = text.trim_start();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let n = digits
        .bytes()
        .take_while(u8::is_ascii_digit)
        .fold(0_i64, |n, d| {
            n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
    if negative { -n } else { n }
}

/// The member container of a member DaemonSet (the first of its containers).
fn member_container(ds: &DaemonSet) -> Option<&Container> {
    ds.spec.as_ref()?.template.spec.as_ref()?.containers.first()
}

/// The literal value of `name` in `container`'s environment (the last entry of that name, as
/// the kubelet takes it); `None` when unset or set from a reference, which the policy cannot
/// read (the store's default then counts).
fn literal_env(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .as_ref()?
        .iter()
        .rev()
        .find(|e| e.name == name)?
        .value
        .clone()
}

/// `<backend>-leader` and `<backend>-members`: the policies of a managed backend's leader Pods
/// and of its member Pods not on the host network (none when every group is).
pub(super) fn store_policies(
    b: &KVCacheBackend,
    namespace: &str,
    backend: &str,
    bound_namespaces: &[String],
    access: &StoreAccess,
    daemon_sets: &[DaemonSet],
) -> Vec<NetworkPolicy> {
    let mut store_peers = vec![own_pods(backend)];
    store_peers.extend(namespaces(bound_namespaces));
    let operator = operator_peers(namespace, access);
    let mut admin_peers = operator.clone();
    admin_peers.extend(namespaces(&access.metrics_from));
    let mut leader_rules = vec![
        rule(store_peers.clone(), ports(&[(RPC_PORT, RPC_PORT)])),
        rule(admin_peers, ports(&[(ADMIN_PORT, ADMIN_PORT)])),
    ];
    if lease_addressed(b) {
        leader_rules.push(rule(
            vec![own_pods(backend)],
            ports(&[(ELECTOR_PORT, ELECTOR_PORT)]),
        ));
    }
    let leader = policy(
        b,
        namespace,
        &names::object(backend, "leader"),
        backend_labels(backend, "leader"),
        LabelSelector {
            match_labels: Some(backend_selector(backend, "leader")),
            ..Default::default()
        },
        leader_rules,
    );
    let mut out = vec![leader];
    let covered: Vec<(String, MemberPorts)> = daemon_sets
        .iter()
        .filter(|d| !on_host_network(d))
        .filter_map(|d| Some((component(d)?, member_ports(d)?)))
        .collect();
    if !covered.is_empty() {
        let (components, groups): (Vec<String>, Vec<MemberPorts>) = covered.into_iter().unzip();
        let mut transfer: Vec<(i32, i32)> = groups.iter().map(|g| g.transfer).collect();
        if groups.iter().any(|g| g.offload_rpc) {
            transfer.push(EPHEMERAL_PORTS);
        }
        let rest: Vec<(i32, i32)> = groups.iter().map(|g| (g.rest, g.rest)).collect();
        out.push(policy(
            b,
            namespace,
            &names::object(backend, "members"),
            backend_labels(backend, "member"),
            LabelSelector {
                match_labels: Some(own_selector(backend)),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "app.kubernetes.io/component".into(),
                    operator: "In".into(),
                    values: Some(components),
                }]),
            },
            vec![
                rule(store_peers, ports(&transfer)),
                rule(operator, ports(&rest)),
            ],
        ));
    }
    out
}

/// Whether members ask the leader elector who it is (`memberAddressing: Lease`, election on).
fn lease_addressed(b: &KVCacheBackend) -> bool {
    b.spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.effective_member_addressing() == MemberAddressing::Lease)
}

/// The operator: its Pods in its namespace (by [`OPERATOR_POD_LABELS`]) and the addresses
/// `--store-admin-from` names.
fn operator_peers(namespace: &str, access: &StoreAccess) -> Vec<NetworkPolicyPeer> {
    let mut peers = vec![NetworkPolicyPeer {
        namespace_selector: Some(names_in(&[namespace.to_owned()])),
        pod_selector: Some(LabelSelector {
            match_labels: Some(
                OPERATOR_POD_LABELS
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }];
    peers.extend(access.admin_from.iter().map(|cidr| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.clone(),
            except: None,
        }),
        ..Default::default()
    }));
    peers
}

/// The member DaemonSets (one per member group) whose Pods run on the host network, where no
/// NetworkPolicy reaches.
pub fn uncovered_groups(daemon_sets: &[DaemonSet]) -> Vec<String> {
    daemon_sets
        .iter()
        .filter(|d| on_host_network(d))
        .filter_map(|d| d.metadata.name.clone())
        .collect()
}

fn on_host_network(d: &DaemonSet) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.host_network)
        .unwrap_or(false)
}

fn component(d: &DaemonSet) -> Option<String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get("app.kubernetes.io/component"))
        .cloned()
}

/// Every Pod of the backend (leader, members, etcd): name and instance.
fn own_selector(backend: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            "kv-cache-backend".to_owned(),
        ),
        (
            "app.kubernetes.io/instance".to_owned(),
            names::label_value(backend),
        ),
    ])
}

fn own_pods(backend: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(own_selector(backend)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A selector of namespaces by name (`kubernetes.io/metadata.name`, which the API server sets).
fn names_in(namespaces: &[String]) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "In".into(),
            values: Some(namespaces.to_vec()),
        }]),
        ..Default::default()
    }
}

/// Every Pod of `namespaces`; none when the list is empty (an `In` of nothing is refused).
fn namespaces(namespaces: &[String]) -> Option<NetworkPolicyPeer> {
    (!namespaces.is_empty()).then(|| NetworkPolicyPeer {
        namespace_selector: Some(names_in(namespaces)),
        ..Default::default()
    })
}

/// The TCP ports of `ranges` (first and last, inclusive), each once, in order: a short range
/// port by port, a longer one as one `port`..`endPort` entry (an enforcer without `endPort`
/// would admit only its first port; the only such range rendered is [`EPHEMERAL_PORTS`]).
fn ports(ranges: &[(i32, i32)]) -> Vec<NetworkPolicyPort> {
    let mut single = BTreeSet::new();
    let mut long = BTreeSet::new();
    for &(first, last) in ranges {
        if last - first < NAMED_PORTS_MAX {
            single.extend(first..=last);
        } else {
            long.insert((first, last));
        }
    }
    // A port inside a long range needs no entry of its own.
    single.retain(|p| !long.iter().any(|(first, last)| (first..=last).contains(&p)));
    let tcp = |port: i32, end_port: Option<i32>| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        end_port,
        protocol: Some("TCP".into()),
    };
    single
        .into_iter()
        .map(|p| tcp(p, None))
        .chain(long.into_iter().map(|(first, last)| tcp(first, Some(last))))
        .collect()
}

fn rule(from: Vec<NetworkPolicyPeer>, ports: Vec<NetworkPolicyPort>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(ports),
    }
}

fn policy(
    b: &KVCacheBackend,
    namespace: &str,
    name: &str,
    labels: BTreeMap<String, String>,
    selects: LabelSelector,
    ingress: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata: meta(name, namespace, labels, b),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selects),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transfer_range_is_read_as_the_store_reads_it() {
        assert_eq!(transfer_port_range(None, None), (15000, 17000));
        assert_eq!(
            transfer_port_range(Some("15000"), Some("15007")),
            (15000, 15007)
        );
        assert_eq!(
            transfer_port_range(Some("20000"), Some("20000")),
            (20000, 20000)
        );
        // atoi: white space and a sign before, anything after the digits ignored.
        assert_eq!(
            transfer_port_range(Some(" +15100x"), Some("15101 ")),
            (15100, 15101)
        );
        // An unset end keeps its default.
        assert_eq!(transfer_port_range(Some("16000"), None), (16000, 17000));
        // Refused ranges fall back to the whole default, not to the valid end.
        for (min, max) in [
            ("abc", "15001"),
            ("80", "15001"),
            ("15000", "40000"),
            ("15001", "15000"),
            ("15000", "70000"),
            ("-15000", "15001"),
            ("99999999999999999999", "15001"),
        ] {
            assert_eq!(
                transfer_port_range(Some(min), Some(max)),
                (15000, 17000),
                "{min}..{max}"
            );
        }
        assert_eq!(
            transfer_port_range(Some("15000"), Some("18000")),
            (15000, 18000)
        );
    }

    #[test]
    fn short_ranges_are_named_port_by_port_and_long_ones_by_their_ends() {
        let seen = |ranges: &[(i32, i32)]| -> Vec<(i32, Option<i32>)> {
            ports(ranges)
                .into_iter()
                .map(|p| match p.port {
                    Some(IntOrString::Int(n)) => (n, p.end_port),
                    other => panic!("a port by number: {other:?}"),
                })
                .collect()
        };
        assert_eq!(
            seen(&[(15000, 15002), (15001, 15003), (8081, 8081), (8080, 8080)]),
            [
                (8080, None),
                (8081, None),
                (15000, None),
                (15001, None),
                (15002, None),
                (15003, None)
            ]
        );
        assert_eq!(
            seen(&[(15000, 15001), EPHEMERAL_PORTS, (40000, 40001)]),
            [(15000, None), (15001, None), (32768, Some(60999))]
        );
        assert_eq!(seen(&[(15000, 15015)]).len(), 16);
        assert_eq!(seen(&[(15000, 15016)]), [(15000, Some(15016))]);
        assert!(
            ports(&[(1, 1)])
                .iter()
                .all(|p| p.protocol.as_deref() == Some("TCP"))
        );
    }
}
