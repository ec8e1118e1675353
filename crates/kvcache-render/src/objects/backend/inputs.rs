//! What rendering a backend takes.

use super::access::StoreAccess;
use kvcache_api::KVCacheBackend;
use kvcache_quota::policy::PolicyDocument;

/// What rendering a backend takes.
#[derive(Clone, Debug)]
pub struct BackendInputs<'a> {
    /// The KVCacheBackend to render; an external one renders nothing.
    pub backend: &'a KVCacheBackend,
    /// The resolved store image (`spec.image`, else the cluster setting).
    pub store_image: &'a str,
    /// The operator's namespace (default `gpustack-system`).
    pub namespace: &'a str,
    /// The image that delivers `kvcache-elector` (the `kv-cache-elector-image` setting):
    /// apart from the operator's, so that an operator upgrade changes no store template.
    pub elector_image: &'a str,
    /// The etcd image (the `kv-cache-etcd-image` setting) a backend with `electionBackend: Etcd`
    /// runs.
    pub etcd_image: &'a str,
    /// The namespaces holding a Binding to a pool on this backend (their engines reach the
    /// master's RPC port and the members' transfer ports), sorted.
    pub bound_namespaces: &'a [String],
    /// The tenant policy from the pools on this backend (empty when there are none yet).
    pub policy: Option<&'a PolicyDocument>,
    /// Who else may reach the store (the operator outside a Pod, the monitoring).
    pub access: &'a StoreAccess,
}

/// The store image a backend runs: its own, else the setting.
pub fn store_image<'a>(
    b: &'a KVCacheBackend,
    settings: &'a kvcache_api::Settings,
) -> Option<&'a str> {
    b.spec.image.as_deref().or(settings.backend_image())
}
