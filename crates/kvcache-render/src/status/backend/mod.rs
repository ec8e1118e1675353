//! A backend's status from what the operator observed: the store's answers
//! ([`crate::observe::store`]), the leader Deployment, the Lease and the member Pods. Pure: the operator
//! fetches, calls [`backend_status`], and writes the result with [`apply`].
//!
//! One function per condition, each family in a module of its own, and the phase from them
//! (`phase.rs`, docs/design.md#backend-phase). It lives beside the render because it judges the
//! rendered objects (their fingerprints, their groups, their Service address) against what runs.

mod capacity;
mod disruption;
mod drained;
mod facts;
mod isolation;
mod leader;
mod members;
mod observation;
mod phase;

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::KVCacheBackendStatus;

use capacity::{
    capacity, capacity_observed, pool_writes, store_version_observed, tier_registered,
    tier_was_empty,
};
use facts::{has_tier, name, no_ready_leader, warm};
use isolation::{network_isolated, unknown_segments};
use leader::{
    election_observed, election_record, etcd_available, failover_kept_cache, leader_available,
};
use members::{member_rows_or_stored, members_mounted};
use phase::{deletable, phase, rendered, rollout_complete, settings_read};

pub(crate) use isolation::describe_unknown;
pub use observation::{Computed, Observation};

/// The status of a backend from one pass of observation. `previous` is what is stored (the
/// member list is kept when the listing cannot be read; `TierWasEmpty` is written once).
pub fn backend_status(
    b: &KVCacheBackend,
    obs: &Observation,
    previous: &KVCacheBackendStatus,
) -> Computed {
    let health = obs.store.as_ref().map(|s| &s.health);
    let serving = matches!(health, Some(Ok(h)) if h.service_ready);
    let no_ready_leader = no_ready_leader(b, obs);
    // Capacity: only from a serving leader; a failed scrape clears it.
    let metrics = obs.store.as_ref().and_then(|s| s.metrics.as_ref().ok());
    let cap = if serving {
        metrics.and_then(|m| capacity(b, m))
    } else {
        None
    };
    let (mounted, shortfall) = members_mounted(obs, serving, metrics);
    let mut conditions = vec![
        deletable(&obs.used_by),
        leader_available(health, no_ready_leader, name(b)),
        capacity_observed(cap.as_ref(), obs.store.as_ref().map(|s| &s.metrics)),
        mounted,
        pool_writes(obs, serving),
        rollout_complete(b, obs),
    ];
    conditions.extend(election_observed(b, obs, no_ready_leader));
    let election = warm(b).then(|| election_record(previous.election.as_ref(), obs));
    if warm(b) {
        conditions.push(etcd_available(obs.etcd.as_ref()));
        conditions.extend(election.as_ref().and_then(failover_kept_cache));
    }
    let mut tier_problem = None;
    if has_tier(b) {
        conditions.extend(tier_was_empty(&obs.members, previous));
        let (registered, problem) = tier_registered(obs, serving, metrics);
        conditions.push(registered);
        tier_problem = problem;
    }
    conditions.extend(store_version_observed(obs));
    conditions.extend(network_isolated(obs));
    conditions.extend(disruption::disruption_budget(b));
    conditions.extend(drained::drained(obs));
    conditions.extend(unknown_segments(b, obs));
    let (phase, phase_message) = phase(b, obs, serving, &conditions, shortfall.or(tier_problem));
    conditions.extend(rendered(obs));
    conditions.extend(settings_read(obs));
    Computed {
        phase,
        phase_message,
        capacity: cap,
        members: member_rows_or_stored(b, obs, serving, previous),
        conditions,
        election,
    }
}

/// Merges a computed status into the stored one (times kept where the status did not change).
pub fn apply(
    stored: &KVCacheBackendStatus,
    computed: Computed,
    obs: &Observation,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> KVCacheBackendStatus {
    KVCacheBackendStatus {
        observed_generation: obs.generation,
        phase: Some(computed.phase),
        phase_message: computed.phase_message,
        endpoint: obs.endpoint.clone(),
        endpoints: stored.endpoints.clone(),
        capacity: computed.capacity,
        members: computed.members,
        used_by: obs.used_by.clone(),
        bound_namespaces: obs.bound_namespaces.clone(),
        store_version: obs
            .store_version
            .as_ref()
            .map(|(running, _)| running.clone()),
        election: computed.election,
        etcd: obs.etcd.clone(),
        unknown_segments: obs
            .unknown_segments
            .clone()
            .unwrap_or_else(|| stored.unknown_segments.clone()),
        isolation_probe: obs
            .isolation_probe
            .clone()
            .or_else(|| stored.isolation_probe.clone()),
        conditions: kvcache_api::condition::merge(
            &stored.conditions,
            &computed.conditions,
            now,
            obs.generation,
        ),
    }
}
