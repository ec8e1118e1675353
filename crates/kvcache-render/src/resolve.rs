//! Offline resolution, as the operator resolves references on a cluster: backends get their image
//! and tenant policy, deployments their Binding, pool and backend. What `kvcache-operator render`
//! prints.

use kvcache_api::admission::tenant_of;
use kvcache_api::backend::Protocol;
use kvcache_api::manifest::Object;
use kvcache_api::{KVCacheBackend, KVCachePoolBinding, ModelDeployment, Settings};
use kvcache_inject::Ledger;
use kvcache_inject::versions::store_version_of_image;
use kvcache_quota::policy;

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use crate::backend::plan::{self, BackendRead};
use crate::backend::{self, StoreAccess};
use crate::error::Error;
use crate::model::Attachment;
use crate::model_plan::{self, Refusal};
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

/// Each object of `desired` as a YAML document, in its order.
fn to_docs(
    docs: &mut Vec<serde_yaml::Value>,
    errors: &mut Vec<Error>,
    desired: &crate::desired::DesiredSet,
) {
    for o in &desired.objects {
        match o.yaml() {
            Ok(v) => docs.push(v),
            Err(e) => errors.push(e),
        }
    }
}

/// Renders every object the operator would create for `objects` on a cluster where none runs
/// yet, through the controllers' own plans (`crate::backend::plan::plan`,
/// `crate::model_plan::roles`), in the order a pass writes them; errors name what does not
/// resolve.
pub fn render_all(
    objects: &[Object],
    env: &Environment<'_>,
) -> Result<Vec<serde_yaml::Value>, Vec<Error>> {
    let world = World::from_objects(objects);
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for b in world.backends() {
        match backend_objects(&world, b, env) {
            Ok(Some(desired)) => to_docs(&mut docs, &mut errors, &desired),
            Ok(None) => {}
            Err(e) => errors.extend(e),
        }
    }
    let instance_types = world.instance_type_map();
    for md in world.models() {
        let ns = md.metadata.namespace.as_deref().unwrap_or("default");
        let plan = model_plan::roles(
            md,
            &world,
            Some(env.settings),
            None,
            env.namespace,
            &instance_types,
        );
        match (plan.objects, plan.refusal, &md.spec.kv_cache) {
            (Some(o), _, _) => to_docs(&mut docs, &mut errors, &o.desired()),
            (None, Some(Refusal::Failed(e)), _) => errors.push(e),
            // Held: the first missing link.
            (None, _, Some(kv)) => {
                if let Err(e) = attachment(&world, md, ns, &kv.pool_ref.name, env) {
                    errors.push(e);
                }
            }
            (None, _, None) => {}
        }
    }
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(errors)
    }
}

/// What a managed backend's pass writes on a cluster where nothing of it runs yet (`None` for
/// an external backend), or what keeps it from rendering: a Binding it cannot read, a refused
/// tenant policy, no store image.
fn backend_objects(
    world: &World,
    b: &KVCacheBackend,
    env: &Environment<'_>,
) -> Result<Option<crate::desired::DesiredSet>, Vec<Error>> {
    let name = b.metadata.name.clone().unwrap_or_default();
    if b.spec.connection.managed.is_none() {
        return Ok(None);
    }
    let (ceilings, mut problems) = world.ceilings_on(&name);
    if let Err(e) = policy::render(&name, &ceilings) {
        problems.push(e.into());
    }
    if store_image(b, env.settings).is_none() {
        problems.push(Error::NoStoreImage {
            backend: name.clone(),
        });
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let nothing = BTreeMap::new();
    let plan = plan::plan(&BackendRead {
        backend: b,
        namespace: env.namespace,
        // What an operator in a Pod applies (no `--store-admin-from` or
        // `--store-metrics-from`).
        access: &StoreAccess::IN_CLUSTER,
        settings: Some(env.settings),
        settings_refused: None,
        world,
        deployments: &[],
        daemon_sets: &[],
        stateful_sets: &[],
        lease: None,
        store_pods: &[],
        store: None,
        jobs: BTreeMap::new(),
        pods_at: &nothing,
        drain_unknown: true,
        probe_pods: &[],
        probe: false,
        now: Timestamp::UNIX_EPOCH,
    })
    .map_err(|e| vec![e])?;
    Ok(plan.desired())
}

/// The attachment a ModelDeployment's `kvCache.poolRef` gives, or the first missing link.
fn attachment(
    world: &World,
    md: &ModelDeployment,
    ns: &str,
    binding: &str,
    env: &Environment<'_>,
) -> Result<Attachment, Error> {
    let links = world
        .reach(ns, binding)
        .map_err(|link| crate::world::missing_error(link, md))?;
    attachment_on(binding, links.binding, links.backend, env)
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
