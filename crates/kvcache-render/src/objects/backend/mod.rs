//! A managed KVCacheBackend as Kubernetes objects: the leader Deployment, its Service, the Lease,
//! per-role RBAC, the tenant policy ConfigMap, one DaemonSet per member group and the store
//! workloads' disruption budgets.

pub mod access;
pub(crate) mod disruption;
mod etcd;
mod inputs;
mod leader;
mod member;
mod pod;
pub mod probe;
mod set;

pub use access::StoreAccess;
pub use inputs::{BackendInputs, store_image};
pub use leader::master_flags;
pub(crate) use member::fabric_device;
pub use pod::{
    ADMIN_PORT, DEFAULT_LOCAL_BUFFER, LEASE_SECONDS, OWNER_LABEL, RPC_PORT, TIER_STAGING_BYTES,
    TRANSFER_PORT_ENV, TRANSFER_PORTS, client_endpoint, fingerprint, leader_name, pod_spec_hash,
};
pub(crate) use pod::{pull_policy, restricted_container};
pub use set::{BACKEND_TEARDOWN, BackendObjects, render};
