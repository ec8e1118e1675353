//! What the serving master reports of the store: `CapacityObserved` (and the capacity),
//! `PoolWrites`, a disk tier's `TierWasEmpty` and `TierRegistered`, and
//! `StoreVersionObserved`.

use kvcache_api::backend::conditions::*;
use kvcache_api::backend::{Capacity, KVCacheBackendStatus};
use kvcache_api::condition::{Cond, Status};
use kvcache_api::{KVCacheBackend, Quantity};

use super::facts::{has_tier, managed, where_};
use super::observation::Observation;
use crate::observe::read::MemberPod;
use crate::observe::store::{Metrics, ReadError, StoreReading};

/// Capacity (docs/design.md#capacity): memory, plus the disk tier when one is declared
/// (external: both families).
pub(super) fn capacity(b: &KVCacheBackend, m: &Metrics) -> Option<Capacity> {
    let memory = m.memory_bytes?;
    let disk = if managed(b) && !has_tier(b) {
        None
    } else {
        m.file_bytes
    };
    Some(Capacity {
        total: Quantity::from_bytes(memory.saturating_add(disk.unwrap_or(0))),
        memory: Some(Quantity::from_bytes(memory)),
        disk: disk.map(Quantity::from_bytes),
    })
}

/// `CapacityObserved`: whether [`capacity`] could be read (`metrics`: the scrape, `None` when
/// the store was not read this pass).
pub(super) fn capacity_observed(
    capacity: Option<&Capacity>,
    metrics: Option<&Result<Metrics, ReadError>>,
) -> Cond {
    match (capacity, metrics) {
        (Some(c), _) => Cond::yes(
            CAPACITY_OBSERVED,
            "Observed",
            format!("the leader reports {} registered", c.total.as_str()),
        ),
        (None, Some(Err(e))) => Cond::no(CAPACITY_OBSERVED, "ScrapeFailed", e.to_string()),
        (None, _) => Cond::unknown(
            CAPACITY_OBSERVED,
            "LeaderNotServing",
            "capacity is read only from a serving leader",
        ),
    }
}

/// `PoolWrites` (docs/design.md#pool-writes), asked of a serving leader only.
pub(super) fn pool_writes(obs: &Observation, serving: bool) -> Cond {
    match (&obs.store, serving) {
        (Some(reading), true) => writes_from_counters(reading),
        _ => Cond::unknown(POOL_WRITES, "LeaderNotServing", "no serving leader to ask"),
    }
}

/// `PoolWrites` from the master's put counters and the segments' allocators.
fn writes_from_counters(reading: &StoreReading) -> Cond {
    const T: &str = POOL_WRITES;
    let (Ok(m), Ok(segments)) = (&reading.metrics, &reading.segments) else {
        return Cond::unknown(
            T,
            "ReadingMissing",
            "the master's counters could not all be read",
        );
    };
    let used = segments.iter().any(|s| s.allocator_used_bytes > 0);
    match (m.put_starts, m.put_ends, m.put_revokes) {
        (_, Some(ends), _) if ends > 0 => Cond::yes(
            T,
            "PutsCompleted",
            format!("{ends} puts completed since the leader process started"),
        ),
        _ if used => Cond::yes(T, "SegmentsHoldData", "a member segment holds data"),
        (Some(starts), _, Some(revokes)) if starts > 0 && revokes > 0 => Cond::no(
            T,
            "PutsRevoked",
            format!(
                "{starts} puts started and {revokes} were revoked while no member holds any data: writes are failing (check the engines' tenant and the members' transport)"
            ),
        ),
        (Some(0), _, _) | (None, _, _) => Cond::unknown(
            T,
            "NoPutsYet",
            "no put has started since the leader process started",
        ),
        _ => Cond::unknown(T, "PutsInFlight", "puts started but none has ended yet"),
    }
}

/// `entries=N` from the survey's termination message.
fn survey_entries(message: &str) -> Option<u64> {
    message
        .split_whitespace()
        .find_map(|w| w.strip_prefix("entries="))
        .and_then(|n| n.parse().ok())
}

/// `TierWasEmpty` (docs/design.md#tier-was-empty): written once, from the first member Pods'
/// surveys.
pub(super) fn tier_was_empty(pods: &[MemberPod], previous: &KVCacheBackendStatus) -> Option<Cond> {
    const T: &str = TIER_WAS_EMPTY;
    if let Some(c) = previous.conditions.iter().find(|c| c.type_ == T) {
        let status = match c.status.as_str() {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        };
        let reason = if status == Status::True {
            "Empty"
        } else {
            "PreexistingContent"
        };
        return Some(Cond::new(T, status, reason, c.message.clone()));
    }
    let surveyed: Vec<(&MemberPod, u64)> = pods
        .iter()
        .filter_map(|p| p.survey.as_deref().and_then(survey_entries).map(|n| (p, n)))
        .collect();
    let full: Vec<String> = surveyed
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(p, n)| format!("{} ({n} entries)", where_(p)))
        .collect();
    if !full.is_empty() {
        return Some(Cond::no(
            T,
            "PreexistingContent",
            format!(
                "the disk tier's folder already held files on first start: {}; nothing was removed",
                full.join(", ")
            ),
        ));
    }
    let all_reported = !pods.is_empty() && surveyed.len() == pods.len();
    all_reported.then(|| {
        Cond::yes(
            T,
            "Empty",
            format!(
                "every one of the {} member nodes reported an empty tier folder",
                pods.len()
            ),
        )
    })
}

/// `TierRegistered`, for a backend with a disk tier: the master's tier figure once members are
/// ready; and the problem that makes the phase `Degraded` when the tier did not register.
pub(super) fn tier_registered(
    obs: &Observation,
    serving: bool,
    metrics: Option<&Metrics>,
) -> (Cond, Option<String>) {
    let ready_members = obs.members.iter().any(|p| p.ready);
    match (serving, metrics.and_then(|m| m.file_bytes)) {
        (true, Some(0)) if ready_members => {
            let why = "members are ready but the master reports no disk tier capacity (master_total_file_capacity_bytes 0): the tier did not register; check the member logs for the offload path".to_owned();
            (
                Cond::no(TIER_REGISTERED, "TierNotRegistered", why.clone()),
                Some(why),
            )
        }
        (true, Some(n)) if n > 0 => (
            Cond::yes(
                TIER_REGISTERED,
                "Registered",
                format!(
                    "the master reports {} of disk tier",
                    Quantity::from_bytes(n).as_str()
                ),
            ),
            None,
        ),
        _ => (
            Cond::unknown(
                TIER_REGISTERED,
                "NotObserved",
                "no ready member or no serving leader yet",
            ),
            None,
        ),
    }
}

/// `StoreVersionObserved`, once the running master's version is known: it against the image tag.
pub(super) fn store_version_observed(obs: &Observation) -> Option<Cond> {
    let (running, tagged) = obs.store_version.as_ref()?;
    Some(match tagged {
        Some(t) if t != running => Cond::no(
            STORE_VERSION_OBSERVED,
            "TagDisagrees",
            format!(
                "the running master reports version {running} while the image tag says {t}: the version-line check uses {running}"
            ),
        ),
        _ => Cond::yes(
            STORE_VERSION_OBSERVED,
            "Observed",
            format!("the running master reports version {running}"),
        ),
    })
}
