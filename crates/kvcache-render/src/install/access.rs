//! Who may connect to the operator's Pods ([`Access`], as set at install) and the
//! NetworkPolicy that admits them, with the comment the manifest carries above it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{METRICS_PORT, NAME, WEBHOOK_PORT, meta, selector_labels};

/// Who may connect to the operator's Pods, as set at install (Helm `controlPlaneCIDRs` and
/// `metricsFrom`; `cargo xtask manifests --control-plane-cidrs --metrics-from`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The address blocks the API server's calls come from (the control plane's addresses, as
    /// the operator's Pods see them). Empty: not known, and the webhook port stays open to
    /// every source, since no NetworkPolicy can name an API server on a host's network in
    /// general (docs/isolation.md#the-operators-own-pods says what to set per CNI).
    pub control_plane: Vec<String>,
    /// The namespaces whose Pods may read `/metrics` (Prometheus's).
    pub metrics_from: Vec<String>,
}

/// The namespace whose Pods may read the operator's `/metrics` when the install names none:
/// where kube-prometheus and the prometheus-operator's guides run Prometheus.
pub const DEFAULT_METRICS_NAMESPACE: &str = "monitoring";

impl Default for Access {
    fn default() -> Self {
        Access {
            control_plane: Vec::new(),
            metrics_from: vec![DEFAULT_METRICS_NAMESPACE.to_owned()],
        }
    }
}

/// One source a port admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// An address block (`ipBlock.cidr`).
    Block(String),
    /// Every Pod of a namespace, by its `kubernetes.io/metadata.name` label.
    Namespace(String),
}

/// Who may connect to one port of the operator's Pods. Connections from the Pod's own node
/// (the kubelet's probes) are not a NetworkPolicy's to refuse in the common enforcers
/// (kube-router, Calico, Cilium), so neither variant needs to name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Sources {
    /// Every source.
    Anyone,
    /// These sources alone; none: nothing but the Pod's own node.
    Only(Vec<Source>),
}

/// Which sources each port of the operator's Pods admits: the webhook port the control plane
/// (everyone when its addresses are not known); the metrics port the control plane (the API
/// server's Pod proxy, for whoever RBAC lets use it) and the Pods of the monitoring namespaces.
pub(crate) fn admitted(access: &Access) -> Vec<(i32, Sources)> {
    let control_plane = access
        .control_plane
        .iter()
        .map(|c| Source::Block(c.clone()));
    let webhook = if access.control_plane.is_empty() {
        Sources::Anyone
    } else {
        Sources::Only(control_plane.clone().collect())
    };
    let metrics = Sources::Only(
        control_plane
            .chain(
                access
                    .metrics_from
                    .iter()
                    .map(|n| Source::Namespace(n.clone())),
            )
            .collect(),
    );
    vec![(WEBHOOK_PORT, webhook), (METRICS_PORT, metrics)]
}

/// The operator's own Pods take connections on the webhook port and the metrics port alone,
/// each from the sources [`admitted`] names. A port that admits nobody has no rule (a rule
/// with no `from` would admit everyone).
pub(super) fn network_policy(
    namespace: &str,
    access: &Access,
) -> k8s_openapi::api::networking::v1::NetworkPolicy {
    use k8s_openapi::api::networking::v1::{
        IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
        NetworkPolicySpec,
    };
    let peer = |s: Source| match s {
        Source::Block(cidr) => NetworkPolicyPeer {
            ip_block: Some(IPBlock { cidr, except: None }),
            ..Default::default()
        },
        Source::Namespace(name) => NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    name,
                )])),
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    let ingress = admitted(access)
        .into_iter()
        .filter_map(|(port, sources)| {
            let from = match sources {
                Sources::Anyone => None,
                Sources::Only(s) if s.is_empty() => return None,
                Sources::Only(s) => Some(s.into_iter().map(peer).collect()),
            };
            Some(NetworkPolicyIngressRule {
                from,
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(port)),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            })
        })
        .collect();
    NetworkPolicy {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    }
}

/// What the operator's NetworkPolicy admits, as comment lines above it.
pub(super) fn policy_comment(access: &Access) -> String {
    let webhook = if access.control_plane.is_empty() {
        format!(
            "The webhook port ({WEBHOOK_PORT}) admits every source: the control plane's addresses were not given. Name them where your CNI shows the API server's address to a NetworkPolicy (Helm controlPlaneCIDRs, `cargo xtask manifests --control-plane-cidrs`; docs/isolation.md#the-operators-own-pods says what to set per CNI)."
        )
    } else {
        format!(
            "The webhook port ({WEBHOOK_PORT}) admits the control plane alone: {}.",
            access.control_plane.join(", ")
        )
    };
    let mut from = vec!["the Pod's own node (the probes)".to_owned()];
    if !access.control_plane.is_empty() {
        from.push("the control plane (the API server's Pod proxy)".to_owned());
    }
    if !access.metrics_from.is_empty() {
        from.push(format!(
            "the Pods of the namespaces {} (Helm metricsFrom, `--metrics-from`)",
            access.metrics_from.join(", ")
        ));
    }
    let metrics = match from.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!(
            "The metrics port ({METRICS_PORT}) admits {} and {last} alone.",
            rest.join(", ")
        ),
        _ => format!(
            "The metrics port ({METRICS_PORT}) admits {} alone.",
            from.join("")
        ),
    };
    let mut out = String::new();
    for paragraph in [webhook, metrics] {
        let mut line = String::from("#");
        for word in paragraph.split(' ') {
            if line.len() + 1 + word.len() > 96 && line.len() > 1 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}
