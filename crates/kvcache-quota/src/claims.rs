//! Domain claims: a tenant name is held by one Binding per backend object, cluster-wide.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kvcache_api::manifest::{Object, ObjectRef};

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

/// Domain claims per backend, the pool warning for a single-tenant backend, a second domain
/// on a backend without a ledger (docs/design.md#domain-claims, #pool-admission,
/// #second-domain) and who shares a backend (`crate::tenancy`, docs/isolation.md#tenancy), over
/// objects given together.
/// Bindings are judged in the order given: a later claim on a held name is the duplicate.
pub fn cross_object(objects: &[Object]) -> Vec<Finding> {
    let mut out = Vec::new();
    let backends: BTreeMap<String, &kvcache_api::KVCacheBackend> = objects
        .iter()
        .filter_map(|o| match o {
            Object::Backend(b) => Some((b.metadata.name.clone().unwrap_or_default(), &**b)),
            _ => None,
        })
        .collect();
    let mut pool_backend = BTreeMap::new();
    // What the pools observed of each backend's ledger (objects from the cluster carry status;
    // manifests do not): `QuotaLedgerAvailable` True, or False/`MultiTenancyDisabled`.
    let mut observed: BTreeMap<String, bool> = BTreeMap::new();
    for o in objects {
        if let Object::Pool(p) = o {
            let seen = p
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.type_ == kvcache_api::pool::pool_conditions::QUOTA_LEDGER_AVAILABLE)
                .and_then(|c| match (c.status.as_str(), c.reason.as_str()) {
                    ("True", _) => Some(true),
                    ("False", "MultiTenancyDisabled") => Some(false),
                    _ => None,
                });
            if let (Some(seen), Some(backend)) = (seen, p.spec.backend()) {
                observed.insert(backend.to_owned(), seen);
            }
            let name = p.metadata.name.clone().unwrap_or_default();
            let backend = p.spec.backend().unwrap_or_default().to_owned();
            if let Some(w) = backends.get(&backend).and_then(|b| pool_warning(&name, b)) {
                out.push(Finding {
                    object: o.object_ref(),
                    field: "spec.backends",
                    kind: FindingKind::Warning,
                    message: w,
                });
            }
            pool_backend.insert(name, backend);
        }
    }
    // The first holder of each (backend, tenant), and up to two distinct tenants per backend
    // in the order they came (enough for `second_domain`: whether another tenant is there, and
    // which one came first): each Binding is judged in O(log n), not against every claim.
    let mut held: BTreeMap<(String, String), Claim> = BTreeMap::new();
    let mut tenants_on: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // The namespaces already holding a Binding on each backend (docs/isolation.md#tenancy).
    let mut namespaces_on: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for o in objects {
        let Object::Binding(b) = o else { continue };
        let Some(backend) = pool_backend.get(&b.spec.pool_ref.name) else {
            continue;
        };
        let claim = Claim {
            backend: backend.clone(),
            tenant: kvcache_api::admission::tenant_of(b).to_owned(),
            binding: format!(
                "{}/{}",
                b.metadata.namespace.clone().unwrap_or_default(),
                b.metadata.name.clone().unwrap_or_default()
            ),
            pool: b.spec.pool_ref.name.clone(),
            releasing: b.metadata.deletion_timestamp.is_some(),
        };
        let holder = held
            .get(&(claim.backend.clone(), claim.tenant.clone()))
            .map(std::slice::from_ref)
            .unwrap_or_default();
        if let Err(dup) = check(holder, &claim) {
            out.push(Finding {
                object: o.object_ref(),
                field: "spec.domain.name",
                kind: FindingKind::Duplicate,
                message: dup.to_string(),
            });
            continue;
        }
        let namespace = b.metadata.namespace.as_deref().unwrap_or("default");
        let empty = BTreeSet::new();
        match crate::tenancy::binding(
            backend,
            backends.get(backend).copied(),
            &claim.pool,
            namespace,
            namespaces_on.get(backend).unwrap_or(&empty),
        ) {
            Ok(Some(w)) => out.push(Finding {
                object: o.object_ref(),
                field: "spec.poolRef.name",
                kind: FindingKind::Warning,
                message: w,
            }),
            Ok(None) => {}
            Err(e) => {
                out.push(Finding {
                    object: o.object_ref(),
                    field: "spec.poolRef.name",
                    kind: FindingKind::Forbidden,
                    message: e.to_string(),
                });
                continue;
            }
        }
        // Declared off wins; otherwise what a pool observed; otherwise unknown.
        let ledger = match backends
            .get(backend)
            .and_then(|be| be.spec.connection.managed.as_ref())
            .map(|m| m.leader.multi_tenancy)
        {
            Some(false) => Some(false),
            declared => observed.get(backend).copied().or(declared),
        };
        let tenants = tenants_on
            .get(backend)
            .map(Vec::as_slice)
            .unwrap_or_default();
        match second_domain(backend, ledger, tenants, &claim.tenant) {
            Ok(Some(w)) => out.push(Finding {
                object: o.object_ref(),
                field: "spec.domain.name",
                kind: FindingKind::Warning,
                message: w,
            }),
            Ok(None) => {}
            Err(e) => {
                out.push(Finding {
                    object: o.object_ref(),
                    field: "spec.domain.name",
                    kind: FindingKind::Forbidden,
                    message: e.to_string(),
                });
                continue;
            }
        }
        let seen = tenants_on.entry(claim.backend.clone()).or_default();
        if seen.len() < 2 && !seen.contains(&claim.tenant) {
            seen.push(claim.tenant.clone());
        }
        namespaces_on
            .entry(claim.backend.clone())
            .or_default()
            .insert(namespace.to_owned());
        held.entry((claim.backend.clone(), claim.tenant.clone()))
            .or_insert(claim);
    }
    out
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
            cross_object(&[
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
            let findings = cross_object(&objects(deleting));
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
            cross_object(&all)
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
