//! Every Kubernetes object the kvcache-operator owns, as pure functions: specs in, k8s-openapi
//! objects out, no client, clock or environment. The same input gives byte-identical YAML.

#![warn(missing_docs)]

pub mod backend;
pub mod install;
pub mod model;
pub mod names;
pub mod resolve;

use sha2::{Digest, Sha256};

pub use backend::{BackendInputs, BackendObjects};

/// What rendering can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A quantity in the spec does not parse (admission refuses these; a stored object from
    /// before the rule can still carry one).
    #[error(transparent)]
    Api(#[from] kvcache_api::Error),
    /// A ModelDeployment role that cannot be attached to its cache.
    #[error("ModelDeployment {deployment} role {role}: {source}")]
    Injection {
        /// `namespace/name`.
        deployment: String,
        /// The role.
        role: String,
        /// The refusal.
        source: kvcache_inject::Error,
    },
    /// A reference that does not resolve.
    #[error("{0}")]
    Unresolved(String),
}

/// The fingerprint of a Pod template: its JSON without the node selector (widening a selector
/// restarts nothing) and without the fingerprint annotation itself.
pub fn fingerprint(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> String {
    let mut t = template.clone();
    if let Some(spec) = t.spec.as_mut() {
        spec.node_selector = None;
    }
    if let Some(meta) = t.metadata.as_mut()
        && let Some(a) = meta.annotations.as_mut()
    {
        a.remove(backend::POD_SPEC_HASH);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    let json = serde_json::to_vec(&t).unwrap_or_default();
    let digest = Sha256::digest(&json);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
