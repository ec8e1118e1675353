//! A pool's whole status from its pass's verdict (`kvcache_render::plan::pool::conclude`): the
//! document its one writer, the pool controller, applies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::backend::ObjectRef;
use kvcache_api::condition::merge;
use kvcache_api::pool::KVCachePoolStatus;
use kvcache_quota::ceiling::BindingCeiling;
use kvcache_quota::status::PoolVerdict;

/// A pool's whole status from its verdict: the Bindings it holds as `usedBy`, conditions merged
/// with the `stored` ones at `now` (an unchanged condition keeps its transition time).
pub fn pool_status_document(
    generation: Option<i64>,
    verdict: &PoolVerdict,
    bindings: &[BindingCeiling],
    stored: &KVCachePoolStatus,
    now: &Time,
) -> KVCachePoolStatus {
    KVCachePoolStatus {
        observed_generation: generation,
        phase: Some(verdict.phase),
        phase_message: verdict.phase_message.clone(),
        client_endpoint: verdict.client_endpoint.clone(),
        domains: verdict.domains.clone(),
        unclaimed_tenants: unclaimed_tenants(verdict, stored),
        used_by: bindings
            .iter()
            .map(|b| {
                let (ns, name) = b.binding.split_once('/').unwrap_or(("", &b.binding));
                ObjectRef {
                    kind: "KVCachePoolBinding".into(),
                    namespace: Some(ns.to_owned()),
                    name: name.to_owned(),
                }
            })
            .collect(),
        conditions: merge(&stored.conditions, &verdict.conditions, now, generation),
    }
}

/// `status.unclaimedTenants`: what the pass found on the ledger; when the ledger was not read
/// (`verdict.ledger` unknown: unreachable, or not asked yet, as in a new leader's first pass),
/// the tenants this pool registered before that no Binding of it claims now, carried over. The
/// pool's own status is where it remembers what it registered: rebuilt from the Bindings alone,
/// a Binding deleted while no operator ran would be forgotten, and its tenant (and the share of
/// the capacity its ceiling takes) never removed from the ledger.
fn unclaimed_tenants(verdict: &PoolVerdict, stored: &KVCachePoolStatus) -> Vec<String> {
    if verdict.ledger.is_some() {
        return verdict.unclaimed_tenants.clone();
    }
    let mut carried: Vec<String> = stored
        .domains
        .iter()
        .chain(&stored.unclaimed_tenants)
        .chain(&verdict.unclaimed_tenants)
        .filter(|t| !verdict.domains.contains(t))
        .cloned()
        .collect();
    carried.sort();
    carried.dedup();
    carried
}

#[cfg(test)]
mod carried {
    use super::*;
    use kvcache_api::pool::PoolPhase;

    fn verdict(ledger: Option<bool>, domains: &[&str], unclaimed: &[&str]) -> PoolVerdict {
        PoolVerdict {
            phase: PoolPhase::Ready,
            phase_message: None,
            client_endpoint: None,
            domains: domains.iter().map(|s| (*s).to_owned()).collect(),
            ledger,
            unclaimed_tenants: unclaimed.iter().map(|s| (*s).to_owned()).collect(),
            conditions: Vec::new(),
        }
    }

    #[test]
    fn a_pass_without_the_ledger_forgets_no_tenant_the_pool_registered() {
        let stored = KVCachePoolStatus {
            domains: vec!["team-a".into(), "stuck".into()],
            unclaimed_tenants: vec!["older".into()],
            ..Default::default()
        };
        // The stuck Binding was deleted while no operator ran; the ledger is not read yet.
        assert_eq!(
            unclaimed_tenants(&verdict(None, &["team-a"], &[]), &stored),
            vec!["older".to_owned(), "stuck".to_owned()]
        );
        // Read: the ledger's answer stands (what is gone from it is gone).
        assert_eq!(
            unclaimed_tenants(&verdict(Some(true), &["team-a"], &["stuck"]), &stored),
            vec!["stuck".to_owned()]
        );
        assert!(unclaimed_tenants(&verdict(Some(true), &["team-a"], &[]), &stored).is_empty());
    }
}
