//! Who may reach an engine's Pods: the NetworkPolicy a ModelDeployment's role gets by default
//! (`spec.networkPolicy: DeclaredPorts`), docs/isolation.md#engine-pods.
//!
//! An engine attached to a store runs a transfer engine of its own, whose TCP server reads and
//! writes whatever address of its buffers a peer names. The store never dials it: a client
//! writes to and reads from the members, the members answer on the connections the client
//! opened (`ss` on a serving engine shows its transfer-engine listener with no connection in).
//! So nothing from outside the deployment needs any port the container does not declare, and
//! the policy admits those alone from any source, and every port from the deployment's own Pods
//! (the two halves of a disaggregated pair, the Pods of one multi-Pod replica).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, Pod};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The label that opts a Pod in to the injection (the webhook's `objectSelector`).
pub(crate) const INJECT_LABEL: &str = "kvcache.gpustack.ai/inject";

/// The annotation a Pod opted in by label carries to be closed but for its declared ports:
/// `DeclaredPorts` or `Unmanaged` (the default), as a ModelDeployment's `spec.networkPolicy`.
pub(crate) const NETWORK_POLICY_ANNOTATION: &str = "kvcache.gpustack.ai/network-policy";

/// The label the injection webhook gives such a Pod: its own policy's name, unique to the
/// Pod (from the admission request), which the policy selects.
pub const ENGINE_POLICY_LABEL: &str = "kvcache.gpustack.ai/engine-policy";

/// Labels a workload sets on each Pod by revision or ordinal: left out of the Pods that reach
/// a Pod on every port (its workload's own, whatever their revision).
const PER_POD_LABELS: [&str; 6] = [
    ENGINE_POLICY_LABEL,
    "pod-template-hash",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "batch.kubernetes.io/job-completion-index",
];

/// The [`ENGINE_POLICY_LABEL`] value for the admission request `request`: its uid's letters and
/// digits (a label value of at most 63).
pub(crate) fn policy_token(request: &str) -> String {
    request
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(40)
        .collect()
}

/// The policy of a Pod the webhook labelled [`ENGINE_POLICY_LABEL`]: the ports its containers
/// declare from any source, every port from the Pods bearing its labels (but those of
/// `PER_POD_LABELS`), owned by the Pod (collected with it). `None` for a Pod the webhook did
/// not label so (it is opted in by label, carries the webhook's record and asked with
/// `NETWORK_POLICY_ANNOTATION`: the webhook refuses the label and the record submitted, and
/// freezes both), or without a uid, a name or a namespace.
pub fn pod_policy(pod: &Pod) -> Option<NetworkPolicy> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let opted_in = labels.get(INJECT_LABEL).map(String::as_str) == Some("true")
        && annotations.contains_key(kvcache_inject::INJECTED_ANNOTATION)
        && annotations
            .get(NETWORK_POLICY_ANNOTATION)
            .map(String::as_str)
            == Some("DeclaredPorts");
    if !opted_in {
        return None;
    }
    let token = labels.get(ENGINE_POLICY_LABEL).filter(|t| !t.is_empty())?;
    let uid = pod.metadata.uid.clone()?;
    let pod_name = pod.metadata.name.clone()?;
    let namespace = pod.metadata.namespace.clone()?;
    let declared: Vec<ContainerPort> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.clone().unwrap_or_default())
        .collect();
    let own: BTreeMap<String, String> = labels
        .iter()
        .filter(|(k, _)| !PER_POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let name = format!("engine-{token}");
    Some(engine_policy(&EnginePods {
        name: &name,
        namespace: &namespace,
        labels: BTreeMap::from([(
            "app.kubernetes.io/managed-by".into(),
            "kvcache-operator".into(),
        )]),
        owner: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod_name,
            uid,
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        selector: BTreeMap::from([(ENGINE_POLICY_LABEL.to_owned(), token.clone())]),
        own,
        declared: &declared,
    }))
}

/// Whether `existing`, the object of a Pod policy's name, is controlled by another than the
/// Pod `pod_uid`: then it is left alone (a label can only be the webhook's, but a policy of that
/// name made by hand is not the operator's to take).
pub fn held_by_another(existing: &NetworkPolicy, pod_uid: &str) -> bool {
    existing
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .is_none_or(|o| o.uid != pod_uid)
}

/// What one engine policy covers.
#[derive(Clone, Debug)]
pub(crate) struct EnginePods<'a> {
    /// The policy's name.
    pub name: &'a str,
    /// The Pods' namespace, and the policy's.
    pub namespace: &'a str,
    /// The policy's labels.
    pub labels: BTreeMap<String, String>,
    /// The policy's owner (the ModelDeployment), collected with it.
    pub owner: Option<Vec<OwnerReference>>,
    /// The Pods it closes.
    pub selector: BTreeMap<String, String>,
    /// The Pods that reach them on every port: the workload's own.
    pub own: BTreeMap<String, String>,
    /// The ports the Pods' containers declare: open to every source.
    pub declared: &'a [ContainerPort],
}

/// The policy: `declared` from any source, every port from `own`, nothing else in. Egress is
/// left alone (an engine dials the store, the model hub, its peers).
pub(crate) fn engine_policy(pods: &EnginePods<'_>) -> NetworkPolicy {
    let mut ingress = Vec::new();
    // A rule with no ports admits every port: one is written only with a port to name.
    if !pods.declared.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            from: None,
            ports: Some(
                pods.declared
                    .iter()
                    .map(|p| NetworkPolicyPort {
                        port: Some(IntOrString::Int(p.container_port)),
                        protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                        end_port: None,
                    })
                    .collect(),
            ),
        });
    }
    ingress.push(NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(pods.own.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: None,
    });
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(pods.name.to_owned()),
            namespace: Some(pods.namespace.to_owned()),
            labels: Some(pods.labels.clone()),
            owner_references: pods.owner.clone(),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(pods.selector.clone()),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            egress: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(declared: &[ContainerPort]) -> EnginePods<'_> {
        EnginePods {
            name: "qwen-chat-server",
            namespace: "team-a",
            labels: BTreeMap::new(),
            owner: None,
            selector: BTreeMap::from([("role".into(), "server".into())]),
            own: BTreeMap::from([("deployment".into(), "qwen-chat".into())]),
            declared,
        }
    }

    #[test]
    fn the_declared_ports_are_open_to_all_and_every_port_to_the_deployments_own_pods() {
        let declared = [
            ContainerPort {
                name: Some("http".into()),
                container_port: 8000,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                container_port: 5353,
                protocol: Some("UDP".into()),
                ..Default::default()
            },
            ContainerPort {
                container_port: 9000,
                ..Default::default()
            },
        ];
        let policy = engine_policy(&pods(&declared));
        let spec = policy.spec.expect("a spec");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".into()]));
        assert_eq!(spec.egress, None, "egress is left alone");
        let ingress = spec.ingress.expect("ingress rules");
        assert_eq!(ingress.len(), 2);
        assert_eq!(ingress[0].from, None, "the declared ports from any source");
        let open: Vec<(IntOrString, String)> = ingress[0]
            .ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.port.clone().expect("a port"),
                    p.protocol.clone().expect("a protocol"),
                )
            })
            .collect();
        assert_eq!(
            open,
            vec![
                (IntOrString::Int(8000), "TCP".into()),
                (IntOrString::Int(5353), "UDP".into()),
                (IntOrString::Int(9000), "TCP".into()),
            ]
        );
        assert_eq!(ingress[1].ports, None, "every port from the own Pods");
        let own = ingress[1].from.as_ref().expect("a peer")[0]
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone());
        assert_eq!(
            own,
            Some(BTreeMap::from([("deployment".into(), "qwen-chat".into())]))
        );
        assert_eq!(
            ingress[1]
                .from
                .as_ref()
                .map(|f| f[0].namespace_selector.is_none()),
            Some(true)
        );
    }

    #[test]
    fn with_no_port_declared_no_rule_opens_every_port_to_every_source() {
        let policy = engine_policy(&pods(&[]));
        let ingress = policy.spec.and_then(|s| s.ingress).expect("ingress rules");
        assert_eq!(ingress.len(), 1);
        assert!(ingress[0].from.is_some(), "{ingress:?}");
    }
}
