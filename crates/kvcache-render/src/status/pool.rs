//! A pool's whole status from its pass's verdict (`kvcache_render::pool_plan::conclude`): the
//! document its one writer, the pool controller, applies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::backend::ObjectRef;
use kvcache_api::condition::merge;
use kvcache_api::pool::KVCachePoolStatus;
use kvcache_quota::status::{BindingView, PoolVerdict};

/// A pool's whole status from its verdict: the Bindings it holds as `usedBy`, conditions merged
/// with the `stored` ones at `now` (an unchanged condition keeps its transition time).
pub fn pool_status_document(
    generation: Option<i64>,
    verdict: &PoolVerdict,
    bindings: &[BindingView],
    stored: &KVCachePoolStatus,
    now: &Time,
) -> KVCachePoolStatus {
    KVCachePoolStatus {
        observed_generation: generation,
        phase: Some(verdict.phase),
        phase_message: verdict.phase_message.clone(),
        client_endpoint: verdict.client_endpoint.clone(),
        domains: verdict.domains.clone(),
        unclaimed_tenants: verdict.unclaimed_tenants.clone(),
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
