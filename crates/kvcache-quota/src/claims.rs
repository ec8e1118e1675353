//! Domain claims: a tenant name is held by one Binding per backend object, cluster-wide.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kvcache_api::backend::KVCacheBackend;
use kvcache_api::manifest::{Object, ObjectRef};
use kvcache_api::pool::pool_conditions::QUOTA_LEDGER_AVAILABLE;
use kvcache_api::pool::{KVCachePool, KVCachePoolBinding};
use kvcache_api::relation::Relation;

/// One Binding's claim on a tenant of a backend.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    /// The backend object the Binding's pool uses.
    pub backend: String,
    /// The tenant (the domain name; `default` when omitted).
    pub tenant: String,
    /// `namespace/name` of the Binding.
    pub binding: String,
    /// The pool the Binding names.
    pub pool: String,
    /// Whether the Binding is being deleted. It holds its domain until its finalizer is gone:
    /// until then the master still keeps the tenant's data, which a new claim would inherit.
    pub releasing: bool,
}

/// A second claim on a tenant already held on the same backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateDomain {
    /// The Binding that holds the name.
    pub holder: String,
    /// Name of the KVCacheBackend both Bindings' pools use.
    pub backend: String,
    /// The tenant id claimed twice (the domain name; `default` when omitted).
    pub tenant: String,
    /// Whether the holder is being deleted (see [`Claim::releasing`]).
    pub holder_releasing: bool,
}

impl fmt::Display for DuplicateDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.holder_releasing {
            write!(
                f,
                "domain {:?} is still held on backend {} by KVCachePoolBinding {}, which is being deleted: the master keeps that tenant's data until the release finishes, and a new claim would inherit it; wait until {} is gone (its Releasable condition says what it waits for), or choose another spec.domain.name",
                self.tenant, self.backend, self.holder, self.holder
            )
        } else {
            write!(
                f,
                "domain {:?} is already held on backend {} by KVCachePoolBinding {}: a domain name is claimed once per backend (an omitted name counts as \"default\"); choose another spec.domain.name",
                self.tenant, self.backend, self.holder
            )
        }
    }
}

/// Admission (docs/design.md#domain-claims): refuses `candidate` when another Binding already
/// claims its tenant on the same backend, a Binding being deleted included. The same name on
/// another backend is fine.
pub fn check(existing: &[Claim], candidate: &Claim) -> Result<(), DuplicateDomain> {
    match existing.iter().find(|c| {
        c.backend == candidate.backend
            && c.tenant == candidate.tenant
            && c.binding != candidate.binding
    }) {
        Some(holder) => Err(DuplicateDomain {
            holder: holder.binding.clone(),
            backend: holder.backend.clone(),
            tenant: holder.tenant.clone(),
            holder_releasing: holder.releasing,
        }),
        None => Ok(()),
    }
}

/// Bindings that raced past admission onto one tenant of one backend: for each Binding in such
/// a group, the other claimants. Bindings not listed hold their domain alone.
pub fn contested(claims: &[Claim]) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for c in claims {
        groups
            .entry((c.backend.as_str(), c.tenant.as_str()))
            .or_default()
            .push(&c.binding);
    }
    let mut out = BTreeMap::new();
    for holders in groups.values().filter(|h| h.len() > 1) {
        for b in holders {
            let mut others: Vec<String> = holders
                .iter()
                .filter(|o| *o != b)
                .map(|o| (*o).to_owned())
                .collect();
            others.sort();
            out.insert((*b).to_owned(), others);
        }
    }
    out
}

/// Pool admission (docs/design.md#pool-admission): a pool over a managed backend that declares
/// `multiTenancy: false` is admitted with this warning. External backends are not inspected.
pub fn pool_warning(pool: &str, backend: &kvcache_api::KVCacheBackend) -> Option<String> {
    let managed = backend.spec.connection.managed.as_ref()?;
    (!managed.leader.multi_tenancy).then(|| {
        format!(
            "KVCachePool {pool}: KVCacheBackend {} declares leader.multiTenancy: false, so no per-tenant quota is enforced; Bindings report QuotaGranted=True/Unenforced and every write lands in the store's default tenant",
            backend.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// A second domain on a backend whose master keeps no ledger (docs/design.md#second-domain).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "KVCacheBackend {backend} keeps no tenant ledger (multi-tenancy off), so it can serve only one reuse domain and already serves {serves:?}; use that domain, or a backend with multi-tenancy"
)]
pub struct SecondDomainWithoutLedger {
    /// Name of the KVCacheBackend whose master keeps no tenant ledger.
    pub backend: String,
    /// The domain it already serves.
    pub serves: String,
}

/// Binding admission (docs/design.md#second-domain): a second distinct domain on a backend.
/// Refused when the master is known to keep no ledger (it would mix both domains in one tenant);
/// a warning when the ledger's state is not known.
pub fn second_domain(
    backend: &str,
    ledger: Option<bool>,
    tenants_on_backend: &[String],
    candidate: &str,
) -> Result<Option<String>, SecondDomainWithoutLedger> {
    let distinct = tenants_on_backend.iter().any(|t| t != candidate);
    match (distinct, ledger) {
        (false, _) | (true, Some(true)) => Ok(None),
        (true, Some(false)) => Err(SecondDomainWithoutLedger {
            backend: backend.to_owned(),
            serves: tenants_on_backend.first().cloned().unwrap_or_default(),
        }),
        (true, None) => Ok(Some(format!(
            "tenant support of KVCacheBackend {backend} is unproven (its ledger has not been read): a second domain needs a multi-tenant master, and engine images that forward the tenant id"
        ))),
    }
}

/// What a cross-object finding is, in the API server's cause vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FindingKind {
    /// Admitted with a warning.
    Warning,
    /// `FieldValueDuplicate`: a name already held.
    Duplicate,
    /// `FieldValueForbidden`: not allowed given other objects.
    Forbidden,
}

/// A cross-object finding on a set of objects (what the admission webhook judges against the
/// cluster, judged here against the objects given together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The object refused or warned about (the later of two claims on a domain, say).
    pub object: ObjectRef,
    /// The field the finding is about (`spec.domain.name`).
    pub field: &'static str,
    /// A warning or a refusal of some kind.
    pub kind: FindingKind,
    /// What and why.
    pub message: String,
}

impl Finding {
    /// Whether the finding refuses the object.
    pub fn refused(&self) -> bool {
        self.kind != FindingKind::Warning
    }
}

/// The cross-object findings on `candidate` (docs/design.md#domain-claims, #pool-admission,
/// #second-domain; who shares a backend: `crate::tenancy`, docs/isolation.md#tenancy), judged
/// as if it came after the objects of `relation` (a copy of it among them is ignored): domain
/// claims per backend and a second domain on a backend without a ledger for a Binding, the
/// warning for a single-tenant backend for a pool. The Bindings of `relation` on the same
/// backend are judged first, in the order they came in: a later claim on a held name is the
/// duplicate, and a refused one holds nothing.
pub fn cross_object(relation: &Relation, candidate: &Object) -> Vec<Finding> {
    match candidate {
        Object::Pool(p) => pool_findings(relation, p),
        Object::Binding(b) => binding_findings(relation, b),
        _ => Vec::new(),
    }
}

/// A pool over a backend declaring `multiTenancy: false`: [`pool_warning`].
fn pool_findings(relation: &Relation, p: &KVCachePool) -> Vec<Finding> {
    let name = p.metadata.name.clone().unwrap_or_default();
    relation
        .backend_of(p)
        .and_then(|b| pool_warning(&name, b))
        .map(|w| Finding {
            object: ObjectRef::new("KVCachePool", &p.metadata),
            field: "spec.backends",
            kind: FindingKind::Warning,
            message: w,
        })
        .into_iter()
        .collect()
}

/// A Binding's findings, after every other Binding of `relation` on its pool's backend.
fn binding_findings(relation: &Relation, candidate: &KVCachePoolBinding) -> Vec<Finding> {
    let Some(backend) = relation.backend_name_of(candidate) else {
        return Vec::new();
    };
    let me = ObjectRef::new("KVCachePoolBinding", &candidate.metadata);
    let mut judged = OnBackend::new(relation, backend);
    for b in relation.bindings_as_given() {
        if relation.backend_name_of(b) == Some(backend)
            && ObjectRef::new("KVCachePoolBinding", &b.metadata) != me
        {
            judged.judge(b);
        }
    }
    judged.judge(candidate)
}

/// What the Bindings judged so far on one backend hold: each tenant's first holder, up to two
/// distinct tenants in the order they came (enough for [`second_domain`]: whether another
/// tenant is there, and which came first) and the namespaces already on it
/// (docs/isolation.md#tenancy).
struct OnBackend<'a> {
    /// The backend's name.
    backend: &'a str,
    /// The backend, when it exists.
    known: Option<&'a KVCacheBackend>,
    /// Whether its master keeps a ledger: declared off wins; otherwise what a pool observed;
    /// otherwise what is declared, or unknown.
    ledger: Option<bool>,
    held: BTreeMap<String, Claim>,
    tenants: Vec<String>,
    namespaces: BTreeSet<String>,
}

impl<'a> OnBackend<'a> {
    fn new(relation: &'a Relation, backend: &'a str) -> Self {
        let known = relation.backend(backend);
        // What the pools observed of the ledger (objects from the cluster carry status;
        // manifests do not): `QuotaLedgerAvailable` True, or False/`MultiTenancyDisabled`.
        let observed = relation
            .pools_on(backend)
            .filter_map(|p| {
                p.status
                    .iter()
                    .flat_map(|s| s.conditions.iter())
                    .find(|c| c.type_ == QUOTA_LEDGER_AVAILABLE)
                    .and_then(|c| match (c.status.as_str(), c.reason.as_str()) {
                        ("True", _) => Some(true),
                        ("False", "MultiTenancyDisabled") => Some(false),
                        _ => None,
                    })
            })
            .last();
        let ledger = match known
            .and_then(|be| be.spec.connection.managed.as_ref())
            .map(|m| m.leader.multi_tenancy)
        {
            Some(false) => Some(false),
            declared => observed.or(declared),
        };
        OnBackend {
            backend,
            known,
            ledger,
            held: BTreeMap::new(),
            tenants: Vec::new(),
            namespaces: BTreeSet::new(),
        }
    }

    /// Judges `b` after the Bindings judged before it: its findings; unless one refuses it, it
    /// then holds its claim.
    fn judge(&mut self, b: &KVCachePoolBinding) -> Vec<Finding> {
        let finding = |field, kind, message| Finding {
            object: ObjectRef::new("KVCachePoolBinding", &b.metadata),
            field,
            kind,
            message,
        };
        let claim = Claim {
            backend: self.backend.to_owned(),
            tenant: kvcache_api::admission::tenant_of(b).to_owned(),
            binding: format!(
                "{}/{}",
                b.metadata.namespace.clone().unwrap_or_default(),
                b.metadata.name.clone().unwrap_or_default()
            ),
            pool: b.spec.pool_ref.name.clone(),
            releasing: b.metadata.deletion_timestamp.is_some(),
        };
        let holder = self.held.get(&claim.tenant).map(std::slice::from_ref);
        if let Err(dup) = check(holder.unwrap_or_default(), &claim) {
            let message = dup.to_string();
            return vec![finding("spec.domain.name", FindingKind::Duplicate, message)];
        }
        let mut out = Vec::new();
        let namespace = b.metadata.namespace.as_deref().unwrap_or("default");
        let on = &self.namespaces;
        match crate::tenancy::binding(self.backend, self.known, &claim.pool, namespace, on) {
            Ok(Some(w)) => out.push(finding("spec.poolRef.name", FindingKind::Warning, w)),
            Ok(None) => {}
            Err(e) => {
                let message = e.to_string();
                out.push(finding(
                    "spec.poolRef.name",
                    FindingKind::Forbidden,
                    message,
                ));
                return out;
            }
        }
        match second_domain(self.backend, self.ledger, &self.tenants, &claim.tenant) {
            Ok(Some(w)) => out.push(finding("spec.domain.name", FindingKind::Warning, w)),
            Ok(None) => {}
            Err(e) => {
                let message = e.to_string();
                out.push(finding("spec.domain.name", FindingKind::Forbidden, message));
                return out;
            }
        }
        if self.tenants.len() < 2 && !self.tenants.contains(&claim.tenant) {
            self.tenants.push(claim.tenant.clone());
        }
        self.namespaces.insert(namespace.to_owned());
        self.held.entry(claim.tenant.clone()).or_insert(claim);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(backend: &str, tenant: &str, binding: &str) -> Claim {
        Claim {
            backend: backend.into(),
            tenant: tenant.into(),
            binding: binding.into(),
            pool: "p".into(),
            releasing: false,
        }
    }

    fn object(v: serde_json::Value) -> Object {
        let text = serde_json::to_string(&v).expect("JSON");
        kvcache_api::manifest::parse("test", &text)
            .expect("parses")
            .remove(0)
            .object
    }

    /// Each Binding of `objects` judged in turn against every backend and pool of `objects` and
    /// the Bindings before it: the findings of all.
    fn in_turn(objects: &[Object]) -> Vec<Finding> {
        use std::sync::Arc;
        let mut relation = Relation::default();
        for o in objects {
            match o {
                Object::Backend(b) => relation.add_backend(Arc::new((**b).clone())),
                Object::Pool(p) => relation.add_pool(Arc::new((**p).clone())),
                _ => {}
            }
        }
        let mut out = Vec::new();
        for o in objects {
            if let Object::Binding(b) = o {
                out.extend(cross_object(&relation, o));
                relation.add_binding(Arc::new((**b).clone()));
            }
        }
        out
    }

    #[test]
    fn a_pool_observing_no_ledger_makes_a_second_domain_on_an_external_store_a_refusal() {
        let backend = object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "ext"},
            "spec": {"connection": {"external": {"endpoints": [
                {"name": "Client", "address": "m:50051"}, {"name": "Admin", "address": "m:9003"}]}}}
        }));
        let pool = |ledger: Option<(&str, &str)>| {
            let mut v = serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "p"},
                "spec": {"backends": ["ext"], "quota": {"total": "1Gi"}}
            });
            if let Some((status, reason)) = ledger {
                v["status"] = serde_json::json!({"conditions": [{"type": "QuotaLedgerAvailable",
                    "status": status, "reason": reason, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
            }
            object(v)
        };
        let binding = |ns: &str, domain: &str| {
            object(serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
                "metadata": {"name": "b", "namespace": ns},
                "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                         "domain": {"name": domain, "blockSize": 64, "dtype": "bfloat16"}}
            }))
        };
        let second = |ledger| {
            in_turn(&[
                backend.clone(),
                pool(ledger),
                binding("a", "qwen"),
                binding("b", "llama"),
            ])
            .into_iter()
            .find(|f| f.object.namespace.as_deref() == Some("b") && f.field == "spec.domain.name")
            .map(|f| f.kind)
        };
        assert_eq!(
            second(Some(("False", "MultiTenancyDisabled"))),
            Some(FindingKind::Forbidden)
        );
        assert_eq!(second(Some(("True", "LedgerRead"))), None);
        assert_eq!(
            second(None),
            Some(FindingKind::Warning),
            "unknown: a warning"
        );
        assert_eq!(
            second(Some(("False", "LedgerUnreachable"))),
            Some(FindingKind::Warning)
        );
    }

    #[test]
    fn a_pool_on_a_single_tenant_backend_is_warned_and_a_stored_copy_is_not_its_own_rival() {
        use std::sync::Arc;
        let backend = object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
            "spec": {"connection": {"managed": {"leader": {"multiTenancy": false},
                     "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
        }));
        let pool = object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "p"},
            "spec": {"backends": ["m"], "quota": {"total": "1Gi"}}
        }));
        let binding = object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "b", "namespace": "a"},
            "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"name": "qwen", "blockSize": 64, "dtype": "bfloat16"}}
        }));
        let mut relation = Relation::default();
        if let (Object::Backend(b), Object::Pool(p), Object::Binding(x)) =
            (&backend, &pool, &binding)
        {
            relation.add_backend(Arc::new((**b).clone()));
            relation.add_pool(Arc::new((**p).clone()));
            relation.add_binding(Arc::new((**x).clone()));
        }
        let warned = cross_object(&relation, &pool);
        assert_eq!(
            warned.iter().map(|f| (f.field, f.kind)).collect::<Vec<_>>(),
            [("spec.backends", FindingKind::Warning)]
        );
        assert!(
            warned[0]
                .message
                .starts_with("KVCachePool p: KVCacheBackend m declares")
        );
        assert_eq!(
            cross_object(&relation, &binding),
            [],
            "its stored copy is ignored"
        );
        assert_eq!(cross_object(&relation, &backend), []);
    }

    #[test]
    fn claims_are_per_backend_and_cluster_wide() {
        let existing = [claim("mooncake-dram", "default", "team-a/team-a")];
        let err = check(
            &existing,
            &claim("mooncake-dram", "default", "team-b/cache"),
        )
        .expect_err("duplicate across namespaces");
        let text = err.to_string();
        assert!(
            text.contains("team-a/team-a") && text.contains("mooncake-dram"),
            "{text}"
        );
        assert!(
            check(
                &existing,
                &claim("mooncake-disk", "default", "team-b/cache")
            )
            .is_ok()
        );
        assert!(check(&existing, &claim("mooncake-dram", "chat", "team-b/cache")).is_ok());
        // Re-admitting the holder itself (an update) is not a duplicate.
        assert!(
            check(
                &existing,
                &claim("mooncake-dram", "default", "team-a/team-a")
            )
            .is_ok()
        );
    }

    #[test]
    fn a_binding_being_deleted_holds_its_domain_until_it_is_gone() {
        let objects = |holder_deleting: bool| {
            let mut holder = serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
                "metadata": {"name": "team-a", "namespace": "team-a", "finalizers": ["kvcache.gpustack.ai/release"]},
                "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                         "domain": {"name": "qwen", "blockSize": 64, "dtype": "bfloat16"}}
            });
            if holder_deleting {
                holder["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
            }
            let mut claimant = holder.clone();
            claimant["metadata"] = serde_json::json!({"name": "cache", "namespace": "team-b"});
            vec![
                object(serde_json::json!({
                    "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "ext"},
                    "spec": {"connection": {"external": {"endpoints": [
                        {"name": "Client", "address": "m:50051"}, {"name": "Admin", "address": "m:9003"}]}}}
                })),
                object(serde_json::json!({
                    "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "p"},
                    "spec": {"backends": ["ext"], "quota": {"total": "1Gi"}}
                })),
                object(holder),
                object(claimant),
            ]
        };
        for deleting in [false, true] {
            let findings = in_turn(&objects(deleting));
            let refusal = findings
                .iter()
                .find(|f| f.object.namespace.as_deref() == Some("team-b"))
                .unwrap_or_else(|| panic!("no finding for team-b (holder deleting: {deleting})"));
            assert_eq!(refusal.kind, FindingKind::Duplicate);
            assert_eq!(refusal.field, "spec.domain.name");
            assert_eq!(
                refusal.message.contains("which is being deleted"),
                deleting,
                "{}",
                refusal.message
            );
        }
    }

    #[test]
    fn bindings_bringing_namespaces_to_a_backend_are_warned_or_refused_by_its_tenancy() {
        let objects = |tenancy: serde_json::Value| {
            let mut all = vec![
                object(serde_json::json!({
                    "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "ext"},
                    "spec": {"tenancy": tenancy, "connection": {"external": {"endpoints": [
                        {"name": "Client", "address": "m:50051"}, {"name": "Admin", "address": "m:9003"}]}}}
                })),
                object(serde_json::json!({
                    "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "p"},
                    "spec": {"backends": ["ext"], "quota": {"total": "1Gi"}}
                })),
            ];
            for (ns, name, domain) in [
                ("team-a", "one", "qwen"),
                ("team-a", "two", "llama"),
                ("team-b", "one", "mistral"),
                ("team-c", "one", "gemma"),
            ] {
                all.push(object(serde_json::json!({
                    "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                             "domain": {"name": domain, "blockSize": 64, "dtype": "bfloat16"}}
                })));
            }
            in_turn(&all)
                .into_iter()
                .filter(|f| f.field == "spec.poolRef.name")
                .map(|f| (f.object.to_string(), f.kind, f.message))
                .collect::<Vec<_>>()
        };
        let shared = objects(serde_json::json!({"mode": "Shared"}));
        let warned: Vec<&str> = shared.iter().map(|(o, _, _)| o.as_str()).collect();
        assert_eq!(
            warned,
            [
                "KVCachePoolBinding team-b/one",
                "KVCachePoolBinding team-c/one"
            ],
            "team-a's second Binding brings nobody new: {shared:#?}"
        );
        assert!(shared.iter().all(|(_, k, _)| *k == FindingKind::Warning));
        assert!(
            shared[1]
                .2
                .contains("share KVCacheBackend ext with namespaces team-a, team-b:"),
            "{}",
            shared[1].2
        );
        let dedicated = objects(serde_json::json!({"mode": "Dedicated", "namespace": "team-a"}));
        let refused: Vec<(&str, FindingKind)> =
            dedicated.iter().map(|(o, k, _)| (o.as_str(), *k)).collect();
        assert_eq!(
            refused,
            [
                ("KVCachePoolBinding team-b/one", FindingKind::Forbidden),
                ("KVCachePoolBinding team-c/one", FindingKind::Forbidden)
            ]
        );
        assert!(
            dedicated[1]
                .2
                .contains("spec.tenancy (mode: Dedicated) admits namespace team-a only"),
            "{}",
            dedicated[1].2
        );
    }

    #[test]
    fn raced_claims_are_reported_on_every_claimant() {
        let claims = [
            claim("b", "chat", "x/one"),
            claim("b", "chat", "y/two"),
            claim("b", "other", "z/three"),
            claim("c", "chat", "w/four"),
        ];
        let c = contested(&claims);
        assert_eq!(c.len(), 2);
        assert_eq!(c["x/one"], vec!["y/two".to_string()]);
        assert_eq!(c["y/two"], vec!["x/one".to_string()]);
    }
}
