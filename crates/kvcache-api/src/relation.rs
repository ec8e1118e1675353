//! How the cache kinds reach one another: a KVCachePoolBinding names a pool, a pool names its
//! backend. [`Relation`] holds backends, pools and Bindings by name and answers every walk of
//! that chain, so each reader (the render's `World`, the quota's cross-object claims, the
//! admission webhook, the controllers) follows it the same way, and names the first link
//! missing the same way ([`MissingLink`]).
//!
//! Pure: it holds what it is given and answers from it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::backend::KVCacheBackend;
use crate::manifest::ObjectRef;
use crate::pool::{KVCachePool, KVCachePoolBinding};

/// The namespace a namespaced object without one is read in (as `kubectl apply` would).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Backends, pools and Bindings, each at most once by name, and the order the Bindings came in.
#[derive(Clone, Debug, Default)]
pub struct Relation {
    backends: BTreeMap<String, Arc<KVCacheBackend>>,
    pools: BTreeMap<String, Arc<KVCachePool>>,
    /// Keyed by `(namespace, name)`, with the turn each came in.
    bindings: BTreeMap<(String, String), (u64, Arc<KVCachePoolBinding>)>,
    /// The turn the next Binding gets.
    turn: u64,
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

/// A whole chain: the Binding, its pool and the pool's backend.
#[derive(Clone, Copy, Debug)]
pub struct Links<'a> {
    /// The Binding.
    pub binding: &'a KVCachePoolBinding,
    /// The pool it names.
    pub pool: &'a KVCachePool,
    /// The backend the pool draws on.
    pub backend: &'a KVCacheBackend,
}

/// The first link missing on the way from a Binding's name to its backend: what every reader
/// of the chain reports, each in its own words (a render error, a condition, a refused Pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissingLink {
    /// No Binding of that name in that namespace.
    Binding {
        /// The namespace looked in.
        namespace: String,
        /// The name asked for.
        name: String,
    },
    /// The Binding names a pool that does not exist.
    Pool {
        /// The Binding.
        binding: ObjectRef,
        /// The pool it names.
        pool: String,
    },
    /// The pool names a backend that does not exist.
    Backend {
        /// The pool.
        pool: ObjectRef,
        /// The backend it names (empty when it names none).
        backend: String,
    },
}

impl MissingLink {
    /// The kind of the object that does not exist.
    pub fn kind(&self) -> &'static str {
        match self {
            MissingLink::Binding { .. } => "KVCachePoolBinding",
            MissingLink::Pool { .. } => "KVCachePool",
            MissingLink::Backend { .. } => "KVCacheBackend",
        }
    }

    /// Its name (`namespace/name` for a Binding).
    pub fn name(&self) -> String {
        match self {
            MissingLink::Binding { namespace, name } => format!("{namespace}/{name}"),
            MissingLink::Pool { pool, .. } => pool.clone(),
            MissingLink::Backend { backend, .. } => backend.clone(),
        }
    }

    /// The object of the chain whose field names it; `None` for a Binding, which a
    /// ModelDeployment or a Pod names from outside the chain.
    pub fn referrer(&self) -> Option<&ObjectRef> {
        match self {
            MissingLink::Binding { .. } => None,
            MissingLink::Pool { binding, .. } => Some(binding),
            MissingLink::Backend { pool, .. } => Some(pool),
        }
    }

    /// The field of [`MissingLink::referrer`] that names it.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            MissingLink::Binding { .. } => None,
            MissingLink::Pool { .. } => Some("spec.poolRef.name"),
            MissingLink::Backend { .. } => Some("spec.backends[0]"),
        }
    }
}

impl fmt::Display for MissingLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.referrer() {
            Some(by) => write!(
                f,
                "{by} names {} {}, which does not exist",
                self.kind(),
                self.name()
            ),
            None => write!(f, "{} {} does not exist", self.kind(), self.name()),
        }
    }
}

impl<'a> Chain<'a> {
    /// The whole chain, or the first link missing (`namespace` and `name`: the Binding as it
    /// was asked for).
    pub fn links(self, namespace: &str, name: &str) -> Result<Links<'a>, MissingLink> {
        let binding = self.binding.ok_or_else(|| MissingLink::Binding {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })?;
        let pool = self.pool.ok_or_else(|| MissingLink::Pool {
            binding: ObjectRef::new("KVCachePoolBinding", &binding.metadata),
            pool: binding.spec.pool_ref.name.clone(),
        })?;
        let backend = self.backend.ok_or_else(|| MissingLink::Backend {
            pool: ObjectRef::new("KVCachePool", &pool.metadata),
            backend: pool.spec.backend().unwrap_or_default().to_owned(),
        })?;
        Ok(Links {
            binding,
            pool,
            backend,
        })
    }
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// `(namespace, name)` of a namespaced object, [`DEFAULT_NAMESPACE`] when it has none: how a
/// [`Relation`] keys it.
pub fn key_of(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
        name_of(meta),
    )
}

impl Relation {
    /// Adds a backend, replacing one of the same name.
    pub fn add_backend(&mut self, b: Arc<KVCacheBackend>) {
        self.backends.insert(name_of(&b.metadata), b);
    }

    /// A relation of `pools` alone: which backend each names, and which pools name a backend.
    pub fn of_pools(pools: impl IntoIterator<Item = Arc<KVCachePool>>) -> Relation {
        let mut out = Relation::default();
        for p in pools {
            out.add_pool(p);
        }
        out
    }

    /// Adds a pool, replacing one of the same name.
    pub fn add_pool(&mut self, p: Arc<KVCachePool>) {
        self.pools.insert(name_of(&p.metadata), p);
    }

    /// Adds a Binding, replacing one of the same namespace and name (the replacement takes the
    /// latest turn).
    pub fn add_binding(&mut self, b: Arc<KVCachePoolBinding>) {
        self.turn += 1;
        self.bindings.insert(key_of(&b.metadata), (self.turn, b));
    }

    /// Removes the Binding `name` in namespace `ns`.
    pub fn remove_binding(&mut self, ns: &str, name: &str) {
        self.bindings.remove(&(ns.to_owned(), name.to_owned()));
    }

    /// A copy holding every backend and pool and, of the Bindings, those `keep` accepts, asked
    /// in namespace/name order (which becomes the order they came in).
    pub fn narrowed(&self, mut keep: impl FnMut(&KVCachePoolBinding) -> bool) -> Relation {
        let mut out = Relation {
            backends: self.backends.clone(),
            pools: self.pools.clone(),
            ..Relation::default()
        };
        for (_, b) in self.bindings.values() {
            if keep(b) {
                out.add_binding(b.clone());
            }
        }
        out
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
        self.bindings.values().map(|(_, b)| &**b)
    }

    /// Every Binding in the order it came in: the order claims are judged in, a later claim
    /// on a held name being the duplicate. A relation filled from manifests keeps their order,
    /// and one narrowed (`narrowed`) the name order; one filled from a cache has the cache's
    /// arbitrary order, which is why the webhook judges claims over a narrowed one.
    pub fn bindings_as_given(&self) -> impl Iterator<Item = &KVCachePoolBinding> {
        let mut given: Vec<&(u64, Arc<KVCachePoolBinding>)> = self.bindings.values().collect();
        given.sort_by_key(|(turn, _)| *turn);
        given.into_iter().map(|(_, b)| &**b)
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
            .map(|(_, b)| &**b)
    }

    /// The pool a Binding names, when it exists.
    pub fn pool_of(&self, b: &KVCachePoolBinding) -> Option<&KVCachePool> {
        self.pool(&b.spec.pool_ref.name)
    }

    /// The backend a pool draws on, when it exists.
    pub fn backend_of(&self, p: &KVCachePool) -> Option<&KVCacheBackend> {
        p.spec.backend().and_then(|b| self.backend(b))
    }

    /// The backend the pool named `pool` draws on, when both exist.
    pub fn backend_of_pool(&self, pool: &str) -> Option<&KVCacheBackend> {
        self.pool(pool).and_then(|p| self.backend_of(p))
    }

    /// The name of the backend a Binding's pool draws on, when that pool exists (empty when
    /// the pool names none); the backend itself need not exist.
    pub fn backend_name_of(&self, b: &KVCachePoolBinding) -> Option<&str> {
        self.pool_of(b)
            .map(|p| p.spec.backend().unwrap_or_default())
    }

    /// The Binding `binding` in namespace `ns`, its pool and that pool's backend.
    pub fn chain(&self, ns: &str, binding: &str) -> Chain<'_> {
        match self.binding(ns, binding) {
            Some(b) => self.chain_of(b),
            None => Chain::default(),
        }
    }

    /// A Binding in hand, its pool and that pool's backend.
    pub fn chain_of<'a>(&'a self, b: &'a KVCachePoolBinding) -> Chain<'a> {
        let pool = self.pool_of(b);
        Chain {
            binding: Some(b),
            pool,
            backend: pool.and_then(|p| self.backend_of(p)),
        }
    }

    /// The Binding `name` in namespace `ns`, its pool and backend, or the first link missing.
    pub fn reach(&self, ns: &str, name: &str) -> Result<Links<'_>, MissingLink> {
        self.chain(ns, name).links(ns, name)
    }

    /// The pools that draw on `backend`, by name.
    pub fn pools_on<'a>(&'a self, backend: &'a str) -> impl Iterator<Item = &'a KVCachePool> {
        self.pools()
            .filter(move |p| p.spec.backend() == Some(backend))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation() -> Relation {
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
spec: {poolRef: {name: nowhere}, quota: {ceiling: 1Mi}, domain: {name: lost, blockSize: 64, dtype: bfloat16}}
---
apiVersion: worker.gpustack.ai/v1
kind: KVCachePoolBinding
metadata: {name: stray, namespace: team-a}
spec: {poolRef: {name: orphan}, quota: {ceiling: 1Mi}, domain: {name: stray, blockSize: 64, dtype: bfloat16}}
"#;
        let mut r = Relation::default();
        for m in crate::manifest::parse("test", docs).expect("manifests") {
            match m.object {
                crate::manifest::Object::Backend(b) => r.add_backend(Arc::new(*b)),
                crate::manifest::Object::Pool(p) => r.add_pool(Arc::new(*p)),
                crate::manifest::Object::Binding(b) => r.add_binding(Arc::new(*b)),
                _ => {}
            }
        }
        r
    }

    #[test]
    fn the_first_missing_link_is_named_with_who_names_it_and_in_which_field() {
        let r = relation();
        assert!(r.reach("team-a", "team").is_ok());
        let missing = |ns: &str, name: &str| r.reach(ns, name).expect_err("a missing link");
        let none = missing("team-c", "team");
        assert_eq!(
            none.to_string(),
            "KVCachePoolBinding team-c/team does not exist"
        );
        assert_eq!((none.referrer(), none.field()), (None, None));
        let pool = missing("team-a", "lost");
        assert_eq!(
            pool.to_string(),
            "KVCachePoolBinding team-a/lost names KVCachePool nowhere, which does not exist"
        );
        assert_eq!(pool.field(), Some("spec.poolRef.name"));
        let backend = missing("team-a", "stray");
        assert_eq!(
            backend.to_string(),
            "KVCachePool orphan names KVCacheBackend gone, which does not exist"
        );
        assert_eq!(
            (backend.kind(), backend.field()),
            ("KVCacheBackend", Some("spec.backends[0]"))
        );
    }

    #[test]
    fn bindings_come_back_in_the_order_given_and_a_narrowed_copy_in_name_order() {
        let r = relation();
        let ids = |it: Vec<&KVCachePoolBinding>| -> Vec<String> {
            it.iter()
                .map(|b| key_of(&b.metadata))
                .map(|(ns, n)| format!("{ns}/{n}"))
                .collect()
        };
        assert_eq!(
            ids(r.bindings_as_given().collect()),
            ["team-b/team", "team-a/team", "team-a/lost", "team-a/stray"]
        );
        let on_dram = r.narrowed(|b| r.backend_name_of(b) == Some("dram"));
        assert_eq!(
            ids(on_dram.bindings_as_given().collect()),
            ["team-a/team", "team-b/team"]
        );
        assert_eq!(
            ids(r.bindings_on("dram").collect()),
            ids(on_dram.bindings().collect())
        );
        assert_eq!(
            r.backend_name_of(r.binding("team-a", "lost").expect("b")),
            None
        );
        assert!(r.backend_of_pool("shared").is_some() && r.backend_of_pool("orphan").is_none());
    }
}
