//! A backend's status from what the operator observed: the store's answers (`/health`,
//! `/metrics`, `/get_segments_detail`), the leader Deployment, the Lease and the member Pods.
//! Pure: the operator fetches, calls [`backend_status`], and writes the result; which member
//! Pods a rollout deletes is decided here too ([`stale_member_pods`]).
//!
//! It lives beside the render because it judges the rendered objects (their fingerprints, their
//! groups, their Service address) against what runs.

use std::collections::{BTreeMap, BTreeSet};

use kvcache_api::backend::{
    BackendPhase, Capacity, KVCacheBackendStatus, Medium, MemberStatus, ObjectRef,
};
use kvcache_api::condition::{Cond, Status};
use kvcache_api::{KVCacheBackend, Quantity};
use serde::Deserialize;

/// Condition types on a backend.
pub mod types {
    /// The leader answers and serves.
    pub const LEADER_AVAILABLE: &str = "LeaderAvailable";
    /// Every ready member Pod's segment is registered.
    pub const MEMBERS_MOUNTED: &str = "MembersMounted";
    /// `status.capacity` was read from the serving leader.
    pub const CAPACITY_OBSERVED: &str = "CapacityObserved";
    /// Writes complete.
    pub const POOL_WRITES: &str = "PoolWrites";
    /// Nothing holds the backend.
    pub const DELETABLE: &str = "Deletable";
    /// Every leader replica and member Pod runs the current template.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// The Lease names a holder.
    pub const ELECTION_OBSERVED: &str = "ElectionObserved";
    /// The disk tier's folders were empty on first start.
    pub const TIER_WAS_EMPTY: &str = "TierWasEmpty";
    /// A declared disk tier is registered with the master.
    pub const TIER_REGISTERED: &str = "TierRegistered";
    /// The running master's version agrees with the image tag.
    pub const STORE_VERSION_OBSERVED: &str = "StoreVersionObserved";
}

/// Why a read of the store failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// No answer (connection refused, timeout, DNS).
    #[error("no answer from {url}: {message}")]
    Unreachable {
        /// The URL.
        url: String,
        /// The client's message.
        message: String,
    },
    /// An HTTP error status.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// An answer that does not parse.
    #[error("{url} answered something unreadable: {message}")]
    Unreadable {
        /// The URL.
        url: String,
        /// The parser's message.
        message: String,
    },
}

/// `/health`: `service_ready` is the only verdict (`status` is always `ok`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Health {
    /// Whether the master serves.
    #[serde(default)]
    pub service_ready: bool,
    /// `leader` or `standby`.
    #[serde(default)]
    pub role: Option<String>,
    /// `serving`, `leader_warmup`, …
    #[serde(default)]
    pub ha_state: Option<String>,
}

impl Health {
    /// Parses the JSON body.
    pub fn parse(url: &str, body: &str) -> Result<Health, ReadError> {
        serde_json::from_str(body).map_err(|e| ReadError::Unreadable {
            url: url.to_owned(),
            message: e.to_string(),
        })
    }
}

/// The `/metrics` samples the status uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// `master_total_capacity_bytes`: registered memory segments.
    pub memory_bytes: Option<u64>,
    /// `master_total_file_capacity_bytes`: registered disk tier.
    pub file_bytes: Option<u64>,
    /// `master_allocated_file_size_bytes`: tier fill.
    pub file_allocated_bytes: Option<u64>,
    /// `master_active_clients`.
    pub active_clients: Option<u64>,
    /// `master_put_start_requests_total`.
    pub put_starts: Option<u64>,
    /// `master_put_end_requests_total`.
    pub put_ends: Option<u64>,
    /// `master_put_revoke_requests_total`.
    pub put_revokes: Option<u64>,
}

impl Metrics {
    /// Reads the unlabelled samples it needs from Prometheus text exposition.
    pub fn parse(text: &str) -> Metrics {
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((key, value)) = line.split_once(' ') else {
                continue;
            };
            if key.contains('{') {
                continue;
            }
            if let Ok(v) = value.trim().parse::<f64>()
                && v.is_finite()
                && v >= 0.0
            {
                // Byte gauges and counters are whole numbers, printed as integers or floats.
                samples.insert(key.to_owned(), v as u64);
            }
        }
        let get = |k: &str| samples.get(k).copied();
        Metrics {
            memory_bytes: get("master_total_capacity_bytes"),
            file_bytes: get("master_total_file_capacity_bytes"),
            file_allocated_bytes: get("master_allocated_file_size_bytes"),
            active_clients: get("master_active_clients"),
            put_starts: get("master_put_start_requests_total"),
            put_ends: get("master_put_end_requests_total"),
            put_revokes: get("master_put_revoke_requests_total"),
        }
    }
}

/// One segment of `/get_segments_detail`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Segment {
    /// `host:port` the member advertised (its Pod IP, or host IP on host networking).
    #[serde(default)]
    pub segment_name: String,
    /// The segment's identity.
    #[serde(default)]
    pub segment_id: String,
    /// The client that mounted it.
    #[serde(default)]
    pub client_id: String,
    /// Its size.
    #[serde(default)]
    pub size_bytes: u64,
    /// Bytes its allocator holds.
    #[serde(default)]
    pub allocator_used_bytes: u64,
}

impl Segment {
    /// The advertised host (the segment name without its port).
    pub fn host(&self) -> &str {
        self.segment_name
            .rsplit_once(':')
            .map_or(self.segment_name.as_str(), |(h, _)| h)
    }

    /// Parses the JSON body of `/get_segments_detail`.
    pub fn parse_all(url: &str, body: &str) -> Result<Vec<Segment>, ReadError> {
        #[derive(Deserialize)]
        struct Listing {
            #[serde(default)]
            segments: Vec<Segment>,
        }
        serde_json::from_str::<Listing>(body)
            .map(|l| l.segments)
            .map_err(|e| ReadError::Unreadable {
                url: url.to_owned(),
                message: e.to_string(),
            })
    }
}

/// The store's answers in one pass (each read on its own).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreReading {
    /// `/health`.
    pub health: Result<Health, ReadError>,
    /// `/metrics`.
    pub metrics: Result<Metrics, ReadError>,
    /// `/get_segments_detail`.
    pub segments: Result<Vec<Segment>, ReadError>,
}

/// A member Pod as the operator sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberPod {
    /// Pod name.
    pub name: String,
    /// Node it runs on (empty while unscheduled).
    pub node: String,
    /// Its IP (empty until it has one).
    pub ip: String,
    /// The member group index (from `app.kubernetes.io/component: member-<i>`).
    pub group: usize,
    /// Ready condition.
    pub ready: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Its `pod-spec-hash` annotation.
    pub hash: String,
    /// Why it is not running, when Kubernetes says (e.g. `CrashLoopBackOff`, `Unschedulable`),
    /// with the message.
    pub problem: Option<(String, String)>,
    /// The disk-tier survey's termination message (`entries=N path=…`), once it ran.
    pub survey: Option<String>,
}

/// The leader Deployment's replica counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaderReplicas {
    /// `spec.replicas`.
    pub desired: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.updatedReplicas`.
    pub updated: i32,
    /// `status.replicas` (all Pods, old and new template).
    pub total: i32,
    /// `status.observedGeneration` has caught up with `metadata.generation`.
    pub observed: bool,
}

/// Everything one pass observed.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The backend's generation.
    pub generation: Option<i64>,
    /// Being deleted.
    pub deleting: bool,
    /// Pools on it.
    pub used_by: Vec<ObjectRef>,
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
    /// The rollout holds standbys back until the electing template is out
    /// (docs/design.md#two-step-election).
    pub standbys_held: bool,
    /// `mooncake_master --version` as the running leader reported it, with the version the
    /// image tag names.
    pub store_version: Option<(String, Option<String>)>,
    /// Why the backend's objects could not be rendered this pass (a condition reason and the
    /// message), e.g. no store image: the phase is then `Error` whatever else was observed.
    pub render_refused: Option<(&'static str, String)>,
}

impl Observation {
    /// Nothing observed yet, for the backend's `generation`.
    pub fn empty(generation: Option<i64>) -> Self {
        Observation {
            generation,
            deleting: false,
            used_by: Vec::new(),
            endpoint: None,
            leader: None,
            lease_holder: None,
            store: None,
            members: Vec::new(),
            rendered_hashes: Vec::new(),
            standbys_held: false,
            store_version: None,
            render_refused: None,
        }
    }
}

/// What to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Computed {
    /// Phase.
    pub phase: BackendPhase,
    /// Why not `Ready`.
    pub phase_message: Option<String>,
    /// Capacity (absent unless read from a serving leader).
    pub capacity: Option<Capacity>,
    /// Member rows.
    pub members: Vec<MemberStatus>,
    /// Conditions, without times.
    pub conditions: Vec<Cond>,
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

/// `MembersMounted` (docs/design.md#members-mounted) and the problem that makes the phase
/// `Degraded`, if any.
fn members_mounted(
    reading: &StoreReading,
    metrics: Option<&Metrics>,
    pods: &[MemberPod],
) -> (Cond, Option<String>) {
    use types::MEMBERS_MOUNTED as T;
    // A member that cannot start, or cannot be scheduled, degrades the backend with its own
    // reason even while others serve; members still starting are not counted.
    if let Some((pod, (reason, message))) = pods
        .iter()
        .filter(|p| !p.terminating)
        .find_map(|p| p.problem.as_ref().map(|pr| (p, pr)))
    {
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
        return (Cond::no(T, cond_reason, why.clone()), Some(why));
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

fn where_(p: &MemberPod) -> String {
    if p.node.is_empty() {
        "not scheduled".to_owned()
    } else {
        format!("node {}", p.node)
    }
}

/// `PoolWrites` (docs/design.md#pool-writes).
fn pool_writes(reading: &StoreReading) -> Cond {
    use types::POOL_WRITES as T;
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

/// Member Pods whose template fingerprint differs from the rendered one: the rollout deletes
/// exactly these (DaemonSets are `OnDelete`). Pods already terminating are left alone.
pub fn stale_member_pods<'a>(pods: &'a [MemberPod], rendered: &[String]) -> Vec<&'a str> {
    pods.iter()
        .filter(|p| !p.terminating)
        .filter(|p| rendered.get(p.group).is_some_and(|h| *h != p.hash))
        .map(|p| p.name.as_str())
        .collect()
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
    use types::TIER_WAS_EMPTY as T;
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

/// The status of a backend from one pass of observation. `previous` is what is stored (the
/// member list is kept when the listing cannot be read; `TierWasEmpty` is written once).
pub fn backend_status(
    b: &KVCacheBackend,
    obs: &Observation,
    previous: &KVCacheBackendStatus,
) -> Computed {
    use types::*;
    let mut conditions = Vec::new();
    let name = name(b);

    // Deletable: held while a pool uses the backend.
    conditions.push(if obs.used_by.is_empty() {
        Cond::yes(DELETABLE, "NotInUse", "no pool uses this backend")
    } else {
        Cond::no(
            DELETABLE,
            "InUse",
            format!(
                "in use by {}; delete those first",
                obs.used_by
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    });

    // The leader.
    let no_ready_leader = managed(b) && obs.leader.is_none_or(|l| l.ready == 0);
    let health = obs.store.as_ref().map(|s| &s.health);
    let serving = matches!(health, Some(Ok(h)) if h.service_ready);
    conditions.push(match health {
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
    });

    // Capacity: only from a serving leader; a failed scrape clears it.
    let metrics = obs.store.as_ref().and_then(|s| s.metrics.as_ref().ok());
    let cap = if serving {
        metrics.and_then(|m| capacity(b, m))
    } else {
        None
    };
    conditions.push(match (&cap, obs.store.as_ref().map(|s| &s.metrics)) {
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
    });

    // Members.
    let (mounted, members, shortfall) = match (&obs.store, serving) {
        (Some(reading), true) => {
            let (cond, problem) = members_mounted(reading, metrics, &obs.members);
            let rows = match &reading.segments {
                Ok(s) => member_rows(b, s, &obs.members),
                Err(_) => previous.members.clone(),
            };
            (cond, rows, problem)
        }
        _ => (
            Cond::unknown(
                MEMBERS_MOUNTED,
                "LeaderNotServing",
                "members are checked against a serving leader",
            ),
            previous.members.clone(),
            None,
        ),
    };
    conditions.push(mounted);
    conditions.push(match (&obs.store, serving) {
        (Some(reading), true) => pool_writes(reading),
        _ => Cond::unknown(POOL_WRITES, "LeaderNotServing", "no serving leader to ask"),
    });

    // Rollout.
    let stale = stale_member_pods(&obs.members, &obs.rendered_hashes);
    conditions.push(match obs.leader {
        _ if obs.standbys_held => Cond::no(
            ROLLOUT_COMPLETE,
            "ReplicasPending",
            "election is being enabled at one replica first; standbys are added once that rollout is complete",
        ),
        Some(l) if l.observed && l.updated == l.desired && l.total == l.desired && stale.is_empty() => {
            Cond::yes(ROLLOUT_COMPLETE, "UpToDate", "every leader replica and member Pod runs the current template")
        }
        Some(l) => Cond::no(
            ROLLOUT_COMPLETE,
            "RolloutInProgress",
            format!(
                "leader: {} of {} replicas updated ({} Pods in all); {} member Pods to replace",
                l.updated,
                l.desired,
                l.total,
                stale.len()
            ),
        ),
        None if managed(b) => Cond::unknown(
            ROLLOUT_COMPLETE,
            "NotCreated",
            "the leader Deployment does not exist yet",
        ),
        None => Cond::yes(ROLLOUT_COMPLETE, "External", "an external store has nothing to roll out"),
    });

    // Election.
    if b.spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.elects())
    {
        conditions.push(match &obs.lease_holder {
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
        });
    }

    // The disk tier.
    let mut tier_problem = None;
    if has_tier(b) {
        if let Some(c) = tier_was_empty(&obs.members, previous) {
            conditions.push(c);
        }
        let ready_members = obs.members.iter().any(|p| p.ready);
        conditions.push(match (serving, metrics.and_then(|m| m.file_bytes)) {
            (true, Some(0)) if ready_members => {
                let why = "members are ready but the master reports no disk tier capacity (master_total_file_capacity_bytes 0): the tier did not register; check the member logs for the offload path".to_owned();
                tier_problem = Some(why.clone());
                Cond::no(TIER_REGISTERED, "TierNotRegistered", why)
            }
            (true, Some(n)) if n > 0 => Cond::yes(
                TIER_REGISTERED,
                "Registered",
                format!("the master reports {} of disk tier", Quantity::from_bytes(n).as_str()),
            ),
            _ => Cond::unknown(TIER_REGISTERED, "NotObserved", "no ready member or no serving leader yet"),
        });
    }

    // The store's own version against the image tag.
    if let Some((running, tagged)) = &obs.store_version {
        conditions.push(match tagged {
            Some(t) if t != running => Cond::no(
                STORE_VERSION_OBSERVED,
                "TagDisagrees",
                format!("the running master reports version {running} while the image tag says {t}: the version-line check uses {running}"),
            ),
            _ => Cond::yes(
                STORE_VERSION_OBSERVED,
                "Observed",
                format!("the running master reports version {running}"),
            ),
        });
    }

    // Phase (docs/design.md#backend-phase).
    let (phase, message) = if obs.deleting {
        let why = if obs.used_by.is_empty() {
            "tearing down the leader and member workloads".to_owned()
        } else {
            format!(
                "deletion waits for {}",
                obs.used_by
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        (BackendPhase::Deleting, Some(why))
    } else if managed(b) && no_ready_leader && !serving {
        (
            BackendPhase::Provisioning,
            Some(format!(
                "the leader Deployment of {name} has no ready replica yet"
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
    } else if let Some(why) = shortfall.or(tier_problem) {
        (BackendPhase::Degraded, Some(why))
    } else {
        (BackendPhase::Ready, None)
    };
    let (phase, message) = match &obs.render_refused {
        Some((reason, why)) => {
            conditions.push(Cond::no("Rendered", reason, why.clone()));
            (BackendPhase::Error, Some(why.clone()))
        }
        None => (phase, message),
    };
    Computed {
        phase,
        phase_message: message,
        capacity: cap,
        members,
        conditions,
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
        store_version: obs
            .store_version
            .as_ref()
            .map(|(running, _)| running.clone()),
        conditions: kvcache_api::condition::merge(
            &stored.conditions,
            &computed.conditions,
            now,
            obs.generation,
        ),
    }
}

/// Whether the leader Deployment's template runs the elector.
fn elects(d: &k8s_openapi::api::apps::v1::Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.command.as_ref())
        .and_then(|c| c.first())
        .is_some_and(|c| c == crate::backend::ELECTOR_PATH)
}

/// The two-step election enablement (docs/design.md#two-step-election): when the live leader
/// Deployment does not run the elector yet and the rendered one asks for standbys, election is
/// first enabled at one replica; the standbys follow once that rollout is complete. Returns
/// whether standbys are held back.
pub fn hold_standbys(
    live: Option<&k8s_openapi::api::apps::v1::Deployment>,
    rendered: &k8s_openapi::api::apps::v1::Deployment,
) -> bool {
    let wanted = rendered.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(live) = live else {
        return false;
    };
    if wanted <= 1 || !elects(rendered) {
        return false;
    }
    if !elects(live) {
        return true;
    }
    // Election is on in the live template; while it runs at one replica, wait for that rollout.
    let replicas = live.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = live.status.clone().unwrap_or_default();
    let caught_up = status.observed_generation.is_some()
        && status.observed_generation == live.metadata.generation;
    replicas == 1
        && !(caught_up
            && status.updated_replicas.unwrap_or(0) == 1
            && status.replicas.unwrap_or(0) == 1)
}

/// How a ModelDeployment's `kvCache.poolRef` resolved this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// No `kvCache`: nothing to attach.
    NotApplicable,
    /// No Binding of that name in the deployment's namespace.
    BindingNotFound {
        /// The name given.
        binding: String,
        /// The namespace looked in.
        namespace: String,
    },
    /// The Binding is being deleted.
    BindingDeleting {
        /// The Binding.
        binding: String,
    },
    /// The Binding exists but its pool or backend does not resolve.
    BindingNotReady {
        /// The Binding.
        binding: String,
        /// Why.
        why: String,
    },
    /// Binding, pool and domain.
    Resolved {
        /// The Binding.
        binding: String,
        /// Its pool.
        pool: String,
        /// Its tenant.
        tenant: String,
    },
}

/// One role's Deployment as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleObservation {
    /// The role.
    pub name: String,
    /// `spec.replicas` wanted.
    pub desired: i32,
    /// Ready replicas.
    pub ready: i32,
    /// Replicas on the current template.
    pub updated: i32,
    /// All replicas.
    pub total: i32,
    /// The Deployment exists and its controller has seen the current spec.
    pub observed: bool,
    /// A take-over role (`command`): no cache settings.
    pub unmanaged: bool,
}

/// Everything one ModelDeployment pass observed.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelObservation {
    /// How the cache reference resolved.
    pub resolution: Resolution,
    /// Why the roles could not be rendered (an injection refusal, a missing InstanceType):
    /// its CamelCase reason and message.
    pub refusal: Option<(&'static str, String)>,
    /// The roles' Deployments.
    pub roles: Vec<RoleObservation>,
    /// Bytes the master charges the domain's tenant (`None`: not read).
    pub tenant_charged: Option<u64>,
    /// Rendered changes were held back (no cache connection resolved this pass).
    pub held: bool,
    /// Being deleted.
    pub deleting: bool,
    /// Roles whose InstanceType does not exist: (role, InstanceType).
    pub missing_instance_types: Vec<(String, String)>,
}

/// A ModelDeployment's conditions and phase from what was observed (docs/design.md#model-status).
pub fn model_status(
    obs: &ModelObservation,
) -> (
    kvcache_api::model::ModelDeploymentPhase,
    Option<String>,
    Vec<Cond>,
) {
    use kvcache_api::model::ModelDeploymentPhase as Phase;
    let mut conds = Vec::new();
    let (registered, attachable) = match &obs.resolution {
        Resolution::NotApplicable => (
            Cond::yes(
                "DomainRegistered",
                "NotApplicable",
                "no kvCache: the replicas run without the shared cache",
            ),
            false,
        ),
        Resolution::BindingNotFound { binding, namespace } => (
            Cond::no(
                "DomainRegistered",
                "BindingNotFound",
                format!(
                    "spec.kvCache.poolRef.name names {binding}, but there is no KVCachePoolBinding {namespace}/{binding}: name a Binding in this namespace (a pool's name, or another namespace's Binding, never attaches)"
                ),
            ),
            false,
        ),
        Resolution::BindingDeleting { binding } => (
            Cond::no(
                "DomainRegistered",
                "BindingDeleting",
                format!(
                    "KVCachePoolBinding {binding} is being deleted; the replicas keep writing until it goes"
                ),
            ),
            false,
        ),
        Resolution::BindingNotReady { binding, why } => (
            Cond::no(
                "DomainRegistered",
                "BindingNotReady",
                format!("KVCachePoolBinding {binding}: {why}"),
            ),
            false,
        ),
        Resolution::Resolved {
            binding,
            pool,
            tenant,
        } => (
            Cond::yes(
                "DomainRegistered",
                "Registered",
                format!(
                    "domain {tenant} through KVCachePoolBinding {binding} on KVCachePool {pool}"
                ),
            ),
            true,
        ),
    };
    conds.push(registered);
    let managed_roles: Vec<&RoleObservation> = obs.roles.iter().filter(|r| !r.unmanaged).collect();
    let ready_replicas: i32 = managed_roles.iter().map(|r| r.ready).sum();
    conds.push(match (&obs.resolution, &obs.refusal) {
        (Resolution::NotApplicable, _) => Cond::yes("CacheAttached", "NotApplicable", "no kvCache"),
        (_, Some((reason, message))) => Cond::no("CacheAttached", reason, message.clone()),
        _ if !attachable => Cond::unknown("CacheAttached", "NotResolved", "the cache reference does not resolve; see DomainRegistered"),
        _ if managed_roles.is_empty() && !obs.roles.is_empty() => Cond::unknown(
            "CacheAttached",
            "Unmanaged",
            "every role takes over its command: the operator adds no cache settings",
        ),
        _ if obs.tenant_charged.is_some_and(|b| b > 0) => Cond::yes(
            "CacheAttached",
            "CacheActive",
            format!("the store charges the domain {} bytes", obs.tenant_charged.unwrap_or(0)),
        ),
        _ if ready_replicas == 0 => Cond::unknown("CacheAttached", "NoReplicaReady", "no replica is ready yet"),
        _ => Cond::unknown(
            "CacheAttached",
            "NoObservationAvailable",
            "the ready replicas reported no store operation and the domain holds no data: normal while idle",
        ),
    });
    conds.push(if obs.missing_instance_types.is_empty() {
        Cond::yes(
            "InstanceTypesResolved",
            "Resolved",
            "every role's InstanceType exists",
        )
    } else {
        Cond::no(
            "InstanceTypesResolved",
            "InstanceTypeNotFound",
            obs.missing_instance_types
                .iter()
                .map(|(role, it)| {
                    format!(
                        "role {role} names InstanceType {it}, which does not exist: create it (kubectl get instancetypes lists them) or name another in roles[].instanceType"
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        )
    });
    let behind: Vec<&RoleObservation> = obs
        .roles
        .iter()
        .filter(|r| !(r.observed && r.updated == r.desired && r.total == r.desired))
        .collect();
    conds.push(if obs.held {
        Cond::no(
            "ReplicasUpToDate",
            "RolloutHeldByCache",
            "no cache connection resolved this pass: replicas whose render differs are left in place until it does",
        )
    } else if obs.refusal.is_some() {
        Cond::no(
            "ReplicasUpToDate",
            "RolloutHeldByCache",
            "the roles cannot be attached to the cache (see CacheAttached): no replica is started with a broken connector",
        )
    } else if obs.roles.iter().any(|r| !r.observed) {
        Cond::unknown("ReplicasUpToDate", "RolloutNotObserved", "a role's Deployment has not observed its current spec yet")
    } else if behind.is_empty() {
        Cond::yes("ReplicasUpToDate", "UpToDate", "every replica runs the current template")
    } else {
        Cond::no(
            "ReplicasUpToDate",
            "RolloutInProgress",
            behind
                .iter()
                .map(|r| format!("{}: {} of {} updated", r.name, r.updated, r.desired))
                .collect::<Vec<_>>()
                .join("; "),
        )
    });
    let short: Vec<String> = obs
        .roles
        .iter()
        .filter(|r| r.ready < r.desired)
        .map(|r| format!("{} {}/{} ready", r.name, r.ready, r.desired))
        .collect();
    let (phase, message) = if obs.deleting {
        (Phase::Deleting, Some("being deleted".to_owned()))
    } else if let Some((_, m)) = &obs.refusal {
        (Phase::Degraded, Some(m.clone()))
    } else if short.is_empty() && !obs.roles.is_empty() {
        (Phase::Ready, None)
    } else if obs.roles.iter().all(|r| r.ready == 0) {
        (
            Phase::Starting,
            Some(if short.is_empty() {
                "no role rendered yet".to_owned()
            } else {
                short.join(", ")
            }),
        )
    } else {
        (Phase::Degraded, Some(short.join(", ")))
    };
    (phase, message, conds)
}

/// A ModelDeployment's whole status: [`model_status`]'s phase and conditions, then `extra` (the
/// shared-cache condition), the attachment as it resolved (`domain`: the reached Binding's), the
/// roles as observed and the shared-cache figures, its conditions merged with the stored ones at
/// `now` (a condition that did not change keeps its transition time).
pub fn model_deployment_status(
    md: &kvcache_api::ModelDeployment,
    obs: &ModelObservation,
    domain: Option<&kvcache_api::pool::Domain>,
    shared_cache: Option<kvcache_api::model::SharedCacheStatus>,
    extra: Vec<Cond>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> kvcache_api::model::ModelDeploymentStatus {
    use kvcache_api::model::{KvCacheStatus, ModelDeploymentStatus, RoleStatus};
    let (phase, message, mut conditions) = model_status(obs);
    conditions.extend(extra);
    let generation = md.metadata.generation;
    let stored = md.status.clone().unwrap_or_default();
    let kv_cache = match (&obs.resolution, domain) {
        (Resolution::Resolved { binding, pool, .. }, Some(domain)) => Some(KvCacheStatus {
            binding: binding.clone(),
            pool: Some(pool.clone()),
            domain: Some(domain.clone()),
        }),
        _ => md.spec.kv_cache.as_ref().map(|k| KvCacheStatus {
            binding: k.pool_ref.name.clone(),
            pool: None,
            domain: None,
        }),
    };
    ModelDeploymentStatus {
        observed_generation: generation,
        phase: Some(phase),
        phase_message: message,
        kv_cache,
        roles: md
            .spec
            .roles
            .iter()
            .zip(&obs.roles)
            .map(|(r, o)| RoleStatus {
                name: r.name.clone(),
                kind: r.kind,
                desired: r.replicas,
                ready: o.ready,
                unmanaged: o.unmanaged,
            })
            .collect(),
        shared_cache,
        conditions: kvcache_api::condition::merge(&stored.conditions, &conditions, now, generation),
    }
}
