//! What a Binding gives the engines that attach through it: the store's endpoint, the tenant,
//! the dtype, the transports, whether the master keeps a ledger and its version
//! ([`Attachment`]), on its pool's backend, where the operator runs ([`Environment`]).

use kvcache_api::admission::tenant_of;
use kvcache_api::backend::Protocol;
use kvcache_api::{KVCacheBackend, KVCachePoolBinding, Settings};
use kvcache_inject::Ledger;
use kvcache_inject::versions::store_version_of_image;

use crate::error::Error;
use crate::objects::backend::{self, store_image};
use crate::objects::model::Attachment;

/// Where and with what the operator runs.
#[derive(Clone, Debug)]
pub struct Environment<'a> {
    /// The operator's namespace, where managed backends' store objects go (default
    /// `gpustack-system`).
    pub namespace: &'a str,
    /// The cluster settings: the default store image, the elector image and whether the
    /// operator owns `--kv-cache-dtype`.
    pub settings: &'a Settings,
}

/// The cache attachment a Binding gives, on its pool's backend: endpoint, tenant, dtype,
/// protocols, ledger and store version (the version the running master reported, when known,
/// else the image tag's).
pub(crate) fn attachment_on(
    binding: &str,
    b: &KVCachePoolBinding,
    backend: &KVCacheBackend,
    env: &Environment<'_>,
) -> Result<Attachment, Error> {
    let backend_name = backend.metadata.name.as_deref().unwrap_or_default();
    let (endpoint, protocols, ledger, version) = match (
        &backend.spec.connection.managed,
        &backend.spec.connection.external,
    ) {
        (Some(m), _) => (
            Some(backend::client_endpoint(backend_name, env.namespace)),
            m.members
                .iter()
                .map(|g| g.protocol(backend.spec.transport.protocol))
                .collect::<Vec<Protocol>>(),
            if m.leader.multi_tenancy {
                Ledger::Enforced
            } else {
                Ledger::Absent
            },
            backend
                .status
                .as_ref()
                .and_then(|s| s.store_version.clone())
                .or_else(|| store_image(backend, env.settings).and_then(store_version_of_image)),
        ),
        (None, Some(x)) => (
            x.address(kvcache_api::backend::EndpointName::Client)
                .map(str::to_owned),
            vec![backend.spec.transport.protocol],
            // Offline, an external master's ledger cannot be read: assume it keeps one.
            Ledger::Enforced,
            None,
        ),
        (None, None) => {
            return Err(Error::NoConnection {
                backend: backend_name.to_owned(),
            });
        }
    };
    Ok(Attachment {
        binding: binding.to_owned(),
        domain: tenant_of(b).to_owned(),
        dtype: b.spec.domain.dtype.clone(),
        ledger,
        client_endpoint: endpoint,
        protocols,
        store_version: version,
        dtype_owned: env.settings.kv_cache_dtype_owned,
    })
}
