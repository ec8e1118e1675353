//! Every Kubernetes object the kvcache-operator owns, as pure functions: specs in, k8s-openapi
//! objects out, no client, clock or environment. The same input gives byte-identical YAML.
//!
//! Beside the objects, pure as well: offline resolution of references ([`resolve`]), what the
//! operator decides from what it observed (the statuses in [`status`], from [`store`]'s and
//! [`read`]'s readings; the events of a backend's transitions in [`events`]; the [`rollout`];
//! the [`shared_cache`] figures), the admission review of objects and Pods ([`review`], [`pod`])
//! and the operator's own installation ([`install`], [`monitoring`]).

#![warn(missing_docs)]

pub mod backend;
pub mod events;
pub mod install;
pub mod model;
pub mod model_plan;
pub mod monitoring;
pub mod mounts;
pub mod names;
pub mod pod;
pub mod pool_plan;
pub mod read;
pub mod resolve;
pub mod review;
pub mod rollout;
pub mod shared_cache;
pub mod status;
pub mod store;
pub mod world;

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
        /// The role's `name` in `spec.roles`.
        role: String,
        /// Why the injection refused the role; its reason becomes the error's reason.
        source: kvcache_inject::Error,
    },
    /// A reference to an object that does not exist.
    #[error("{referrer}: {field} names {kind} {name}, which does not exist{hint}")]
    Missing {
        /// The object holding the reference.
        referrer: Box<kvcache_api::manifest::ObjectRef>,
        /// The field of `referrer` that names the object, e.g. `spec.poolRef.name`.
        field: &'static str,
        /// The kind the field names, e.g. `KVCachePool`.
        kind: &'static str,
        /// The name (`namespace/name` for a namespaced kind).
        name: String,
        /// What to do, starting with `; ` (or empty).
        hint: &'static str,
    },
    /// A managed backend with no store image anywhere.
    #[error(
        "KVCacheBackend {backend}: no store image (spec.image is unset and the kv-cache-backend-image setting is empty); set one of them"
    )]
    NoStoreImage {
        /// Name of the managed KVCacheBackend left without an image.
        backend: String,
    },
    /// A backend that sets neither connection.
    #[error("KVCacheBackend {backend}: spec.connection sets neither managed nor external")]
    NoConnection {
        /// Name of the KVCacheBackend whose `spec.connection` sets neither.
        backend: String,
    },
    /// An InstanceType CPU figure that is not a CPU quantity.
    #[error(
        "InstanceType {instance_type} spec.resources.cpu {value:?} is not a CPU quantity: {source}; write cores (2, 0.5) or millicores (500m)"
    )]
    Cpu {
        /// Name of the InstanceType whose `spec.resources.cpu` does not parse.
        instance_type: String,
        /// The value as written.
        value: String,
        /// What is wrong with it (no number, an unknown suffix, a fraction, …).
        source: kvcache_api::quantity::QuantityError,
    },
    /// The backend's tenant policy document was refused.
    #[error(transparent)]
    Policy(#[from] kvcache_quota::Error),
    /// A rendered object that could not be written as YAML.
    #[error("{object}: cannot be written as YAML: {message}")]
    Yaml {
        /// `kind name` of the object.
        object: String,
        /// The YAML serialiser's message.
        message: String,
    },
}

impl Error {
    /// A CamelCase reason a condition can carry.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Api(_) => "InvalidQuantity",
            Error::Injection { source, .. } => source.reason(),
            Error::Missing { .. } => "ReferenceNotFound",
            Error::NoStoreImage { .. } => "NoStoreImage",
            Error::NoConnection { .. } => "NoConnection",
            Error::Cpu { .. } => "InvalidCPU",
            Error::Policy(_) => "PolicyRefused",
            Error::Yaml { .. } => "SerializationFailed",
        }
    }
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
