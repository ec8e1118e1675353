//! The objects the operator reasons about together and how they reach one another: a
//! ModelDeployment or an engine Pod names a Binding in its own namespace, a Binding names a
//! pool, a pool names its backend. One [`World`] serves every place that follows that chain:
//! the offline `render` and `validate` (filled from manifests), the controllers (filled from
//! their shared caches) and the admission webhook (the caches, topped up with live reads).
//!
//! Pure: it holds what it is given and answers from it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kvcache_api::admission::tenant_of;
use kvcache_api::backend::ObjectRef as Consumer;
use kvcache_api::manifest::Object;
use kvcache_api::model::InstanceType;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_quota::claims::Claim;
use kvcache_quota::policy::BindingCeiling;

use crate::error::Error;
use crate::status::model::{Resolution, Unresolved};

/// The namespace a namespaced object without one is read in (as `kubectl apply` would).
const DEFAULT_NAMESPACE: &str = "default";

/// Backends, pools, Bindings, ModelDeployments and InstanceTypes, each at most once by name.
#[derive(Clone, Debug, Default)]
pub struct World {
    backends: BTreeMap<String, Arc<KVCacheBackend>>,
    pools: BTreeMap<String, Arc<KVCachePool>>,
    /// Keyed by `(namespace, name)`.
    bindings: BTreeMap<(String, String), Arc<KVCachePoolBinding>>,
    /// Keyed by `(namespace, name)`.
    models: BTreeMap<(String, String), Arc<ModelDeployment>>,
    instance_types: BTreeMap<String, Arc<InstanceType>>,
}

/// What a Binding named from a namespace reaches: the Binding, its pool, the pool's backend,
/// each `None` from the first one missing on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Chain<'a> {
    /// The Binding, when it exists.
    pub binding: Option<&'a KVCachePoolBinding>,
    /// The pool the Binding names, when it exists.
    pub pool: Option<&'a KVCachePool>,
    /// The backend the pool draws on, when it exists.
    pub backend: Option<&'a KVCacheBackend>,
}

pub use crate::names::binding_id;

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
        name_of(meta),
    )
}

impl World {
    /// A world of the given objects (a later one of the same name replaces an earlier one).
    pub fn new(
        backends: impl IntoIterator<Item = Arc<KVCacheBackend>>,
        pools: impl IntoIterator<Item = Arc<KVCachePool>>,
        bindings: impl IntoIterator<Item = Arc<KVCachePoolBinding>>,
        models: impl IntoIterator<Item = Arc<ModelDeployment>>,
        instance_types: impl IntoIterator<Item = Arc<InstanceType>>,
    ) -> Self {
        let mut w = World::default();
        backends.into_iter().for_each(|b| w.add_backend(b));
        pools.into_iter().for_each(|p| w.add_pool(p));
        bindings.into_iter().for_each(|b| w.add_binding(b));
        models.into_iter().for_each(|m| w.add_model(m));
        instance_types
            .into_iter()
            .for_each(|i| w.add_instance_type(i));
        w
    }

    /// A world of parsed manifests (`kvcache-operator render` and `validate`).
    pub fn from_objects(objects: &[Object]) -> Self {
        let mut w = World::default();
        for o in objects {
            w.add(o.clone());
        }
        w
    }

    /// Adds one object of any of the five kinds, replacing one of the same name.
    pub fn add(&mut self, object: Object) {
        match object {
            Object::Backend(b) => self.add_backend(Arc::new(*b)),
            Object::Pool(p) => self.add_pool(Arc::new(*p)),
            Object::Binding(b) => self.add_binding(Arc::new(*b)),
            Object::ModelDeployment(m) => self.add_model(Arc::new(*m)),
            Object::InstanceType(i) => self.add_instance_type(Arc::new(*i)),
        }
    }

    /// Adds a backend, replacing one of the same name.
    pub fn add_backend(&mut self, b: Arc<KVCacheBackend>) {
        self.backends.insert(name_of(&b.metadata), b);
    }

    /// Adds a pool, replacing one of the same name.
    pub fn add_pool(&mut self, p: Arc<KVCachePool>) {
        self.pools.insert(name_of(&p.metadata), p);
    }

    /// Adds a Binding, replacing one of the same namespace and name.
    pub fn add_binding(&mut self, b: Arc<KVCachePoolBinding>) {
        self.bindings.insert(key_of(&b.metadata), b);
    }

    /// Adds a ModelDeployment, replacing one of the same namespace and name.
    pub fn add_model(&mut self, m: Arc<ModelDeployment>) {
        self.models.insert(key_of(&m.metadata), m);
    }

    /// Adds an InstanceType, replacing one of the same name.
    pub fn add_instance_type(&mut self, i: Arc<InstanceType>) {
        self.instance_types.insert(name_of(&i.metadata), i);
    }

    /// Removes the Binding `name` in namespace `ns` (a live read found it gone).
    pub fn remove_binding(&mut self, ns: &str, name: &str) {
        self.bindings.remove(&(ns.to_owned(), name.to_owned()));
    }

    /// Every backend, by name.
    pub fn backends(&self) -> impl Iterator<Item = &KVCacheBackend> {
        self.backends.values().map(|b| &**b)
    }

    /// Every pool, by name.
    pub fn pools(&self) -> impl Iterator<Item = &KVCachePool> {
        self.pools.values().map(|p| &**p)
    }

    /// Every Binding, by namespace and name.
    pub fn bindings(&self) -> impl Iterator<Item = &KVCachePoolBinding> {
        self.bindings.values().map(|b| &**b)
    }

    /// Every ModelDeployment, by namespace and name.
    pub fn models(&self) -> impl Iterator<Item = &ModelDeployment> {
        self.models.values().map(|m| &**m)
    }

    /// Every InstanceType, by name.
    pub fn instance_types(&self) -> impl Iterator<Item = &InstanceType> {
        self.instance_types.values().map(|i| &**i)
    }

    /// The InstanceTypes by name, as the ModelDeployment render takes them.
    pub fn instance_type_map(&self) -> BTreeMap<String, InstanceType> {
        self.instance_types
            .iter()
            .map(|(n, i)| (n.clone(), (**i).clone()))
            .collect()
    }

    /// The backend named `name`.
    pub fn backend(&self, name: &str) -> Option<&KVCacheBackend> {
        self.backends.get(name).map(|b| &**b)
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<&KVCachePool> {
        self.pools.get(name).map(|p| &**p)
    }

    /// The Binding `name` in namespace `ns`.
    pub fn binding(&self, ns: &str, name: &str) -> Option<&KVCachePoolBinding> {
        self.bindings
            .get(&(ns.to_owned(), name.to_owned()))
            .map(|b| &**b)
    }

    /// The backend the pool `pool` draws on, when both exist.
    pub fn backend_of_pool(&self, pool: &str) -> Option<&KVCacheBackend> {
        self.pool(pool)
            .and_then(|p| p.spec.backend())
            .and_then(|b| self.backend(b))
    }

    /// The Binding `binding` in namespace `ns`, its pool and that pool's backend.
    pub fn chain(&self, ns: &str, binding: &str) -> Chain<'_> {
        let binding = self.binding(ns, binding);
        let pool = binding.and_then(|b| self.pool(&b.spec.pool_ref.name));
        let backend = pool
            .and_then(|p| p.spec.backend())
            .and_then(|b| self.backend(b));
        Chain {
            binding,
            pool,
            backend,
        }
    }

    /// The pools that draw on `backend`, by name.
    pub fn pools_on<'a>(&'a self, backend: &'a str) -> impl Iterator<Item = &'a KVCachePool> {
        self.pools()
            .filter(move |p| p.spec.backend() == Some(backend))
    }

    /// The pools that draw on `backend`, as the backend's `status.usedBy` lists them.
    pub fn consumers(&self, backend: &str) -> Vec<Consumer> {
        self.pools_on(backend)
            .map(|p| Consumer {
                kind: "KVCachePool".into(),
                namespace: None,
                name: name_of(&p.metadata),
            })
            .collect()
    }

    /// The Bindings that name the pool `pool`, by namespace and name.
    pub fn bindings_of_pool<'a>(
        &'a self,
        pool: &'a str,
    ) -> impl Iterator<Item = &'a KVCachePoolBinding> {
        self.bindings()
            .filter(move |b| b.spec.pool_ref.name == pool)
    }

    /// The Bindings whose pool draws on `backend`, by namespace and name.
    pub fn bindings_on<'a>(
        &'a self,
        backend: &'a str,
    ) -> impl Iterator<Item = &'a KVCachePoolBinding> {
        let pools: BTreeSet<&str> = self
            .pools_on(backend)
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        self.bindings()
            .filter(move |b| pools.contains(b.spec.pool_ref.name.as_str()))
    }

    /// Every claim on `backend`'s tenants, from the Bindings of all its pools (what
    /// `kvcache_quota::claims::contested` reads for `DomainExclusive`).
    pub fn claims_on(&self, backend: &str) -> Vec<Claim> {
        self.bindings_on(backend)
            .map(|b| Claim {
                backend: backend.to_owned(),
                tenant: tenant_of(b).to_owned(),
                binding: binding_id(b),
                pool: b.spec.pool_ref.name.clone(),
                releasing: b.metadata.deletion_timestamp.is_some(),
            })
            .collect()
    }

    /// The ceilings of every Binding on `backend` not being deleted (the master's seed policy:
    /// a deleted Binding's tenant is revoked, and a restarted master must not register it
    /// again), in `namespace/name` order, and the Bindings whose ceiling does not parse.
    pub fn ceilings_on(&self, backend: &str) -> (Vec<BindingCeiling>, Vec<Error>) {
        let mut ceilings = Vec::new();
        let mut errors = Vec::new();
        let live = self
            .bindings_on(backend)
            .filter(|b| b.metadata.deletion_timestamp.is_none());
        for b in live {
            match ceiling_view(b) {
                Ok(v) => ceilings.push(BindingCeiling {
                    binding: v.binding,
                    tenant: v.tenant,
                    ceiling_bytes: v.ceiling_bytes,
                }),
                Err(e) => errors.push(e.into()),
            }
        }
        ceilings.sort_by(|a, b| a.binding.cmp(&b.binding));
        (ceilings, errors)
    }

    /// The namespaces with a Binding on `backend` (whose engines may reach its store), sorted.
    /// A Binding being deleted no longer opens its namespace, whether or not ModelDeployments
    /// still name it (their replicas lose the store; their status says so): its release may
    /// wait on them and on data the tenant still holds, which only the operator needs to reach
    /// (docs/isolation.md#revocation). A backend dedicated to a namespace (`spec.tenancy`)
    /// opens that one alone, whatever Binding raced past admission.
    pub fn bound_namespaces(&self, backend: &str) -> Vec<String> {
        let dedicated = self
            .backend(backend)
            .and_then(|b| b.spec.tenancy.dedicated_to());
        self.bindings_on(backend)
            .filter(|b| b.metadata.deletion_timestamp.is_none())
            .filter_map(|b| b.metadata.namespace.clone())
            .filter(|ns| dedicated.is_none_or(|d| d == ns))
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect()
    }

    /// The ModelDeployments of the Binding's namespace that attach to it and are not being
    /// deleted, as the Binding's `status.usedBy` lists them.
    pub fn users(&self, b: &KVCachePoolBinding) -> Vec<Consumer> {
        let ns = b.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
        self.user_models(b)
            .map(|md| Consumer {
                kind: "ModelDeployment".into(),
                namespace: Some(ns.to_owned()),
                name: name_of(&md.metadata),
            })
            .collect()
    }

    /// The ModelDeployments behind [`World::users`].
    fn user_models<'a>(
        &'a self,
        b: &'a KVCachePoolBinding,
    ) -> impl Iterator<Item = &'a ModelDeployment> {
        let ns = b.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
        let name = b.metadata.name.as_deref().unwrap_or_default();
        self.models().filter(move |md| {
            md.metadata
                .namespace
                .as_deref()
                .unwrap_or(DEFAULT_NAMESPACE)
                == ns
                && md.metadata.deletion_timestamp.is_none()
                && md.spec.kv_cache.as_ref().map(|k| k.pool_ref.name.as_str()) == Some(name)
        })
    }

    /// The tenant's view of the shared cache: the `status.sharedCache` of the Binding's users
    /// summed (`None` while none reports one).
    pub fn tenant_shared_cache(
        &self,
        b: &KVCachePoolBinding,
    ) -> Option<kvcache_api::model::SharedCacheStatus> {
        let reported: Vec<&kvcache_api::model::SharedCacheStatus> = self
            .user_models(b)
            .filter_map(|md| md.status.as_ref()?.shared_cache.as_ref())
            .collect();
        crate::shared_cache::sum(&reported)
    }

    /// How a ModelDeployment's `kvCache.poolRef` resolves, and the Binding and backend it
    /// reaches when it does.
    pub fn resolve(
        &self,
        md: &ModelDeployment,
    ) -> (Resolution, Option<(&KVCachePoolBinding, &KVCacheBackend)>) {
        let Some(kv) = &md.spec.kv_cache else {
            return (Resolution::NotApplicable, None);
        };
        let ns = md
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(DEFAULT_NAMESPACE);
        let name = &kv.pool_ref.name;
        let chain = self.chain(ns, name);
        let Some(b) = chain.binding else {
            return (
                Resolution::BindingNotFound {
                    binding: name.clone(),
                    namespace: ns.to_owned(),
                },
                None,
            );
        };
        let who = format!("{ns}/{name}");
        if b.metadata.deletion_timestamp.is_some() {
            return (Resolution::BindingDeleted { binding: who }, None);
        }
        let Some(pool) = chain.pool else {
            let why = Unresolved::NoPool {
                pool: b.spec.pool_ref.name.clone(),
            };
            return (Resolution::BindingNotReady { binding: who, why }, None);
        };
        let Some(backend) = chain.backend else {
            let why = Unresolved::NoBackend {
                backend: pool.spec.backend().unwrap_or_default().to_owned(),
            };
            return (Resolution::BindingNotReady { binding: who, why }, None);
        };
        (
            Resolution::Resolved {
                binding: who,
                pool: name_of(&pool.metadata),
                tenant: tenant_of(b).to_owned(),
            },
            Some((b, backend)),
        )
    }
}

/// A Binding as the ledger sees it: `namespace/name`, its tenant and its ceiling in bytes, or
/// why the ceiling does not parse.
pub fn ceiling_view(
    b: &KVCachePoolBinding,
) -> Result<kvcache_quota::status::BindingView, kvcache_api::Error> {
    let binding = binding_id(b);
    let ceiling_bytes = b
        .spec
        .quota
        .ceiling
        .bytes(&format!("KVCachePoolBinding {binding} spec.quota.ceiling"))?;
    Ok(kvcache_quota::status::BindingView {
        tenant: tenant_of(b).to_owned(),
        binding,
        ceiling_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> World {
        world_with("")
    }

    /// The fixture and the manifests `extra` (each starting with `---`).
    fn world_with(extra: &str) -> World {
        let docs = r#"
apiVersion: worker.gpustack.ai/v1
kind: KVCacheBackend
metadata: {name: dram}
spec: {connection: {external: {endpoints: []}}}
---
apiVersion: worker.gpustack.ai/v1
kind: KVCachePool
metadata: {name: shared}
spec: {backends: [dram], quota: {total: 1Gi}}
---
apiVersion: worker.gpustack.ai/v1
kind: KVCachePool
metadata: {name: orphan}
spec: {backends: [gone], quota: {total: 1Gi}}
---
apiVersion: worker.gpustack.ai/v1
kind: KVCachePoolBinding
metadata: {name: team, namespace: team-b}
spec: {poolRef: {name: shared}, quota: {ceiling: 2Mi}, domain: {name: qwen, blockSize: 64, dtype: bfloat16}}
---
apiVersion: worker.gpustack.ai/v1
kind: KVCachePoolBinding
metadata: {name: team, namespace: team-a}
spec: {poolRef: {name: shared}, quota: {ceiling: 1Mi}, domain: {name: llama, blockSize: 64, dtype: bfloat16}}
---
apiVersion: worker.gpustack.ai/v1
kind: KVCachePoolBinding
metadata: {name: lost, namespace: team-a}
spec: {poolRef: {name: orphan}, quota: {ceiling: 1Mi}, domain: {name: lost, blockSize: 64, dtype: bfloat16}}
"#
        .to_owned()
            + extra;
        let objects: Vec<Object> = kvcache_api::manifest::parse("test", &docs)
            .expect("manifests")
            .into_iter()
            .map(|m| m.object)
            .collect();
        World::from_objects(&objects)
    }

    #[test]
    fn a_chain_stops_at_the_first_missing_link() {
        let w = world();
        let whole = w.chain("team-a", "team");
        assert!(whole.binding.is_some() && whole.pool.is_some() && whole.backend.is_some());
        let no_backend = w.chain("team-a", "lost");
        assert!(no_backend.pool.is_some() && no_backend.backend.is_none());
        let none = w.chain("team-c", "team");
        assert!(none.binding.is_none() && none.pool.is_none());
    }

    #[test]
    fn a_deleted_binding_closes_its_namespace_even_while_a_deployment_still_names_it() {
        let deleting = |w: &mut World, ns: &str| {
            let b = w
                .bindings
                .values_mut()
                .find(|b| {
                    b.metadata.namespace.as_deref() == Some(ns)
                        && b.metadata.name.as_deref() == Some("team")
                })
                .expect("the Binding");
            std::sync::Arc::make_mut(b).metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        };
        let mut w = world();
        deleting(&mut w, "team-b");
        assert_eq!(
            w.bound_namespaces("dram"),
            ["team-a"],
            "team-b has no user: closed"
        );
        let (seeded, _) = w.ceilings_on("dram");
        assert_eq!(
            seeded
                .iter()
                .map(|c| c.binding.as_str())
                .collect::<Vec<_>>(),
            ["team-a/team"],
            "a restarted master does not register team-b's revoked tenant again"
        );
        let mut w = world_with(
            "---\napiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata: {name: chat, namespace: team-a}\nspec: {model: {name: m}, engine: {name: vLLM}, kvCache: {poolRef: {name: team}}, roles: [{name: server, replicas: 1, instanceType: cpu}]}\n",
        );
        deleting(&mut w, "team-a");
        assert_eq!(
            w.bound_namespaces("dram"),
            ["team-b"],
            "team-a's deployment still names its Binding: closed all the same"
        );
        let (chat, _) = w
            .models()
            .next()
            .map(|md| w.resolve(md))
            .expect("the deployment");
        assert_eq!(
            chat,
            Resolution::BindingDeleted {
                binding: "team-a/team".into()
            },
            "the deployment is told why"
        );
    }

    #[test]
    fn a_dedicated_backend_opens_its_namespace_alone_whatever_binding_raced_past_admission() {
        let mut w = world();
        let dram = w.backend("dram").cloned().expect("the backend");
        let mut dedicated = dram.clone();
        dedicated.spec.tenancy =
            serde_json::from_value(serde_json::json!({"mode": "Dedicated", "namespace": "team-b"}))
                .expect("a tenancy");
        w.add_backend(std::sync::Arc::new(dedicated));
        assert_eq!(w.bound_namespaces("dram"), ["team-b"]);
    }

    #[test]
    fn a_backend_sees_the_claims_ceilings_and_namespaces_of_its_pools_bindings_only() {
        let w = world();
        let claims = w.claims_on("dram");
        let ids: Vec<&str> = claims.iter().map(|c| c.binding.as_str()).collect();
        assert_eq!(ids, ["team-a/team", "team-b/team"]);
        let (ceilings, errors) = w.ceilings_on("dram");
        assert!(errors.is_empty());
        assert_eq!(
            ceilings.iter().map(|c| c.ceiling_bytes).collect::<Vec<_>>(),
            [1 << 20, 2 << 20]
        );
        assert_eq!(w.bound_namespaces("dram"), ["team-a", "team-b"]);
        assert_eq!(w.consumers("dram").len(), 1);
        let elsewhere: Vec<String> = w.claims_on("gone").into_iter().map(|c| c.binding).collect();
        assert_eq!(elsewhere, ["team-a/lost"]);
    }
}
