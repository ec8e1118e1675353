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
mod error;
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
pub use error::Error;
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
