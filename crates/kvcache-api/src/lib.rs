//! The kvcache-operator's API: the five kinds in `worker.gpustack.ai/v1`, their defaults, their
//! CRDs, the condition types of their statuses (beside each kind: [`backend::conditions`],
//! [`model::conditions`], [`pool::pool_conditions`], [`pool::binding_conditions`]), and their
//! admission rules as pure functions.
//!
//! Nothing here talks to a cluster: other tools embed this crate to read, check and write these
//! objects offline.

#![warn(missing_docs)]

pub mod admission;
pub mod backend;
pub mod condition;
pub mod crd;
pub mod manifest;
pub mod model;
pub mod names;
pub mod pool;
pub mod quantity;
pub mod relation;
pub mod resources;
pub mod rules;
pub mod settings;
pub mod shared_cache;

pub use backend::{KVCacheBackend, KVCacheBackendSpec, KVCacheBackendStatus};
pub use model::{InstanceType, InstanceTypeSpec, ModelDeployment, ModelDeploymentSpec};
pub use pool::{
    KVCachePool, KVCachePoolBinding, KVCachePoolBindingSpec, KVCachePoolBindingStatus,
    KVCachePoolSpec, KVCachePoolStatus,
};
pub use quantity::Quantity;
pub use settings::Settings;

/// The API group of every kind here.
pub const GROUP: &str = "worker.gpustack.ai";
/// The API version of every kind here.
pub const VERSION: &str = "v1";
/// The annotation on a backend's `<backend>-leader` Lease where the holder (the elector)
/// publishes what its master binary says its version is; the backend controller reads it.
pub const STORE_VERSION_ANNOTATION: &str = "kvcache.gpustack.ai/store-version";

/// On a KVCachePoolBinding, `"true"`: its tenant's objects are removed when it is deleted.
/// Every deleted Binding's are now (its revocation, docs/isolation.md#revocation), so the
/// annotation changes nothing; it is still accepted on Bindings that carry it.
pub const DROP_CACHED_DATA_ANNOTATION: &str = "kvcache.gpustack.ai/drop-cached-data";

/// What can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A byte quantity that does not parse.
    #[error(
        "{field}: {value:?} is not a byte size: {reason}; write a whole number of bytes with an optional suffix, such as 512Mi, 8Gi or 4Ti"
    )]
    Quantity {
        /// Where the value sits, e.g. `spec.quota.total`.
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        reason: quantity::QuantityError,
    },
    /// A CPU quantity that does not parse.
    #[error(
        "{field}: {value:?} is not a CPU amount: {reason}; write millicores or cores, such as 500m, 1 or 2"
    )]
    Cpu {
        /// Where the value sits, e.g. `spec.connection.managed.leader.resources.requests.cpu`.
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        reason: quantity::QuantityError,
    },
    /// A manifest that is not YAML or JSON.
    #[error("{source_name}: document {index} is not valid YAML: {message}")]
    ManifestSyntax {
        /// File or other source name.
        source_name: String,
        /// 1-based document index in the source.
        index: usize,
        /// Why it does not parse, as the YAML or JSON reader words it.
        message: String,
    },
    /// A manifest of a kind this operator does not handle.
    #[error(
        "{source_name}: document {index} is {api_version}/{kind}, which is not one of this operator's kinds (worker.gpustack.ai/v1 KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment, InstanceType)"
    )]
    UnknownKind {
        /// File or other source name.
        source_name: String,
        /// 1-based document index.
        index: usize,
        /// The document's `apiVersion` as written; empty when it has none.
        api_version: String,
        /// The document's `kind` as written; empty when it has none.
        kind: String,
    },
    /// A manifest whose fields do not fit its kind.
    #[error("{source_name}: {kind} {name:?} does not fit its schema: {message}")]
    ManifestShape {
        /// File or other source name.
        source_name: String,
        /// The document's `kind`, one of this operator's five.
        kind: String,
        /// The object's name, if it has one.
        name: String,
        /// What does not fit.
        message: String,
    },
    /// A cluster setting whose value cannot be used.
    #[error("{source_name}: {key}: {value:?} {problem}")]
    SettingValue {
        /// The ConfigMap or file it was read from.
        source_name: String,
        /// The setting's key (`kvcache_api::settings::keys`).
        key: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong with it and what to write instead.
        problem: &'static str,
    },
    /// A CRD that could not be serialised.
    #[error("could not write the {kind} CRD: {message}")]
    CrdOutput {
        /// The CRD's `spec.names.kind`, e.g. `KVCacheBackend`.
        kind: String,
        /// The YAML serialiser's message.
        message: String,
    },
}
