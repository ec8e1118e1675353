//! The members' condition, `MembersMounted` (docs/design.md#members-mounted), checked against a
//! serving leader's segment listing, and the member rows of `status.members`.

use std::collections::{BTreeMap, BTreeSet};

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::conditions::*;
use kvcache_api::backend::{KVCacheBackendStatus, MemberStatus};
use kvcache_api::condition::Cond;

use super::facts::{managed, medium_of, where_};
use super::observation::Observation;
use crate::members::mounts::{OtherMember, foreign_mounts};
use crate::observe::read::MemberPod;
use crate::observe::store::{Metrics, ReadError, Segment, StoreReading};

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

/// The member rows: from the segment listing of a serving leader, else the stored ones.
pub(super) fn member_rows_or_stored(
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
pub(super) fn members_mounted(
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
