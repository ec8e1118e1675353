//! Who may reach a backend's store Pods (docs/isolation.md): the NetworkPolicies the operator
//! keeps beside the leader and the members, following the Bindings.
//!
//! - The leader's RPC port (50051): the backend's own Pods and the Pods of the namespaces that
//!   hold a Binding to a pool on the backend (their engines put and get through the master).
//! - The leader's admin port (9003: `/metrics`, `/health` and the tenant ledger's
//!   `/api/v1/tenant_quotas`, one port in Mooncake 0.3.13): the operator's Pods, the addresses
//!   `--store-admin-from` names (an operator that runs outside a Pod) and the namespaces
//!   `--store-metrics-from` names: an explicit grant of the admin API, ledger writes included
//!   (the port is shared). Prometheus needs none: the operator re-exports the masters' series
//!   ([`crate::store_series`]).
//! - The members, every port: the transfer engine dials its peers on ports it picks, so the
//!   policy selects peers, not ports (the backend's own Pods and the bound namespaces).
//!
//! A member group on the host network (an RDMA fabric) is not covered by any NetworkPolicy: its
//! Pods carry the node's address. [`uncovered_groups`] names them for the backend's status.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;

use super::{ADMIN_PORT, RPC_PORT, meta};
use crate::names::{self, backend_labels, backend_selector};

/// The labels every operator Pod carries (`deploy/operator.yaml`, the Helm chart).
pub const OPERATOR_POD_LABELS: [(&str, &str); 1] = [("app.kubernetes.io/name", "kvcache-operator")];

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
    let mut admin_peers = vec![NetworkPolicyPeer {
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
    admin_peers.extend(access.admin_from.iter().map(|cidr| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.clone(),
            except: None,
        }),
        ..Default::default()
    }));
    admin_peers.extend(namespaces(&access.metrics_from));
    let leader = policy(
        b,
        namespace,
        &names::object(backend, "leader"),
        backend_labels(backend, "leader"),
        LabelSelector {
            match_labels: Some(backend_selector(backend, "leader")),
            ..Default::default()
        },
        vec![
            rule(store_peers.clone(), Some(RPC_PORT)),
            rule(admin_peers, Some(ADMIN_PORT)),
        ],
    );
    let mut out = vec![leader];
    let covered: Vec<String> = daemon_sets
        .iter()
        .filter(|d| !on_host_network(d))
        .filter_map(component)
        .collect();
    if !covered.is_empty() {
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
                    values: Some(covered),
                }]),
            },
            vec![rule(store_peers, None)],
        ));
    }
    out
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

fn rule(from: Vec<NetworkPolicyPeer>, port: Option<i32>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(from),
        ports: port.map(|n| {
            vec![NetworkPolicyPort {
                port: Some(IntOrString::Int(n)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]
        }),
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
