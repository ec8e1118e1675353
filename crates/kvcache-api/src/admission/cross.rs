//! The admission rules that judge an object against others (catalogue 2.2.3, 2.3.3, 2.3.4):
//! the caller (the webhook) looks the related objects up and passes them in; the rules stay
//! pure and are tested without an API server.

use super::{Verdict, tenant_of};
use crate::backend::KVCacheBackend;
use crate::pool::{KVCachePool, KVCachePoolBinding};

/// What a pool is judged against: its backend, if it exists.
pub fn pool_against(pool: &KVCachePool, backend: Option<&KVCacheBackend>) -> Verdict {
    let mut v = Verdict::default();
    let Some(name) = pool.spec.backend() else {
        return v;
    };
    match backend {
        // Creation order is free: the pool says BackendResolved=False until the backend exists.
        None => v.warn(format!(
            "KVCacheBackend {name} does not exist (yet): the pool reports BackendResolved=False/BackendNotFound until it does"
        )),
        Some(b) => {
            let single_tenant = b
                .spec
                .connection
                .managed
                .as_ref()
                .is_some_and(|m| !m.leader.multi_tenancy);
            if single_tenant {
                v.warn(format!(
                    "KVCacheBackend {name} declares leader.multiTenancy: false: no per-tenant quota is enforced on this pool; its Bindings report QuotaGranted=True/Unenforced and every domain writes into the store's one tenant"
                ));
            }
        }
    }
    v
}

/// Another Binding on the same backend, as the webhook found it.
#[derive(Clone, Copy, Debug)]
pub struct Claimant<'a> {
    /// The Binding.
    pub binding: &'a KVCachePoolBinding,
    /// Its pool's backend.
    pub backend: &'a str,
}

/// Whether the backend's master is known to have a ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerKnown {
    /// Observed (`QuotaLedgerAvailable=True` on the pool).
    Present,
    /// Observed absent (`MultiTenancyDisabled`) or declared absent (`multiTenancy: false`).
    Absent,
    /// Not observed yet.
    Unknown,
}

/// What a new Binding is judged against: the backend its pool names (`None` while the pool or
/// its backend does not exist), every other Binding with its backend, and what is known of the
/// master's ledger. Updates are not judged here: `spec.poolRef` and `spec.domain` are immutable.
pub fn binding_against(
    binding: &KVCachePoolBinding,
    backend: Option<&str>,
    others: &[Claimant<'_>],
    ledger: LedgerKnown,
) -> Verdict {
    let mut v = Verdict::default();
    let Some(backend) = backend else {
        return v;
    };
    let me = (
        binding.metadata.namespace.as_deref(),
        binding.metadata.name.as_deref(),
    );
    let tenant = tenant_of(binding);
    let on_backend: Vec<&Claimant<'_>> = others
        .iter()
        .filter(|c| c.backend == backend)
        .filter(|c| {
            (
                c.binding.metadata.namespace.as_deref(),
                c.binding.metadata.name.as_deref(),
            ) != me
        })
        .collect();
    if let Some(holder) = on_backend.iter().find(|c| tenant_of(c.binding) == tenant) {
        v.refuse(
            "spec.domain.name",
            format!(
                "Duplicate value: domain {tenant} is already claimed by KVCachePoolBinding {}/{} on KVCacheBackend {backend} (claims are per backend, across namespaces); choose another spec.domain.name{}",
                holder.binding.metadata.namespace.as_deref().unwrap_or_default(),
                holder.binding.metadata.name.as_deref().unwrap_or_default(),
                if binding.spec.domain.name.is_empty() { " (an omitted name means default)" } else { "" }
            ),
        );
        return v;
    }
    let distinct = on_backend.iter().any(|c| tenant_of(c.binding) != tenant);
    if distinct {
        match ledger {
            LedgerKnown::Absent => v.refuse(
                "spec.domain.name",
                format!(
                    "KVCacheBackend {backend} has no quota ledger (multi-tenancy off) and already serves another domain: a second domain would share its one tenant; use the same domain, or a backend with leader.multiTenancy: true"
                ),
            ),
            LedgerKnown::Unknown => v.warn(format!(
                "KVCacheBackend {backend}: tenant support is not observed yet; engines of this domain need an image at or above the tenant compatibility floor (see docs: Tenant compatibility)"
            )),
            LedgerKnown::Present => {}
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(ns: &str, name: &str, domain: &str) -> KVCachePoolBinding {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"poolRef": {"name": "shared"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"name": domain, "blockSize": 64, "dtype": "bfloat16"}}
        }))
        .expect("a Binding")
    }

    fn backend(multi_tenancy: bool) -> KVCacheBackend {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
            "spec": {"connection": {"managed": {"leader": {"multiTenancy": multi_tenancy},
                     "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
        }))
        .expect("a backend")
    }

    fn pool() -> KVCachePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "shared"},
            "spec": {"backends": ["m"], "quota": {"total": "1Gi"}}
        }))
        .expect("a pool")
    }

    #[test]
    fn a_domain_is_claimed_once_per_backend_across_namespaces() {
        let first = binding("team-a", "a", "qwen");
        let second = binding("team-b", "b", "qwen");
        let others = [Claimant {
            binding: &first,
            backend: "m",
        }];
        let v = binding_against(&second, Some("m"), &others, LedgerKnown::Present);
        assert!(
            v.refuses("spec.domain.name", "team-a/a on KVCacheBackend m"),
            "{v:?}"
        );
        // The same name on another backend is fine.
        let v = binding_against(&second, Some("other"), &others, LedgerKnown::Present);
        assert!(v.allowed(), "{v:?}");
        // An omitted name is `default` and collides with `default`.
        let (d1, d2) = (
            binding("team-a", "a", ""),
            binding("team-b", "b", "default"),
        );
        let v = binding_against(
            &d2,
            Some("m"),
            &[Claimant {
                binding: &d1,
                backend: "m",
            }],
            LedgerKnown::Present,
        );
        assert!(v.refuses("spec.domain.name", "default"), "{v:?}");
        // Re-judging the stored Binding itself is no duplicate.
        let v = binding_against(&first, Some("m"), &others, LedgerKnown::Present);
        assert!(v.allowed(), "{v:?}");
    }

    #[test]
    fn a_second_domain_on_a_ledgerless_master_is_refused_and_unknown_warns() {
        let first = binding("team-a", "a", "qwen");
        let second = binding("team-b", "b", "llama");
        let others = [Claimant {
            binding: &first,
            backend: "m",
        }];
        let v = binding_against(&second, Some("m"), &others, LedgerKnown::Absent);
        assert!(v.refuses("spec.domain.name", "no quota ledger"), "{v:?}");
        let v = binding_against(&second, Some("m"), &others, LedgerKnown::Unknown);
        assert!(
            v.allowed()
                && v.warnings
                    .iter()
                    .any(|w| w.contains("tenant compatibility floor")),
            "{v:?}"
        );
        let v = binding_against(&second, Some("m"), &others, LedgerKnown::Present);
        assert!(v.allowed() && v.warnings.is_empty(), "{v:?}");
        // The first domain on a ledgerless master is fine.
        let v = binding_against(&first, Some("m"), &[], LedgerKnown::Absent);
        assert!(v.allowed() && v.warnings.is_empty(), "{v:?}");
    }

    #[test]
    fn a_pool_warns_on_a_single_tenant_backend_and_on_a_missing_one() {
        let v = pool_against(&pool(), Some(&backend(false)));
        assert!(
            v.allowed()
                && v.warnings
                    .iter()
                    .any(|w| w.contains("no per-tenant quota is enforced")),
            "{v:?}"
        );
        let v = pool_against(&pool(), Some(&backend(true)));
        assert!(v.allowed() && v.warnings.is_empty(), "{v:?}");
        let v = pool_against(&pool(), None);
        assert!(
            v.allowed()
                && v.warnings
                    .iter()
                    .any(|w| w.contains("does not exist (yet)")),
            "{v:?}"
        );
    }
}
