//! A Binding's whole status, decided in one place for its one writer (the Binding controller):
//! what its pool's last pass concluded from the master's ledger, the workloads attached to it
//! (`usedBy`), and, while it is deleted, where its release stands.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::KVCachePoolBinding;
use kvcache_api::admission::tenant_of;
use kvcache_api::backend::ObjectRef as Consumer;
use kvcache_api::condition::merge;
use kvcache_api::pool::binding_conditions::RELEASABLE;
use kvcache_api::pool::{KVCachePoolBindingStatus, PoolPhase};
use kvcache_quota::status::{
    BindingInput, BindingVerdict, Release, SavesInWindow, binding_releasable, binding_status,
    quota_pressure,
};

use crate::names::binding_id;

/// What a Binding's ledger conditions come from this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolConclusion {
    /// Its pool's last pass concluded this from one reading of the master's ledger.
    Concluded(BindingVerdict),
    /// Its pool does not exist: the Binding says so itself until the pool arrives.
    NoPool,
    /// Its pool exists and has not concluded yet (the operator just started): what is stored
    /// stays.
    Pending,
}

/// The Binding's status after this pass, or `None` when it is what is stored already (nothing
/// to write). `release` is where its deletion stands, once it has a deletion timestamp: its
/// pool then leaves it alone, and the conditions its pool wrote last stay beside `Releasable`.
pub fn binding_status_after(
    b: &KVCachePoolBinding,
    conclusion: PoolConclusion,
    (used_by, shared_cache): (Vec<Consumer>, Option<kvcache_api::model::SharedCacheStatus>),
    release: Option<&Release>,
    now: &Time,
) -> Option<KVCachePoolBindingStatus> {
    let stored = b.status.clone().unwrap_or_default();
    let generation = b.metadata.generation;
    let ceiling = b
        .spec
        .quota
        .ceiling
        .bytes("spec.quota.ceiling")
        .unwrap_or(0);
    let saves = shared_cache
        .as_ref()
        .map_or_else(SavesInWindow::default, |c| SavesInWindow {
            saves: c.saves,
            failed: c.failed_saves,
        });
    let verdict = match (release, conclusion) {
        (Some(_), _) | (None, PoolConclusion::Pending) => None,
        (None, PoolConclusion::Concluded(v)) => Some(v),
        (None, PoolConclusion::NoPool) => Some(binding_status(&BindingInput {
            binding: &binding_id(b),
            tenant: tenant_of(b),
            ceiling_bytes: ceiling,
            pool: None,
            entry: None,
            contested_with: &[],
            release: Release::NotDeleting,
        })),
    };
    let mut status = match verdict {
        Some(v) => {
            let v = with_pressure(v, ceiling, saves);
            binding_status_document(generation, v, &stored, now)
        }
        None => stored.clone(),
    };
    if let Some(release) = release {
        let condition = binding_releasable(&binding_id(b), release);
        status.phase = Some(PoolPhase::Deleting);
        status.phase_message = Some(condition.message.clone());
        // `Releasable` replaced in place; the conditions its pool wrote last stay.
        let merged = merge(&status.conditions, &[condition], now, generation);
        for m in merged {
            match status.conditions.iter_mut().find(|c| c.type_ == m.type_) {
                Some(c) => *c = m,
                None => status.conditions.push(m),
            }
        }
    }
    status.used_by = used_by;
    status.shared_cache = shared_cache;
    (status != stored).then_some(status)
}

/// The pool's `verdict` with the Binding's `QuotaPressure` (decided from the ledger's figures
/// and its engines' saves in the window) put before `Releasable`, where a Binding lists it.
fn with_pressure(
    mut verdict: BindingVerdict,
    ceiling: u64,
    saves: SavesInWindow,
) -> BindingVerdict {
    if let Some(pressure) = quota_pressure(&verdict, ceiling, saves) {
        let at = verdict
            .conditions
            .iter()
            .position(|c| c.type_ == RELEASABLE)
            .unwrap_or(verdict.conditions.len());
        verdict.conditions.insert(at, pressure);
    }
    verdict
}

/// A Binding's status from its verdict (`usedBy` left empty: the caller fills it), conditions merged with the `stored` ones at `now`.
fn binding_status_document(
    generation: Option<i64>,
    verdict: BindingVerdict,
    stored: &kvcache_api::pool::KVCachePoolBindingStatus,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> kvcache_api::pool::KVCachePoolBindingStatus {
    kvcache_api::pool::KVCachePoolBindingStatus {
        observed_generation: generation,
        phase: Some(verdict.phase),
        phase_message: verdict.phase_message,
        effective_quota: verdict
            .effective_quota_bytes
            .map(kvcache_api::Quantity::from_bytes),
        usage: verdict.usage_bytes.map(kvcache_api::Quantity::from_bytes),
        over_quota: verdict.over_quota,
        admission_closed: verdict.admission_closed,
        used_by: Vec::new(),
        shared_cache: None,
        conditions: kvcache_api::condition::merge(
            &stored.conditions,
            &verdict.conditions,
            now,
            generation,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(status: Option<KVCachePoolBindingStatus>) -> KVCachePoolBinding {
        let mut b: KVCachePoolBinding = serde_yaml::from_str(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {name: team, namespace: team-a, generation: 1}\nspec: {poolRef: {name: shared}, quota: {ceiling: 1Mi}, domain: {name: qwen, blockSize: 64, dtype: bfloat16}}\n",
        )
        .expect("a Binding");
        b.status = status;
        b
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    fn user(name: &str) -> Consumer {
        Consumer {
            kind: "ModelDeployment".into(),
            namespace: Some("team-a".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_binding_without_its_pool_says_so_and_a_second_pass_writes_nothing() {
        let first = binding_status_after(
            &binding(None),
            PoolConclusion::NoPool,
            (vec![user("qwen")], None),
            None,
            &now(),
        )
        .expect("a first status");
        assert_eq!(first.phase, Some(PoolPhase::Error));
        assert_eq!(first.used_by, [user("qwen")]);
        let again = binding_status_after(
            &binding(Some(first)),
            PoolConclusion::NoPool,
            (vec![user("qwen")], None),
            None,
            &now(),
        );
        assert_eq!(again, None);
    }

    #[test]
    fn the_tenants_view_is_its_users_shared_cache_summed_and_rewritten_when_it_moves() {
        let figures = |hit: u64, queried: u64| kvcache_api::model::SharedCacheStatus {
            window: "5m".into(),
            queried_tokens: queried,
            hit_tokens: hit,
            hit_ratio: crate::observe::shared_cache::ratio(hit, queried),
            tokens_from_store: hit,
            engines_read: 2,
            loads: 3,
            failed_loads: 1,
            prefill_seconds_saved: Some("1.5".into()),
            ..Default::default()
        };
        let (a, b) = (figures(100, 400), figures(300, 400));
        let summed = crate::observe::shared_cache::sum(&[&a, &b]).expect("two users");
        assert_eq!((summed.hit_tokens, summed.queried_tokens), (400, 800));
        assert_eq!(
            summed.hit_ratio.as_deref(),
            Some("0.50"),
            "recomputed, not averaged"
        );
        assert_eq!(
            (summed.loads, summed.failed_loads, summed.engines_read),
            (6, 2, 4)
        );
        assert_eq!(summed.prefill_seconds_saved.as_deref(), Some("3.00"));
        assert_eq!(crate::observe::shared_cache::sum(&[]), None);
        let stored = binding_status_after(
            &binding(None),
            PoolConclusion::NoPool,
            (vec![user("a"), user("b")], Some(summed.clone())),
            None,
            &now(),
        )
        .expect("a status");
        assert_eq!(stored.shared_cache.as_ref(), Some(&summed));
        // The figures moved: written again.
        let moved = crate::observe::shared_cache::sum(&[&a, &a]);
        let after = binding_status_after(
            &binding(Some(stored)),
            PoolConclusion::NoPool,
            (vec![user("a"), user("b")], moved.clone()),
            None,
            &now(),
        )
        .expect("the view moved");
        assert_eq!(after.shared_cache, moved);
    }

    #[test]
    fn a_pending_pool_keeps_the_stored_conditions_and_still_updates_used_by() {
        let stored = binding_status_after(
            &binding(None),
            PoolConclusion::NoPool,
            (vec![], None),
            None,
            &now(),
        )
        .expect("a status");
        let after = binding_status_after(
            &binding(Some(stored.clone())),
            PoolConclusion::Pending,
            (vec![user("qwen")], None),
            None,
            &now(),
        )
        .expect("usedBy moved");
        assert_eq!(after.conditions, stored.conditions);
        assert_eq!(after.used_by, [user("qwen")]);
    }

    #[test]
    fn a_deleted_binding_reports_its_release_beside_the_conditions_its_pool_wrote() {
        let stored = binding_status_after(
            &binding(None),
            PoolConclusion::NoPool,
            (vec![], None),
            None,
            &now(),
        )
        .expect("a status");
        let held = Release::Held(vec!["ModelDeployment team-a/qwen".into()]);
        let after = binding_status_after(
            &binding(Some(stored.clone())),
            // Ignored while deleting: the pool leaves a deleted Binding alone.
            PoolConclusion::NoPool,
            (vec![user("qwen")], None),
            Some(&held),
            &now(),
        )
        .expect("the release is new");
        assert_eq!(after.phase, Some(PoolPhase::Deleting));
        let releasable = after
            .conditions
            .iter()
            .find(|c| c.type_ == "Releasable")
            .expect("Releasable");
        assert_eq!(releasable.status, "False");
        // The pool's conditions stay as stored.
        for c in stored.conditions.iter().filter(|c| c.type_ != "Releasable") {
            assert!(after.conditions.contains(c), "{c:?}");
        }
    }

    #[test]
    fn a_small_grant_whose_saves_are_refused_is_under_pressure_until_the_ceiling_is_raised() {
        use kvcache_api::condition::Cond;
        const KI: u64 = 1024;
        // What the real vLLM met (tests/tests/real_engine/tenant_view.rs): a 144 KiB grant of
        // 64 KiB blocks holds two, 89 %, and refuses the third.
        let verdict = |granted: u64| BindingVerdict {
            phase: PoolPhase::Ready,
            phase_message: None,
            effective_quota_bytes: Some(granted),
            usage_bytes: Some(128 * KI),
            over_quota: Some(false),
            admission_closed: Some(false),
            conditions: vec![
                Cond::yes("QuotaObserved", "LedgerRead", "read"),
                Cond::yes("Releasable", "NotDeleting", "not deleted"),
            ],
        };
        let view = |failed_saves: u64| kvcache_api::model::SharedCacheStatus {
            window: "60s".into(),
            saves: 8,
            failed_saves,
            ..Default::default()
        };
        let pass = |b: &KVCachePoolBinding, granted: u64, failed: u64| {
            binding_status_after(
                b,
                PoolConclusion::Concluded(verdict(granted)),
                (vec![user("fill")], Some(view(failed))),
                None,
                &now(),
            )
            .expect("a status")
        };
        let pressure = |s: &KVCachePoolBindingStatus| {
            let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
            assert_eq!(types, ["QuotaObserved", "QuotaPressure", "Releasable"]);
            let c = &s.conditions[1];
            (c.status.clone(), c.reason.clone(), c.message.clone())
        };
        let events = |before: &KVCachePoolBindingStatus, after: &KVCachePoolBindingStatus| {
            crate::status::events::binding_events(before, after)
                .iter()
                .map(|n| n.reason)
                .collect::<Vec<_>>()
        };
        let quiet = pass(&binding(None), 144 * KI, 0);
        assert_eq!(pressure(&quiet).1, "BelowGrant", "nothing refused yet");
        let refused = pass(&binding(Some(quiet.clone())), 144 * KI, 2);
        let (status, reason, message) = pressure(&refused);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "SavesRefused"));
        assert!(message.contains("2 of its engines' 8 saves"), "{message}");
        assert_eq!(events(&quiet, &refused), ["TenantAtGrant"]);
        // The ceiling raised: the grant follows, the refusals still in the window are not the
        // grant's doing any more.
        let raised = pass(&binding(Some(refused.clone())), 2304 * KI, 2);
        assert_eq!(pressure(&raised).1, "BelowGrant");
        assert_eq!(events(&refused, &raised), ["TenantBelowGrant"]);
    }
}
