//! The label sets of the operator's series.

use prometheus_client::encoding::EncodeLabelSet;

/// Labels of a reconcile outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `kvcachebackend`, …
    pub controller: String,
    /// `ok` or the error's metric label.
    pub result: String,
}

/// Labels of a store read.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Labels of a webhook request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// `validate`, …
    pub webhook: String,
    /// `allowed` or `refused`.
    pub outcome: String,
}

/// Labels of what a server refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `webhook` or `metrics`.
    pub server: String,
    /// Why: `full`, `source_full`, `source_rate`, `not_allowed` (connections); `too_large`,
    /// `too_complex`, `unreadable`, `busy`, `timed_out` (requests).
    pub reason: String,
}

/// Labels of a backend's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
}

/// Labels of a backend's member counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
    /// `ready` (member Pods Ready) or `mounted` (segments the leader lists).
    pub state: String,
}

/// Labels of a Binding's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BindingLabels {
    pub namespace: String,
    /// The Binding's name, without its namespace.
    pub binding: String,
    /// Its domain: the store tenant its deployments write under (`spec.domain.name`).
    pub domain: String,
}

impl BindingLabels {
    pub(super) fn of(b: &kvcache_api::KVCachePoolBinding) -> Self {
        BindingLabels {
            namespace: b.metadata.namespace.clone().unwrap_or_default(),
            binding: b.metadata.name.clone().unwrap_or_default(),
            domain: kvcache_api::admission::tenant_of(b).to_owned(),
        }
    }
}

/// Labels of a ModelDeployment's shared-cache series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub namespace: String,
    /// The ModelDeployment's name, without its namespace.
    pub deployment: String,
    /// The cache domain (the Binding's tenant) it writes under.
    pub domain: String,
}

/// Labels of what a backend's re-export left out.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkippedLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
    /// `over_cap`, `histogram`, `unreadable` or `clash` ([`kvcache_render::observe::store_series::Skipped`]).
    pub reason: String,
}
