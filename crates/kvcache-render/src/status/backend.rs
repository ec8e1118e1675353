//! A backend's status from what the operator observed: the store's answers
//! ([`crate::store`]), the leader Deployment, the Lease and the member Pods. Pure: the operator
//! fetches, calls [`backend_status`], and writes the result with [`apply`].
//!
//! One function per condition, in the order they are written, and [`phase`] from them
//! (docs/design.md#backend-phase). It lives beside the render because it judges the rendered
//! objects (their fingerprints, their groups, their Service address) against what runs.

use std::collections::{BTreeMap, BTreeSet};

use kvcache_api::backend::conditions::*;
use kvcache_api::backend::{
    BackendPhase, Capacity, ElectionStatus, EtcdStatus, FailoverRecord, KVCacheBackendStatus,
    Medium, MemberStatus, ObjectRef, UnknownSegment,
};
use kvcache_api::condition::{Cond, Status};
use kvcache_api::{KVCacheBackend, Quantity};

use crate::mounts::{OtherMember, foreign_mounts};
use crate::read::{LeaderReplicas, MemberPod};
use crate::rollout::{GroupStep, member_progress, stale_member_pods};
use crate::store::{Health, Metrics, ReadError, Segment, StoreReading};

/// Everything one pass observed.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The backend's `metadata.generation`, written back as `status.observedGeneration`.
    pub generation: Option<i64>,
    /// Being deleted.
    pub deleting: bool,
    /// Pools on it.
    pub used_by: Vec<ObjectRef>,
    /// The namespaces with a Binding on it, sorted (`World::bound_namespaces`), written as
    /// `status.boundNamespaces`.
    pub bound_namespaces: Vec<String>,
    /// Where engines connect.
    pub endpoint: Option<String>,
    /// The leader Deployment (managed; `None` while it does not exist yet).
    pub leader: Option<LeaderReplicas>,
    /// The Lease holder (`Some(None)`: the Lease exists without a holder; `None`: no Lease).
    pub lease_holder: Option<Option<String>>,
    /// The store's answers (`None`: not read this pass).
    pub store: Option<StoreReading>,
    /// Member Pods of every group.
    pub members: Vec<MemberPod>,
    /// The rendered fingerprint of each group, by index.
    pub rendered_hashes: Vec<String>,
    /// The member rollout's step of each group this pass ([`crate::rollout::member_rollout`]).
    pub rollout: Vec<GroupStep>,
    /// The rollout holds standbys back until the electing template is out
    /// (docs/design.md#two-step-election).
    pub standbys_held: bool,
    /// `mooncake_master --version` as the running leader reported it, with the version the
    /// image tag names.
    pub store_version: Option<(String, Option<String>)>,
    /// Why the backend's objects could not be rendered this pass (a condition reason and the
    /// message), e.g. no store image: the phase is then `Error` whatever else was observed.
    pub render_refused: Option<(&'static str, String)>,
    /// Why the cluster settings could not be read (the refusal naming the key), and whether
    /// the last good settings were kept (`false`: there were none, nothing was rendered).
    pub settings_refused: Option<(String, bool)>,
    /// The member Pods of the other backends (in the same namespace): a segment of one of them
    /// on this master is a member mounted on the wrong master (`crate::mounts`).
    pub other_members: Vec<OtherMember>,
    /// A warm backend's etcd StatefulSet: Pods asked for and ready (`None`: not warm, or the
    /// StatefulSet does not exist yet), with the endpoint list.
    pub etcd: Option<EtcdStatus>,
    /// The member groups on the host network, out of every NetworkPolicy's reach (`None`: the
    /// objects were not rendered in this pass).
    pub unguarded_groups: Option<Vec<String>>,
    /// The segments of no known Pod the serving master lists (`crate::mounts::unknown_segments`);
    /// `None`: not judged this pass (no serving master, no listing, or an external store).
    pub unknown_segments: Option<Vec<UnknownSegment>>,
    /// Whether confirmed unknown segments are drained (`--unknown-segments=drain`) or only
    /// reported.
    pub drain_unknown: bool,
    /// Whether something enforces the policies, as the isolation probe found
    /// (`crate::backend::probe`); `None`: not probed (nothing rendered, or an observation made
    /// without it), and `NetworkIsolated` says only that the policies are applied.
    pub isolation: Option<crate::backend::probe::Isolation>,
    /// A new probe record to write to `status.isolationProbe` (`None`: keep the stored one).
    pub isolation_probe: Option<kvcache_api::backend::IsolationProbe>,
}

impl Observation {
    /// Nothing observed yet, for the backend's `generation`.
    pub fn empty(generation: Option<i64>) -> Self {
        Observation {
            generation,
            deleting: false,
            used_by: Vec::new(),
            bound_namespaces: Vec::new(),
            endpoint: None,
            leader: None,
            lease_holder: None,
            store: None,
            members: Vec::new(),
            rendered_hashes: Vec::new(),
            rollout: Vec::new(),
            standbys_held: false,
            store_version: None,
            render_refused: None,
            settings_refused: None,
            other_members: Vec::new(),
            etcd: None,
            unguarded_groups: None,
            unknown_segments: None,
            drain_unknown: true,
            isolation: None,
            isolation_probe: None,
        }
    }
}

/// What to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Computed {
    /// The phase to write to `status.phase`.
    pub phase: BackendPhase,
    /// Why not `Ready`.
    pub phase_message: Option<String>,
    /// Capacity (absent unless read from a serving leader).
    pub capacity: Option<Capacity>,
    /// Member rows.
    pub members: Vec<MemberStatus>,
    /// Conditions, without times.
    pub conditions: Vec<Cond>,
    /// A warm backend's election record (`None` otherwise).
    pub election: Option<ElectionStatus>,
}

fn managed(b: &KVCacheBackend) -> bool {
    b.spec.connection.managed.is_some()
}

fn has_tier(b: &KVCacheBackend) -> bool {
    b.spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.members.iter().any(|g| g.tier().is_some()))
}

fn medium_of(b: &KVCacheBackend, group: usize) -> String {
    b.spec
        .connection
        .managed
        .as_ref()
        .and_then(|m| m.members.get(group))
        .map(|g| match g.medium {
            Medium::Dram => "DRAM",
            Medium::Vram => "VRAM",
        })
        .unwrap_or_default()
        .to_owned()
}

fn name(b: &KVCacheBackend) -> &str {
    b.metadata.name.as_deref().unwrap_or_default()
}

/// Capacity (docs/design.md#capacity): memory, plus the disk tier when one is declared
/// (external: both families).
fn capacity(b: &KVCacheBackend, m: &Metrics) -> Option<Capacity> {
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

/// Member rows: one per listed segment, joined to a member Pod by its advertised host.
fn member_rows(b: &KVCacheBackend, segments: &[Segment], pods: &[MemberPod]) -> Vec<MemberStatus> {
    let mut rows: Vec<MemberStatus> = segments
        .iter()
        .map(|s| {
            let matching: Vec<&MemberPod> = pods
                .iter()
                .filter(|p| !p.ip.is_empty() && p.ip == s.host())
                .collect();
            let (node_name, medium) = match (managed(b), matching.as_slice()) {
                (true, [one]) => (one.node.clone(), medium_of(b, one.group)),
                _ => (String::new(), String::new()),
            };
            MemberStatus {
                segment_id: s.segment_id.clone(),
                client_id: s.client_id.clone(),
                segment_name: s.segment_name.clone(),
                node_name,
                medium,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.segment_id.cmp(&b.segment_id));
    rows
}

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

fn warm(b: &KVCacheBackend) -> bool {
    b.spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.warm())
}

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
fn etcd_available(etcd: Option<&EtcdStatus>) -> Cond {
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
fn failover_kept_cache(e: &ElectionStatus) -> Option<Cond> {
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

/// A managed backend whose leader Deployment has no ready replica (or does not exist yet).
fn no_ready_leader(b: &KVCacheBackend, obs: &Observation) -> bool {
    managed(b) && obs.leader.is_none_or(|l| l.ready == 0)
}

/// `Deletable`: held while a pool uses the backend.
fn deletable(used_by: &[ObjectRef]) -> Cond {
    if used_by.is_empty() {
        Cond::yes(DELETABLE, "NotInUse", "no pool uses this backend")
    } else {
        Cond::no(
            DELETABLE,
            "InUse",
            format!("in use by {}; delete those first", listed(used_by)),
        )
    }
}

/// The pools on the backend, as a sentence names them.
fn listed(used_by: &[ObjectRef]) -> String {
    used_by
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `LeaderAvailable`: the store's `/health` verdict (`None`: not read this pass).
fn leader_available(
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

/// `CapacityObserved`: whether [`capacity`] could be read (`metrics`: the scrape, `None` when
/// the store was not read this pass).
fn capacity_observed(
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

/// The member rows: from the segment listing of a serving leader, else the stored ones.
fn member_rows_or_stored(
    b: &KVCacheBackend,
    obs: &Observation,
    serving: bool,
    previous: &KVCacheBackendStatus,
) -> Vec<MemberStatus> {
    match (&obs.store, serving) {
        (
            Some(StoreReading {
                segments: Ok(s), ..
            }),
            true,
        ) => member_rows(b, s, &obs.members),
        _ => previous.members.clone(),
    }
}

/// `MembersMounted` (docs/design.md#members-mounted), checked against a serving leader only,
/// and the problem that makes the phase `Degraded`, if any.
fn members_mounted(
    obs: &Observation,
    serving: bool,
    metrics: Option<&Metrics>,
) -> (Cond, Option<String>) {
    match (&obs.store, serving) {
        (Some(reading), true) => {
            members_against_listing(reading, metrics, &obs.members, &obs.other_members)
        }
        _ => (
            Cond::unknown(
                MEMBERS_MOUNTED,
                "LeaderNotServing",
                "members are checked against a serving leader",
            ),
            None,
        ),
    }
}

/// `MembersMounted` from a serving leader's answers: a member that cannot start, the listing,
/// then each ready member Pod against the segments listed; and the problem, if any.
fn members_against_listing(
    reading: &StoreReading,
    metrics: Option<&Metrics>,
    pods: &[MemberPod],
    others: &[OtherMember],
) -> (Cond, Option<String>) {
    const T: &str = MEMBERS_MOUNTED;
    if let Some(stuck) = member_not_starting(pods) {
        return stuck;
    }
    let segments = match &reading.segments {
        Ok(s) => s,
        Err(ReadError::Status { status: 404, .. }) => {
            return (
                Cond::unknown(
                    T,
                    "SegmentListingNotServed",
                    "the master does not serve /get_segments_detail (older than 0.3.12): members cannot be checked one by one",
                ),
                None,
            );
        }
        Err(e) => {
            let why = format!("the segment listing could not be read: {e}");
            return (Cond::no(T, "ListingFailed", why.clone()), Some(why));
        }
    };
    if let Some(foreign) = foreign_member(segments, pods, others) {
        return foreign;
    }
    let ready: Vec<&MemberPod> = pods.iter().filter(|p| p.ready && !p.terminating).collect();
    if ready.is_empty() {
        return (
            Cond::unknown(
                T,
                "NoReadyMembers",
                "no member Pod is ready yet (members still starting are not counted against the backend)",
            ),
            None,
        );
    }
    if metrics.and_then(|m| m.memory_bytes) == Some(0) {
        let why = format!(
            "the master reports no capacity: none of the {} ready member Pods is mounted",
            ready.len()
        );
        return (Cond::no(T, "NoSegments", why.clone()), Some(why));
    }
    let listed: BTreeSet<&str> = segments.iter().map(Segment::host).collect();
    let missing: Vec<String> = ready
        .iter()
        .filter(|p| !listed.contains(p.ip.as_str()))
        .map(|p| format!("{} ({})", p.name, where_(p)))
        .collect();
    if !missing.is_empty() {
        let why = format!(
            "{} of {} ready member Pods have no segment registered with the master: {}",
            missing.len(),
            ready.len(),
            missing.join(", ")
        );
        return (Cond::no(T, "SegmentsShort", why.clone()), Some(why));
    }
    let mut seen = BTreeMap::<&str, usize>::new();
    for p in &ready {
        *seen.entry(p.ip.as_str()).or_default() += 1;
    }
    if let Some((ip, _)) = seen.iter().find(|(_, n)| **n > 1) {
        return (
            Cond::no(
                T,
                "AmbiguousMemberIdentity",
                format!(
                    "two ready member Pods share the address {ip} (host networking): rows keep only what they agree on"
                ),
            ),
            None,
        );
    }
    if metrics.and_then(|m| m.active_clients) == Some(0) {
        let why = format!(
            "the master lists {} segments but reports no active client: members have not reattached since the leader started; they remount on their next heartbeat",
            segments.len()
        );
        return (Cond::no(T, "ClientsNotReattached", why.clone()), Some(why));
    }
    (
        Cond::yes(
            T,
            "AllMounted",
            format!(
                "every ready member Pod ({}) has its segment registered",
                ready.len()
            ),
        ),
        None,
    )
}

/// A member that cannot start, or cannot be scheduled, degrades the backend with its own
/// reason even while others serve; members still starting are not counted.
fn member_not_starting(pods: &[MemberPod]) -> Option<(Cond, Option<String>)> {
    let (pod, (reason, message)) = pods
        .iter()
        .filter(|p| !p.terminating)
        .find_map(|p| p.problem.as_ref().map(|pr| (p, pr)))?;
    let why = format!(
        "member Pod {} ({}): {reason}: {message}",
        pod.name,
        where_(pod)
    );
    let cond_reason = match reason.as_str() {
        "CrashLoopBackOff" => "MemberCrashLooping",
        "Unschedulable" => "MemberUnschedulable",
        _ => "MemberNotStarting",
    };
    Some((
        Cond::no(MEMBERS_MOUNTED, cond_reason, why.clone()),
        Some(why),
    ))
}

/// Segments on this master of another backend's members (they are restarted to mount on their
/// own master).
fn foreign_member(
    segments: &[Segment],
    pods: &[MemberPod],
    others: &[OtherMember],
) -> Option<(Cond, Option<String>)> {
    let foreign = foreign_mounts(segments, pods, others);
    if foreign.is_empty() {
        return None;
    }
    let named: Vec<String> = foreign
        .iter()
        .map(|m| {
            format!(
                "{} of backend {} ({}, {})",
                m.pod.name,
                m.backend,
                where_(&m.pod),
                m.pod.ip
            )
        })
        .collect();
    let why = format!(
        "the master lists segments of another backend's members: {}; they are restarted to mount on their own master",
        named.join(", ")
    );
    Some((
        Cond::no(MEMBERS_MOUNTED, "ForeignMember", why.clone()),
        Some(why),
    ))
}

fn where_(p: &MemberPod) -> String {
    if p.node.is_empty() {
        "not scheduled".to_owned()
    } else {
        format!("node {}", p.node)
    }
}

/// `PoolWrites` (docs/design.md#pool-writes), asked of a serving leader only.
fn pool_writes(obs: &Observation, serving: bool) -> Cond {
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

/// `RolloutComplete`: every leader replica and member Pod on the current template; while member
/// Pods are replaced, how: drained first (`MembersDraining`) or not, and why
/// (`MembersRolledWithoutDrain`).
fn rollout_complete(b: &KVCacheBackend, obs: &Observation) -> Cond {
    let stale = stale_member_pods(&obs.members, &obs.rendered_hashes);
    match obs.leader {
        _ if obs.standbys_held => Cond::no(
            ROLLOUT_COMPLETE,
            "ReplicasPending",
            "election is being enabled at one replica first; standbys are added once that rollout is complete",
        ),
        Some(l)
            if l.observed && l.updated == l.desired && l.total == l.desired && stale.is_empty() =>
        {
            Cond::yes(
                ROLLOUT_COMPLETE,
                "UpToDate",
                "every leader replica and member Pod runs the current template",
            )
        }
        Some(l) => {
            let leader = format!(
                "leader: {} of {} replicas updated ({} Pods in all)",
                l.updated, l.desired, l.total
            );
            // While members roll, how (docs/design.md#member-rollout).
            match member_progress(&obs.rollout).filter(|_| !stale.is_empty()) {
                Some((reason, members)) => {
                    Cond::no(ROLLOUT_COMPLETE, reason, format!("{leader}; {members}"))
                }
                None => Cond::no(
                    ROLLOUT_COMPLETE,
                    "RolloutInProgress",
                    format!("{leader}; {} member Pods to replace", stale.len()),
                ),
            }
        }
        None if managed(b) => Cond::unknown(
            ROLLOUT_COMPLETE,
            "NotCreated",
            "the leader Deployment does not exist yet",
        ),
        None => Cond::yes(
            ROLLOUT_COMPLETE,
            "External",
            "an external store has nothing to roll out",
        ),
    }
}

/// `ElectionObserved`, for a managed leader that elects: who holds the Lease, or with `Etcd`
/// which master the etcd view names.
fn election_observed(b: &KVCacheBackend, obs: &Observation, no_ready_leader: bool) -> Option<Cond> {
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

/// `entries=N` from the survey's termination message.
fn survey_entries(message: &str) -> Option<u64> {
    message
        .split_whitespace()
        .find_map(|w| w.strip_prefix("entries="))
        .and_then(|n| n.parse().ok())
}

/// `TierWasEmpty` (docs/design.md#tier-was-empty): written once, from the first member Pods'
/// surveys.
fn tier_was_empty(pods: &[MemberPod], previous: &KVCacheBackendStatus) -> Option<Cond> {
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
fn tier_registered(
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
fn store_version_observed(obs: &Observation) -> Option<Cond> {
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

/// `NetworkIsolated` (written once the objects were rendered): the leader and member Pods take
/// store traffic only from the backend's own Pods and the namespaces bound to it, and whether
/// something enforces that, as the isolation probe found (docs/isolation.md#enforcement-checked);
/// or which member groups run on the host network where no NetworkPolicy reaches.
fn network_isolated(obs: &Observation) -> Option<Cond> {
    use crate::backend::probe::Isolation;
    use kvcache_api::backend::ProbeResult;
    const T: &str = NETWORK_ISOLATED;
    let unguarded = obs.unguarded_groups.as_ref()?;
    if !unguarded.is_empty() {
        return Some(Cond::no(
            T,
            "HostNetworkMembers",
            format!(
                "the Pods of member DaemonSet {} run on the host network (the RDMA fabric), which no NetworkPolicy covers: any Pod that reaches their node reaches their ports; keep those nodes for trusted tenants or guard them with the hosts' firewall",
                unguarded.join(", ")
            ),
        ));
    }
    const APPLIED: &str = "the leader and member Pods take store traffic only from this backend's Pods and the namespaces bound to it, the admin port only from the operator";
    let probed = |r: &kvcache_api::backend::IsolationProbe| {
        format!(
            "probe Pod {}, in a namespace no Binding admits, dialled the master's RPC port at {}",
            r.pod, r.target
        )
    };
    Some(match &obs.isolation {
        None => Cond::yes(T, "PoliciesApplied", APPLIED),
        Some(Isolation::Off) => Cond::unknown(
            T,
            "Unverified",
            format!(
                "{APPLIED} by their NetworkPolicies; whether an enforcer applies them is not checked (the operator runs with --isolation-probe=false)"
            ),
        ),
        Some(Isolation::OwnNamespaceBound) => Cond::unknown(
            T,
            "Unverified",
            format!(
                "{APPLIED} by their NetworkPolicies; whether an enforcer applies them cannot be checked: the operator's own namespace holds a Binding on this backend, so a probe Pod there is admitted; bind the workloads of another namespace instead"
            ),
        ),
        Some(Isolation::Probing { previous }) => Cond::unknown(
            T,
            "Probing",
            format!(
                "{APPLIED} by their NetworkPolicies; a probe Pod checks that they are enforced{}",
                previous.as_ref().map_or_else(String::new, |r| format!(
                    " (the last probe, of earlier policies or without an answer: {:?}, {})",
                    r.result, r.message
                ))
            ),
        ),
        Some(Isolation::Probed(r)) => match r.result {
            ProbeResult::Enforced => Cond::yes(
                T,
                "Enforced",
                format!(
                    "{APPLIED}, enforced: {} and was refused ({})",
                    probed(r),
                    r.message
                ),
            ),
            ProbeResult::NotEnforced => Cond::no(
                T,
                "NotEnforced",
                format!(
                    "{} and connected: nothing enforces the store's NetworkPolicies, so any Pod of the cluster reaches the store's ports; run a NetworkPolicy enforcer (a CNI that implements NetworkPolicy; docs/isolation.md#an-enforcer-is-required)",
                    probed(r)
                ),
            ),
            ProbeResult::Inconclusive => Cond::unknown(
                T,
                "ProbeFailed",
                format!(
                    "{APPLIED} by their NetworkPolicies; the probe of their enforcement gave no answer ({}: {}); it is tried again within {} minutes",
                    r.pod,
                    r.message,
                    crate::backend::probe::RETRY_INCONCLUSIVE.as_secs() / 60
                ),
            ),
        },
    })
}

/// `Rendered`, written only when the backend's objects could not be rendered this pass.
fn rendered(obs: &Observation) -> Option<Cond> {
    let (reason, why) = obs.render_refused.as_ref()?;
    Some(Cond::no(RENDERED, reason, why.clone()))
}

/// `UnknownSegments`, for a managed backend (docs/isolation.md#unknown-segments): the segments
/// the serving master lists that no member Pod of the backend mounted, once listed past their
/// grace, each named with its address, its Pod and where it stands; `Unknown` while no serving
/// master's listing was read. Not written for an external store, whose members the operator
/// does not know.
fn unknown_segments(b: &KVCacheBackend, obs: &Observation) -> Option<Cond> {
    const T: &str = UNKNOWN_SEGMENTS;
    if !managed(b) {
        return None;
    }
    let Some(unknown) = &obs.unknown_segments else {
        return Some(Cond::unknown(
            T,
            "NotChecked",
            "segments are checked against a serving leader's listing",
        ));
    };
    let confirmed: Vec<&UnknownSegment> = unknown.iter().filter(|u| u.confirmed).collect();
    let pending = unknown.len() - confirmed.len();
    if confirmed.is_empty() {
        let mut why =
            "every segment the master lists is one of this backend's member Pods'".to_owned();
        if pending > 0 {
            why.push_str(&format!(
                "; {pending} more, listed for less than the master's client TTL, may be a replaced member's and are judged once it has passed"
            ));
        }
        return Some(Cond::no(T, "None", why));
    }
    let named: Vec<String> = confirmed.iter().map(|u| describe_unknown(u)).collect();
    let action = if obs.drain_unknown {
        "each is drained onto this backend's members, so that no new block lands there (state DRAINING, then DRAINED; a segment left OK has not been drained yet: its blocks had nowhere to go)"
    } else {
        "the operator runs with --unknown-segments=report and leaves them taking blocks"
    };
    Some(Cond::yes(
        T,
        "MountedByNoMember",
        format!(
            "the master lists {} no member Pod of this backend mounted: {}. The store places any tenant's blocks in such a segment's memory and serves them from there; {action}. Stop the process that mounts it (a store client set up with global_segment_size above 0); a client that must contribute memory belongs on a backend of its own (spec.tenancy: Dedicated)",
            match confirmed.len() {
                1 => "a segment".to_owned(),
                n => format!("{n} segments"),
            },
            named.join("; ")
        ),
    ))
}

/// One unknown segment as a condition or event names it.
pub fn describe_unknown(u: &UnknownSegment) -> String {
    let size = u.size.as_deref().unwrap_or_default();
    let pod = u.pod.as_deref().map_or_else(
        || "no Pod has this address".to_owned(),
        |p| format!("Pod {p}"),
    );
    let state = if u.state.is_empty() {
        String::new()
    } else {
        format!(", state {}", u.state)
    };
    format!(
        "{} ({size} at address {}, {pod}{state})",
        u.segment_name, u.address
    )
}

/// `SettingsRead`, written only while the cluster settings cannot be read: it names the key
/// and says what the operator renders with meanwhile.
fn settings_read(obs: &Observation) -> Option<Cond> {
    let (why, kept) = obs.settings_refused.as_ref()?;
    let meanwhile = if *kept {
        "the last good settings are kept until it is fixed"
    } else {
        "no settings were read since the operator started, so this backend's objects are left as they are until it is fixed"
    };
    Some(Cond::no(
        SETTINGS_READ,
        "SettingsUnreadable",
        format!("{why}; {meanwhile}"),
    ))
}

/// The phase and why it is not `Ready` (docs/design.md#backend-phase): a render refusal is an
/// `Error` whatever else was seen; then deletion, a leader not serving (`Provisioning` while a
/// managed leader has no ready replica), and `problem` (members short, a tier unregistered)
/// `Degraded`.
pub fn phase(
    b: &KVCacheBackend,
    obs: &Observation,
    serving: bool,
    conditions: &[Cond],
    problem: Option<String>,
) -> (BackendPhase, Option<String>) {
    if let Some((_, why)) = &obs.render_refused {
        (BackendPhase::Error, Some(why.clone()))
    } else if obs.deleting {
        let why = if obs.used_by.is_empty() {
            "tearing down the leader and member workloads".to_owned()
        } else {
            format!("deletion waits for {}", listed(&obs.used_by))
        };
        (BackendPhase::Deleting, Some(why))
    } else if no_ready_leader(b, obs) && !serving {
        (
            BackendPhase::Provisioning,
            Some(format!(
                "the leader Deployment of {} has no ready replica yet",
                name(b)
            )),
        )
    } else if !serving {
        let why = conditions
            .iter()
            .find(|c| c.type_ == LEADER_AVAILABLE)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        (
            BackendPhase::Error,
            Some(format!("the leader is not available: {why}")),
        )
    } else if let Some(why) = problem {
        (BackendPhase::Degraded, Some(why))
    } else {
        (BackendPhase::Ready, None)
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
