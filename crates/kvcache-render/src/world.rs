//! The objects the operator reasons about together and how they reach one another: a
//! ModelDeployment or an engine Pod names a Binding in its own namespace, a Binding names a
//! pool, a pool names its backend. One [`World`] serves every place that follows that chain:
//! the offline `render` and `validate` (filled from manifests), the controllers (filled from
//! their shared caches) and the admission webhook (the caches, topped up with live reads).
//!
//! The chain itself, and how its first missing link is named, is
//! [`kvcache_api::relation::Relation`], which a World is (it dereferences to it) with the
//! ModelDeployments and InstanceTypes beside; `kvcache_quota::claims` judges over the same
//! relation. Pure: it holds what it is given and answers from it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::sync::Arc;

use kvcache_api::admission::tenant_of;
use kvcache_api::backend::ObjectRef as Consumer;
use kvcache_api::manifest::{Object, ObjectRef};
use kvcache_api::model::InstanceType;
pub use kvcache_api::relation::{Chain, Links, MissingLink};
use kvcache_api::relation::{DEFAULT_NAMESPACE, Relation, key_of};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_quota::ceiling::BindingCeiling;
use kvcache_quota::claims::Claim;

use crate::error::Error;

/// Backends, pools and Bindings (the [`Relation`] it dereferences to), ModelDeployments and
/// InstanceTypes, each at most once by name.
#[derive(Clone, Debug, Default)]
pub struct World {
    relation: Relation,
    /// Keyed by `(namespace, name)`.
    models: BTreeMap<(String, String), Arc<ModelDeployment>>,
    instance_types: BTreeMap<String, Arc<InstanceType>>,
}

impl Deref for World {
    type Target = Relation;

    fn deref(&self) -> &Relation {
        &self.relation
    }
}

pub use crate::names::binding_id;

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// The namespace a ModelDeployment's Binding is looked up in: its own.
fn namespace_of(md: &ModelDeployment) -> &str {
    md.metadata
        .namespace
        .as_deref()
        .unwrap_or(DEFAULT_NAMESPACE)
}

/// How a ModelDeployment's `kvCache.poolRef` resolved this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// No `kvCache`: nothing to attach.
    NotApplicable,
    /// No Binding of that name in the deployment's namespace.
    BindingNotFound {
        /// The name `spec.kvCache.poolRef.name` gives.
        binding: String,
        /// The namespace looked in.
        namespace: String,
    },
    /// The Binding was deleted (it stays, terminating, while its release waits): its namespace
    /// no longer reaches the store.
    BindingDeleted {
        /// The Binding, as `namespace/name`.
        binding: String,
    },
    /// The Binding exists but its pool or backend does not resolve.
    BindingNotReady {
        /// The Binding, as `namespace/name`.
        binding: String,
        /// Which of its pool and backend is missing.
        why: Unresolved,
    },
    /// Binding, pool and domain.
    Resolved {
        /// The Binding, as `namespace/name`.
        binding: String,
        /// Name of the KVCachePool the Binding's `spec.poolRef` names.
        pool: String,
        /// The tenant id: the Binding's `spec.domain.name`, `default` when empty.
        tenant: String,
    },
}

/// Which link of a Binding's chain (Binding, pool, backend) is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// The KVCachePool the Binding's `spec.poolRef` names does not exist.
    NoPool {
        /// The pool's name.
        pool: String,
    },
    /// The KVCacheBackend the Binding's pool draws on does not exist.
    NoBackend {
        /// The backend's name (empty when the pool names none).
        backend: String,
    },
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresolved::NoPool { pool } => write!(f, "its KVCachePool {pool} does not exist"),
            Unresolved::NoBackend { backend } => {
                write!(f, "its pool's KVCacheBackend {backend} does not exist")
            }
        }
    }
}

impl Resolution {
    /// The resolution of a `kvCache.poolRef` naming the Binding `binding` (`namespace/name`)
    /// whose chain stops at `link`.
    fn missing(link: MissingLink, binding: String) -> Resolution {
        match link {
            MissingLink::Binding { namespace, name } => Resolution::BindingNotFound {
                binding: name,
                namespace,
            },
            MissingLink::Pool { pool, .. } => Resolution::BindingNotReady {
                binding,
                why: Unresolved::NoPool { pool },
            },
            MissingLink::Backend { backend, .. } => Resolution::BindingNotReady {
                binding,
                why: Unresolved::NoBackend { backend },
            },
        }
    }
}

/// A missing link of a ModelDeployment's chain as the render reports it: the object and field
/// naming it (`md`'s `spec.kvCache.poolRef.name` for its Binding), with what to do.
pub(crate) fn missing_error(link: MissingLink, md: &ModelDeployment) -> Error {
    let (referrer, field, hint) = match (link.referrer(), link.field()) {
        (Some(r), Some(f)) => (r.clone(), f, ""),
        _ => (
            ObjectRef::new("ModelDeployment", &md.metadata),
            "spec.kvCache.poolRef.name",
            "; name a KVCachePoolBinding in the ModelDeployment's own namespace",
        ),
    };
    Error::Missing {
        referrer: Box::new(referrer),
        field,
        kind: link.kind(),
        name: link.name(),
        hint,
    }
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

    /// A world of parsed manifests (`kvcache-operator render` and `validate`), the Bindings in
    /// the order given.
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
        self.relation.add_backend(b);
    }

    /// Adds a pool, replacing one of the same name.
    pub fn add_pool(&mut self, p: Arc<KVCachePool>) {
        self.relation.add_pool(p);
    }

    /// Adds a Binding, replacing one of the same namespace and name.
    pub fn add_binding(&mut self, b: Arc<KVCachePoolBinding>) {
        self.relation.add_binding(b);
    }

    /// Adds a ModelDeployment, replacing one of the same namespace and name.
    pub(crate) fn add_model(&mut self, m: Arc<ModelDeployment>) {
        self.models.insert(key_of(&m.metadata), m);
    }

    /// Adds an InstanceType, replacing one of the same name.
    pub fn add_instance_type(&mut self, i: Arc<InstanceType>) {
        self.instance_types.insert(name_of(&i.metadata), i);
    }

    /// Removes the Binding `name` in namespace `ns` (a live read found it gone).
    pub fn remove_binding(&mut self, ns: &str, name: &str) {
        self.relation.remove_binding(ns, name);
    }

    /// A copy holding every object but, of the Bindings, only those `keep` accepts (asked in
    /// namespace/name order, which becomes the order they came in): what one admission
    /// request is judged beside.
    pub fn narrowed(&self, keep: impl FnMut(&KVCachePoolBinding) -> bool) -> World {
        World {
            relation: self.relation.narrowed(keep),
            models: self.models.clone(),
            instance_types: self.instance_types.clone(),
        }
    }

    /// Every ModelDeployment, by namespace and name.
    pub fn models(&self) -> impl Iterator<Item = &ModelDeployment> {
        self.models.values().map(|m| &**m)
    }

    /// Every InstanceType, by name.
    pub fn instance_types(&self) -> impl Iterator<Item = &InstanceType> {
        self.instance_types.values().map(|i| &**i)
    }

    /// The InstanceType named `name`.
    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.get(name).map(|i| &**i)
    }

    /// The InstanceTypes by name, as the ModelDeployment render takes them.
    pub fn instance_type_map(&self) -> BTreeMap<String, InstanceType> {
        self.instance_types
            .iter()
            .map(|(n, i)| (n.clone(), (**i).clone()))
            .collect()
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
    pub(crate) fn ceilings_on(&self, backend: &str) -> (Vec<BindingCeiling>, Vec<Error>) {
        let mut ceilings = Vec::new();
        let mut errors = Vec::new();
        let live = self
            .bindings_on(backend)
            .filter(|b| b.metadata.deletion_timestamp.is_none());
        for b in live {
            match ceiling_view(b) {
                Ok(c) => ceilings.push(c),
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
    pub(crate) fn user_models<'a>(
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

    /// What a ModelDeployment's `kvCache.poolRef` reaches in its namespace (nothing without a
    /// `kvCache`).
    pub(crate) fn chain_of_model(&self, md: &ModelDeployment) -> Chain<'_> {
        match &md.spec.kv_cache {
            Some(kv) => self.chain(namespace_of(md), &kv.pool_ref.name),
            None => Chain::default(),
        }
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
        let (ns, name) = (namespace_of(md), &kv.pool_ref.name);
        let chain = self.chain_of_model(md);
        let who = format!("{ns}/{name}");
        if chain
            .binding
            .is_some_and(|b| b.metadata.deletion_timestamp.is_some())
        {
            return (Resolution::BindingDeleted { binding: who }, None);
        }
        match chain.links(ns, name) {
            Ok(l) => (
                Resolution::Resolved {
                    binding: who,
                    pool: name_of(&l.pool.metadata),
                    tenant: tenant_of(l.binding).to_owned(),
                },
                Some((l.binding, l.backend)),
            ),
            Err(link) => (Resolution::missing(link, who), None),
        }
    }
}

/// A Binding as the ledger sees it: `namespace/name`, its tenant and its ceiling in bytes, or
/// why the ceiling does not parse.
pub(crate) fn ceiling_view(b: &KVCachePoolBinding) -> Result<BindingCeiling, kvcache_api::Error> {
    let binding = binding_id(b);
    let ceiling_bytes = b
        .spec
        .quota
        .ceiling
        .bytes(&format!("KVCachePoolBinding {binding} spec.quota.ceiling"))?;
    Ok(BindingCeiling {
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
            let mut b = w.binding(ns, "team").cloned().expect("the Binding");
            b.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            w.add_binding(std::sync::Arc::new(b));
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
