//! Offline resolution, as the operator resolves references on a cluster: backends get their image
//! and tenant policy, deployments their Binding, pool and backend. What `kvcache-operator render`
//! prints.

use kvcache_api::admission::tenant_of;
use kvcache_api::backend::Protocol;
use kvcache_api::manifest::{Object, ObjectRef};
use kvcache_api::{KVCacheBackend, KVCachePoolBinding, ModelDeployment, Settings};
use kvcache_inject::Ledger;
use kvcache_inject::versions::store_version_of_image;
use kvcache_quota::policy;
use serde::Serialize;

use crate::backend::{self, BackendInputs, StoreAccess};
use crate::error::Error;
use crate::model::{self, Attachment, ModelInputs};
use crate::world::World;

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

/// The namespace the operator is installed into when `--namespace` is not given.
pub const DEFAULT_NAMESPACE: &str = "gpustack-system";
/// The operator image `cargo xtask manifests` writes into `deploy/operator.yaml` and the chart.
pub const DEFAULT_OPERATOR_IMAGE: &str = "gpustack/kvcache-operator:0.1.0";

pub use crate::backend::store_image;

fn to_docs<
    T: Serialize
        + k8s_openapi::Resource
        + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
>(
    docs: &mut Vec<serde_yaml::Value>,
    errors: &mut Vec<Error>,
    objects: &[T],
) {
    for o in objects {
        match serde_yaml::to_value(o) {
            Ok(v) => docs.push(v),
            Err(e) => errors.push(Error::Yaml {
                object: format!(
                    "{} {}",
                    T::KIND,
                    o.metadata().name.as_deref().unwrap_or_default()
                ),
                message: e.to_string(),
            }),
        }
    }
}

/// Renders every object the operator would create for `objects`; errors name what does not resolve.
pub fn render_all(
    objects: &[Object],
    env: &Environment<'_>,
) -> Result<Vec<serde_yaml::Value>, Vec<Error>> {
    let world = World::from_objects(objects);
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for b in world.backends() {
        let name = b.metadata.name.clone().unwrap_or_default();
        if b.spec.connection.managed.is_none() {
            continue;
        }
        let Some(image) = store_image(b, env.settings) else {
            errors.push(Error::NoStoreImage {
                backend: name.clone(),
            });
            continue;
        };
        let (ceilings, problems) = world.ceilings_on(&name);
        errors.extend(problems);
        let doc = match policy::render(&name, &ceilings) {
            Ok(d) => d,
            Err(e) => {
                errors.push(e.into());
                continue;
            }
        };
        let bound = world.bound_namespaces(&name);
        match backend::render(&BackendInputs {
            backend: b,
            store_image: image,
            namespace: env.namespace,
            elector_image: env.settings.elector_image(),
            etcd_image: env.settings.etcd_image(),
            bound_namespaces: &bound,
            policy: Some(&doc),
            // What an operator in a Pod applies (no `--store-admin-from` or
            // `--store-metrics-from`).
            access: &StoreAccess::IN_CLUSTER,
        }) {
            Ok(o) => {
                to_docs(&mut docs, &mut errors, &o.service_accounts);
                to_docs(&mut docs, &mut errors, &o.roles);
                to_docs(&mut docs, &mut errors, &o.role_bindings);
                to_docs(&mut docs, &mut errors, o.lease.as_slice());
                to_docs(&mut docs, &mut errors, o.config_map.as_slice());
                to_docs(&mut docs, &mut errors, o.deployment.as_slice());
                to_docs(&mut docs, &mut errors, o.service.as_slice());
                to_docs(&mut docs, &mut errors, &o.network_policies);
                to_docs(&mut docs, &mut errors, &o.daemon_sets);
                to_docs(&mut docs, &mut errors, o.etcd_service.as_slice());
                to_docs(&mut docs, &mut errors, o.etcd.as_slice());
                to_docs(&mut docs, &mut errors, o.etcd_policy.as_slice());
            }
            Err(e) => errors.push(e),
        }
    }
    let instance_types = world.instance_type_map();
    for md in world.models() {
        let ns = md
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let attachment = match &md.spec.kv_cache {
            None => None,
            Some(kv) => match attachment(&world, md, &ns, &kv.pool_ref.name, env) {
                Ok(a) => Some(a),
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            },
        };
        match model::render(&ModelInputs {
            deployment: md,
            instance_types: &instance_types,
            attachment: attachment.as_ref(),
        }) {
            Ok(o) => {
                to_docs(&mut docs, &mut errors, &o.deployments);
                to_docs(&mut docs, &mut errors, &o.services);
                to_docs(&mut docs, &mut errors, &o.network_policies);
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(errors)
    }
}

/// The attachment a ModelDeployment's `kvCache.poolRef` gives, or the first missing link.
fn attachment(
    world: &World,
    md: &ModelDeployment,
    ns: &str,
    binding: &str,
    env: &Environment<'_>,
) -> Result<Attachment, Error> {
    let chain = world.chain(ns, binding);
    let b = chain.binding.ok_or_else(|| Error::Missing {
        referrer: Box::new(ObjectRef::new("ModelDeployment", &md.metadata)),
        field: "spec.kvCache.poolRef.name",
        kind: "KVCachePoolBinding",
        name: format!("{ns}/{binding}"),
        hint: "; name a KVCachePoolBinding in the ModelDeployment's own namespace",
    })?;
    let pool = chain.pool.ok_or_else(|| Error::Missing {
        referrer: Box::new(ObjectRef::new("KVCachePoolBinding", &b.metadata)),
        field: "spec.poolRef.name",
        kind: "KVCachePool",
        name: b.spec.pool_ref.name.clone(),
        hint: "",
    })?;
    let backend = chain.backend.ok_or_else(|| Error::Missing {
        referrer: Box::new(ObjectRef::new("KVCachePool", &pool.metadata)),
        field: "spec.backends[0]",
        kind: "KVCacheBackend",
        name: pool.spec.backend().unwrap_or_default().to_owned(),
        hint: "",
    })?;
    attachment_on(binding, b, backend, env)
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
