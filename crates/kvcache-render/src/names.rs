//! Object names and labels: DNS-1035 labels, long or unusual names shortened with a stable hash
//! of the whole name (never truncated into collisions).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use kvcache_api::backend::Leader;
pub use kvcache_api::names::MAX_LABEL;
use kvcache_api::names::is_dns1035_label;

/// The first `n` hex digits of the SHA-256 of `text`.
pub fn hash(text: &str, n: usize) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..n.min(hex.len())].to_owned()
}

/// `<base>-<suffix>` as a DNS-1035 label (valid for Services too). When `base` is not already a
/// clean label, or the result would be too long, `base` is cleaned, cut, and followed by a hash
/// of the original, so two different bases never meet.
pub fn object(base: &str, suffix: &str) -> String {
    let plain = if suffix.is_empty() {
        base.to_owned()
    } else {
        format!("{base}-{suffix}")
    };
    if is_dns1035_label(&plain) {
        return plain;
    }
    let mut clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if !clean.starts_with(|c: char| c.is_ascii_lowercase()) {
        clean.insert(0, 'k');
    }
    let tail = if suffix.is_empty() {
        format!("-{}", hash(base, 8))
    } else {
        format!("-{}-{suffix}", hash(base, 8))
    };
    let room = MAX_LABEL.saturating_sub(tail.len());
    let cut: String = clean.chars().take(room).collect();
    format!("{}{tail}", cut.trim_end_matches('-'))
}

/// A label value (≤ 63 characters, alphanumeric at both ends).
pub fn label_value(value: &str) -> String {
    let ok = value.len() <= MAX_LABEL
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && value
            .bytes()
            .next()
            .is_none_or(|b| b.is_ascii_alphanumeric())
        && value
            .bytes()
            .last()
            .is_none_or(|b| b.is_ascii_alphanumeric());
    if ok {
        value.to_owned()
    } else {
        object(value, "")
    }
}

/// The port every replica serves on.
pub const SERVING_PORT: i32 = 8000;

/// The label naming what an object is part of (`kv-cache-backend`, `model-deployment`).
pub(crate) const NAME_LABEL: &str = "app.kubernetes.io/name";
/// The label naming the owner (the backend's or the deployment's name, as a label value).
pub(crate) const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The label naming the part of the owner (`leader`, `member-<i>`, a role).
pub(crate) const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// The label naming who manages an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// [`MANAGED_BY_LABEL`] and `app.kubernetes.io/part-of` of the operator's objects.
pub const OPERATOR: &str = "kvcache-operator";
/// The finalizer a backend holds while its workloads are torn down.
pub const TEARDOWN_FINALIZER: &str = "kvcache.gpustack.ai/teardown";
/// The finalizer named `release` on both kinds whose deletion waits on the master: a pool holds
/// it while it has Bindings, a Binding while its tenant is not released in the ledger.
pub const RELEASE_FINALIZER: &str = "kvcache.gpustack.ai/release";
/// [`NAME_LABEL`] of every store object.
pub(crate) const BACKEND_NAME: &str = "kv-cache-backend";
/// [`NAME_LABEL`] of every object of a ModelDeployment's roles.
pub(crate) const MODEL_NAME: &str = "model-deployment";

/// The selector of every store object of every backend.
pub fn store_objects() -> String {
    format!("{NAME_LABEL}={BACKEND_NAME}")
}

/// The selector of every role object of every ModelDeployment.
pub fn model_objects() -> String {
    format!("{NAME_LABEL}={MODEL_NAME}")
}

/// The selector of the role objects of the ModelDeployment `deployment`.
pub fn model_objects_of(deployment: &str) -> String {
    format!(
        "{NAME_LABEL}={MODEL_NAME},{INSTANCE_LABEL}={}",
        label_value(deployment)
    )
}

/// The backend a store object belongs to, read from its labels (`None`: not a store object).
pub fn backend_of_labels(labels: &BTreeMap<String, String>) -> Option<&str> {
    if labels.get(NAME_LABEL).map(String::as_str) != Some(BACKEND_NAME) {
        return None;
    }
    labels.get(INSTANCE_LABEL).map(String::as_str)
}

/// The labels every object of one backend carries; `component` is `leader` or `member-<i>`.
pub(crate) fn backend_labels(backend: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.into(), BACKEND_NAME.into()),
        (INSTANCE_LABEL.into(), label_value(backend)),
        (COMPONENT_LABEL.into(), component.into()),
        ("app.kubernetes.io/part-of".into(), OPERATOR.into()),
        (MANAGED_BY_LABEL.into(), OPERATOR.into()),
    ])
}

/// The immutable selector of one backend component (name, instance, component).
pub fn backend_selector(backend: &str, component: &str) -> BTreeMap<String, String> {
    let mut l = backend_labels(backend, component);
    l.retain(|k, _| k != "app.kubernetes.io/part-of" && k != MANAGED_BY_LABEL);
    l
}

/// Prefer one Pod of `selector` per node where the nodes allow it (the operator's two replicas,
/// a warm backend's etcd members): a node lost then costs one of them.
pub(crate) fn prefer_separate_nodes(
    selector: BTreeMap<String, String>,
) -> k8s_openapi::api::core::v1::Affinity {
    use k8s_openapi::api::core::v1::{
        Affinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector),
                            ..Default::default()
                        }),
                        topology_key: "kubernetes.io/hostname".into(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `namespace/name` of a Binding (the way statuses and events name it; `default` for a Binding
/// read from a manifest without a namespace).
pub fn binding_id(b: &kvcache_api::KVCachePoolBinding) -> String {
    format!(
        "{}/{}",
        b.metadata.namespace.as_deref().unwrap_or("default"),
        b.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The annotation holding a member template's fingerprint.
pub(crate) const POD_SPEC_HASH: &str = "kvcache.gpustack.ai/pod-spec-hash";
/// Where the elector binary is delivered inside store Pods.
pub(crate) const ELECTOR_PATH: &str = "/kvcache/bin/kvcache-elector";
/// etcd's client port.
pub(crate) const ETCD_CLIENT_PORT: i32 = 2379;

/// `<backend>-etcd`: the StatefulSet, its headless Service and the Pods' stable names.
pub(crate) fn etcd_name(backend: &str) -> String {
    object(backend, "etcd")
}

/// The etcd members' client addresses, `;`-separated as Mooncake's `--etcd_endpoints` reads
/// them (`mooncake_master --help`): each Pod's stable name under the headless Service, so a
/// client fails over between members by itself.
pub fn etcd_endpoints(backend: &str, namespace: &str, leader: &Leader) -> String {
    let set = etcd_name(backend);
    (0..leader.etcd_replicas().max(1))
        .map(|i| format!("{set}-{i}.{set}.{namespace}.svc:{ETCD_CLIENT_PORT}"))
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(object("mooncake-dram", "leader"), "mooncake-dram-leader");
        let long = "a".repeat(80);
        let n = object(&long, "member-3");
        assert!(n.len() <= 63 && n.ends_with("-member-3"), "{n}");
        assert_ne!(
            object(&format!("{long}b"), "leader"),
            object(&format!("{long}c"), "leader")
        );
        let dotted = object("store.v1", "leader");
        assert!(is_dns1035_label(&dotted), "{dotted}");
        assert_ne!(
            dotted,
            object("store-v1", "leader"),
            "cleaning never merges two names"
        );
        assert!(is_dns1035_label(&object("1cache", "leader")));
        assert_eq!(label_value("mooncake-dram"), "mooncake-dram");
        assert!(label_value(&"x".repeat(70)).len() <= 63);
    }

    #[test]
    fn the_label_contracts_find_what_the_render_labels() {
        let labels = backend_labels("mooncake-dram", "leader");
        assert_eq!(backend_of_labels(&labels), Some("mooncake-dram"));
        let selector = store_objects();
        let (k, v) = selector.split_once('=').expect("one label");
        assert_eq!(labels.get(k).map(String::as_str), Some(v));
        let mut other = labels.clone();
        other.insert(NAME_LABEL.into(), MODEL_NAME.into());
        assert_eq!(backend_of_labels(&other), None, "not a store object");
        assert_eq!(
            model_objects_of("Big.Model"),
            format!(
                "app.kubernetes.io/name=model-deployment,app.kubernetes.io/instance={}",
                label_value("Big.Model")
            )
        );
        assert_eq!(model_objects(), "app.kubernetes.io/name=model-deployment");
    }
}
