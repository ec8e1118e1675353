//! The leader's conditions: `LeaderAvailable`, `ElectionObserved`, and a warm backend's
//! `EtcdAvailable`, `FailoverKeptCache` and election record.

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::conditions::*;
use kvcache_api::backend::{ElectionStatus, EtcdStatus, FailoverRecord};
use kvcache_api::condition::Cond;

use super::facts::warm;
use super::observation::Observation;
use crate::observe::store::{Health, ReadError};

/// The warm election's record after this pass: the serving master's address, view and key
/// count; a view newer than the stored one is a failover, recorded with the key count last read
/// before it and the new master's first. Kept as stored while no master serves, when the view
/// reads older than the stored one, and while a new view has no key count yet.
pub(crate) fn election_record(
    previous: Option<&ElectionStatus>,
    obs: &Observation,
) -> ElectionStatus {
    let stored = previous.cloned().unwrap_or_default();
    let Some(store) = obs.store.as_ref() else {
        return stored;
    };
    let Ok(health) = &store.health else {
        return stored;
    };
    let (Some(view), true) = (health.view_version, health.service_ready) else {
        return stored;
    };
    let keys = store
        .metrics
        .as_ref()
        .ok()
        .and_then(|m| m.key_count)
        .and_then(|k| i64::try_from(k).ok());
    let moved = stored.view_version.is_some_and(|from| from != view);
    // An older view (a reading through the Service that reached the old master while both
    // were briefly Ready), or a new view without its key count yet: judged at the next
    // reading, so no failover is lost or made up.
    if stored.view_version.is_some_and(|from| view < from) || (moved && keys.is_none()) {
        return stored;
    }
    let last_failover = match (stored.view_version, stored.keys, keys) {
        (Some(from), Some(before), Some(after)) if from < view => Some(FailoverRecord {
            from_view: from,
            to_view: view,
            keys_before: before,
            keys_after: after,
        }),
        _ => stored.last_failover,
    };
    ElectionStatus {
        leader_address: health.leader_address.clone(),
        view_version: Some(view),
        keys: keys.or(stored.keys),
        last_failover,
    }
}

/// `EtcdAvailable`: a quorum of the warm backend's etcd Pods is ready (without one no master
/// can be elected and the serving one steps down when its etcd lease lapses).
pub(super) fn etcd_available(etcd: Option<&EtcdStatus>) -> Cond {
    let Some(e) = etcd else {
        return Cond::unknown(
            ETCD_AVAILABLE,
            "NotCreated",
            "the etcd StatefulSet does not exist yet",
        );
    };
    let quorum = e.replicas / 2 + 1;
    if e.ready >= quorum {
        Cond::yes(
            ETCD_AVAILABLE,
            "Quorum",
            format!("{} of {} etcd Pods ready", e.ready, e.replicas),
        )
    } else {
        Cond::no(
            ETCD_AVAILABLE,
            "NoQuorum",
            format!(
                "{} of {} etcd Pods ready, {quorum} needed: no master can be elected until they are (see the etcd Pods' events and their claims)",
                e.ready, e.replicas
            ),
        )
    }
}

/// `FailoverKeptCache`, once a failover was seen: whether the new master knew the keys the old
/// one held (fewer may also mean evictions or expired leases between the readings).
pub(super) fn failover_kept_cache(e: &ElectionStatus) -> Option<Cond> {
    let f = e.last_failover.as_ref()?;
    let sentence = format!(
        "the last failover (view {} to {}) kept {} of {} keys, by the masters' master_key_count before and after",
        f.from_view,
        f.to_view,
        f.keys_after.min(f.keys_before),
        f.keys_before
    );
    Some(if f.keys_after >= f.keys_before {
        Cond::yes(FAILOVER_KEPT_CACHE, "Kept", sentence)
    } else {
        Cond::no(FAILOVER_KEPT_CACHE, "KeysLost", sentence)
    })
}

/// `LeaderAvailable`: the store's `/health` verdict (`None`: not read this pass).
pub(super) fn leader_available(
    health: Option<&Result<Health, ReadError>>,
    no_ready_leader: bool,
    name: &str,
) -> Cond {
    match health {
        Some(Ok(h)) if h.service_ready => Cond::yes(
            LEADER_AVAILABLE,
            "Serving",
            format!(
                "the leader serves ({})",
                h.ha_state.as_deref().unwrap_or("serving")
            ),
        ),
        Some(Ok(h)) => Cond::no(
            LEADER_AVAILABLE,
            "NotServing",
            format!(
                "the master answers but does not serve yet (role {}, state {})",
                h.role.as_deref().unwrap_or("unknown"),
                h.ha_state.as_deref().unwrap_or("unknown")
            ),
        ),
        Some(Err(e)) => Cond::no(LEADER_AVAILABLE, "Unreachable", e.to_string()),
        None if no_ready_leader => Cond::no(
            LEADER_AVAILABLE,
            "NoReadyReplica",
            format!("the leader Deployment of {name} has no ready replica yet"),
        ),
        None => Cond::unknown(LEADER_AVAILABLE, "NotRead", "the leader was not read yet"),
    }
}

/// `ElectionObserved`, for a managed leader that elects: who holds the Lease, or with `Etcd`
/// which master the etcd view names.
pub(super) fn election_observed(
    b: &KVCacheBackend,
    obs: &Observation,
    no_ready_leader: bool,
) -> Option<Cond> {
    if warm(b) {
        let health = obs.store.as_ref().and_then(|s| s.health.as_ref().ok());
        return Some(match health {
            Some(h) if h.service_ready => Cond::yes(
                ELECTION_OBSERVED,
                "EtcdElected",
                format!(
                    "warm failover (Mooncake's etcd election with the metadata operation log): the master at {} serves, view {}",
                    h.leader_address.as_deref().unwrap_or("an unnamed address"),
                    h.view_version
                        .map_or_else(|| "unknown".to_owned(), |v| v.to_string())
                ),
            ),
            _ => Cond::unknown(
                ELECTION_OBSERVED,
                "Campaigning",
                "warm failover (Mooncake's etcd election): no master serves yet",
            ),
        });
    }
    let elects = b
        .spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.elects());
    elects.then(|| match &obs.lease_holder {
        Some(Some(holder)) if !holder.is_empty() => Cond::yes(
            ELECTION_OBSERVED,
            "HolderElected",
            format!("the Lease is held by {holder}"),
        ),
        Some(_) if !no_ready_leader => Cond::no(
            ELECTION_OBSERVED,
            "NoHolder",
            "a leader replica is ready but the Lease names no holder (first campaign running, or the leader lacks rights on its Lease)",
        ),
        Some(_) => Cond::unknown(ELECTION_OBSERVED, "Campaigning", "the Lease has no holder yet"),
        None => Cond::unknown(ELECTION_OBSERVED, "LeaseMissing", "the Lease does not exist yet"),
    })
}
