//! Who mounted the segments a backend's master lists.
//!
//! Members on the wrong master: a segment whose address is a member Pod of another backend
//! (and of none of its own). Seen when a failover freed a master's address and a member
//! redialed it after another backend's master took it (`benches/README.md`, "soak", on the
//! harness's address books); a real CNI can reuse an address as quickly. The backend's status
//! names each one and the operator restarts it, so that it mounts on its own master again.
//!
//! Segments of no member at all ([`unknown_segments`], docs/isolation.md#unknown-segments): a
//! client that mounts a segment of its own (`global_segment_size` above 0) becomes a place the
//! master puts any tenant's blocks, served to other tenants from that client's memory. The
//! operator's engines mount none (the injection sets `global_segment_size` to 0,
//! crates/kvcache-inject/src/vehicle.rs), so every segment whose address is not one of the
//! backend's member Pods is reported, once listed for longer than a replaced member's segment
//! lingers ([`grace`]), and drained ([`quarantine`]) so that no new block lands there.
//!
//! Pure: the operator lists the store Pods, the segments and the Pods at unknown addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kvcache_api::backend::{UNKNOWN_SEGMENTS_LISTED, UnknownSegment};
use kvcache_api::{KVCacheBackend, Quantity};

use crate::observe::read::MemberPod;
use crate::observe::store::{DrainRequest, Segment, SegmentStatus};

/// A member Pod of another backend, as the operator listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherMember {
    /// The backend whose member it is (its `app.kubernetes.io/instance` label).
    pub backend: String,
    /// The member Pod: its name, node and address.
    pub pod: MemberPod,
}

/// The other backends' members this backend's master lists a segment of. An address that is
/// also one of this backend's own members (members on `hostNetwork` of two backends on one
/// node share it) is not judged: it cannot tell whose segment it is.
pub fn foreign_mounts<'a>(
    segments: &[Segment],
    own: &[MemberPod],
    others: &'a [OtherMember],
) -> Vec<&'a OtherMember> {
    let own: BTreeSet<&str> = own.iter().map(|p| p.ip.as_str()).collect();
    let listed: BTreeSet<&str> = segments.iter().map(Segment::host).collect();
    others
        .iter()
        .filter(|m| !m.pod.ip.is_empty() && !m.pod.terminating)
        .filter(|m| listed.contains(m.pod.ip.as_str()) && !own.contains(m.pod.ip.as_str()))
        .collect()
}

/// The master's client TTL when `leader.extraArgs` sets none: Mooncake 0.3.13.post1's
/// `mooncake_master --help` prints `-client_ttl ... default: 10`.
pub(crate) const DEFAULT_CLIENT_TTL: Duration = Duration::from_secs(10);

/// Beyond the client TTL: the operator reads the listing at most every few seconds, and a
/// member's Pod object can go before its segment does.
pub(crate) const GRACE_SLACK: Duration = Duration::from_secs(20);

/// How long a segment of no known Pod may be listed before it counts: a member whose process
/// died stays listed until the master's client TTL runs out (the backend's own
/// `leader.extraArgs` `client_ttl=N`, else `DEFAULT_CLIENT_TTL`), plus `GRACE_SLACK`.
pub fn grace(b: &KVCacheBackend) -> Duration {
    let ttl = b
        .spec
        .connection
        .managed
        .as_ref()
        .and_then(|m| {
            m.leader.extra_args.iter().rev().find_map(|a| {
                let (key, value) = a.trim_start_matches('-').split_once('=')?;
                (key == "client_ttl").then(|| value.trim().parse::<u64>().ok())?
            })
        })
        .map_or(DEFAULT_CLIENT_TTL, Duration::from_secs);
    ttl + GRACE_SLACK
}

/// Whether a segment's address is one this backend can account for: one of its own member
/// Pods' (whatever their state: a terminating member's segment is its own until it goes) or a
/// member of another backend's (those are [`foreign_mounts`], restarted instead).
fn accounted(host: &str, own: &[MemberPod], others: &[OtherMember]) -> bool {
    own.iter().any(|p| !p.ip.is_empty() && p.ip == host)
        || others
            .iter()
            .any(|m| !m.pod.ip.is_empty() && m.pod.ip == host)
}

/// The addresses of the listed segments that are neither this backend's members' nor another
/// backend's: the operator looks up which Pod has each before [`unknown_segments`] judges.
pub fn unknown_addresses(
    segments: &[Segment],
    own: &[MemberPod],
    others: &[OtherMember],
) -> BTreeSet<String> {
    segments
        .iter()
        .map(Segment::host)
        .filter(|h| !accounted(h, own, others))
        .map(str::to_owned)
        .collect()
}

/// The Pods the operator found at one address (`namespace/name` each), as a status names them:
/// one, or the first three and how many more (Pods on a node's host network share its address);
/// `None` when no Pod has it.
pub fn pods_named(pods: &[String]) -> Option<String> {
    match pods {
        [] => None,
        [one] => Some(one.clone()),
        _ if pods.len() <= 3 => Some(pods.join(", ")),
        _ => Some(format!(
            "{} and {} more (Pods on a node's host network share its address)",
            pods[..3].join(", "),
            pods.len() - 3
        )),
    }
}

/// What one pass knows to judge the master's listing.
#[derive(Clone, Debug)]
pub struct UnknownInput<'a> {
    /// The serving master's segments.
    pub segments: &'a [Segment],
    /// This backend's member Pods.
    pub own: &'a [MemberPod],
    /// The other backends' member Pods.
    pub others: &'a [OtherMember],
    /// The Pod(s) at each unknown address ([`pods_named`]), as the operator found them.
    pub pods_at: &'a BTreeMap<String, String>,
    /// What the status holds from earlier passes (first sightings are kept from there).
    pub previous: &'a [UnknownSegment],
    /// The time of this pass.
    pub now: Timestamp,
    /// [`grace`].
    pub grace: Duration,
}

/// The master's segment status as `/get_segments_detail` spells it.
fn state_name(s: SegmentStatus) -> &'static str {
    match s {
        SegmentStatus::Ok => "OK",
        SegmentStatus::Draining => "DRAINING",
        SegmentStatus::Drained => "DRAINED",
        SegmentStatus::GracefullyUnmounting => "GRACEFULLY_UNMOUNTING",
        SegmentStatus::Unmounting => "UNMOUNTING",
        SegmentStatus::Undefined => "UNDEFINED",
        SegmentStatus::Unknown => "",
    }
}

/// The segments of no known Pod now listed, one per segment name (a client that mounts more
/// than its transfer's largest region mounts several under one name: their sizes add up), in
/// name order, at most [`UNKNOWN_SEGMENTS_LISTED`]. Each keeps its first sighting from `previous`; it is `confirmed` once listed
/// for `grace` (and stays so while listed). A segment no longer listed is dropped.
pub fn unknown_segments(input: &UnknownInput<'_>) -> Vec<UnknownSegment> {
    let mut by_name: BTreeMap<&str, UnknownSegment> = BTreeMap::new();
    for s in input.segments {
        let host = s.host();
        if accounted(host, input.own, input.others) {
            continue;
        }
        let entry = by_name.entry(s.segment_name.as_str()).or_insert_with(|| {
            let before = input
                .previous
                .iter()
                .find(|p| p.segment_name == s.segment_name);
            let first_seen = before.map_or(Time(input.now), |p| p.first_seen.clone());
            let listed = input
                .now
                .duration_since(first_seen.0)
                .try_into()
                .unwrap_or(Duration::ZERO);
            UnknownSegment {
                segment_name: s.segment_name.clone(),
                address: host.to_owned(),
                pod: input.pods_at.get(host).cloned(),
                size: None,
                state: state_name(s.status).to_owned(),
                first_seen,
                confirmed: before.is_some_and(|p| p.confirmed) || listed >= input.grace,
            }
        });
        let bytes = entry
            .size
            .as_deref()
            .and_then(|q| kvcache_api::quantity::parse_bytes(q).ok())
            .unwrap_or(0);
        entry.size = Some(
            Quantity::from_bytes(bytes.saturating_add(s.size_bytes))
                .as_str()
                .to_owned(),
        );
    }
    by_name
        .into_values()
        .take(UNKNOWN_SEGMENTS_LISTED)
        .collect()
}

/// How long until the first of `unknown` not yet confirmed is (so the pass that confirms it is
/// not left to the slow poll); `None` when all are.
pub(crate) fn next_confirmation(
    unknown: &[UnknownSegment],
    now: Timestamp,
    grace: Duration,
) -> Option<Duration> {
    unknown
        .iter()
        .filter(|u| !u.confirmed)
        .map(|u| {
            let listed: Duration = now
                .duration_since(u.first_seen.0)
                .try_into()
                .unwrap_or(Duration::ZERO);
            grace.saturating_sub(listed).max(Duration::from_secs(1))
        })
        .min()
}

/// The drains that keep blocks out of the confirmed unknown segments: each one the master
/// still lets take new blocks (`OK`), onto this backend's own members' `OK` segments (so
/// nothing moves onto another unknown one). None when `drain` is off (`--unknown-segments=report`)
/// or no own member has a segment to take the blocks. A segment being drained or drained takes
/// no new block (Mooncake's `SetSegmentStatusByName` removes its allocator,
/// mooncake-store/src/segment.cpp at v0.3.12.post1); a drain the master gives up on sets it
/// back to `OK`, and the next pass asks again.
pub fn quarantine(
    unknown: &[UnknownSegment],
    segments: &[Segment],
    own: &[MemberPod],
    drain: bool,
) -> Vec<DrainRequest> {
    if !drain {
        return Vec::new();
    }
    let targets: Vec<String> = segments
        .iter()
        .filter(|s| s.status == SegmentStatus::Ok)
        .filter(|s| {
            own.iter()
                .any(|p| !p.terminating && !p.ip.is_empty() && p.ip == s.host())
        })
        .map(|s| s.segment_name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if targets.is_empty() {
        return Vec::new();
    }
    unknown
        .iter()
        .filter(|u| u.confirmed)
        .filter(|u| {
            segments
                .iter()
                .any(|s| s.segment_name == u.segment_name && s.status == SegmentStatus::Ok)
        })
        .map(|u| DrainRequest::new(&u.segment_name, &targets))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str) -> MemberPod {
        MemberPod {
            name: name.into(),
            node: "n0".into(),
            ip: ip.into(),
            group: 0,
            ready: true,
            terminating: false,
            hash: "h".into(),
            problem: None,
            survey: None,
            drain: None,
            leaving: None,
        }
    }

    fn segment(host: &str) -> Segment {
        serde_json::from_value(serde_json::json!({
            "segment_name": format!("{host}:15000"), "size_bytes": 1024,
            "allocator_used_bytes": 0, "allocator_capacity_bytes": 1024
        }))
        .expect("a segment")
    }

    fn other(backend: &str, name: &str, ip: &str) -> OtherMember {
        OtherMember {
            backend: backend.into(),
            pod: pod(name, ip),
        }
    }

    #[test]
    fn another_backends_member_listed_here_is_foreign() {
        let own = [pod("a-m0", "10.0.0.5")];
        let others = [
            other("b", "b-m0", "10.0.0.7"),
            other("b", "b-m1", "10.0.1.7"),
        ];
        let listed = [segment("10.0.0.5"), segment("10.0.0.7")];
        let found: Vec<&str> = foreign_mounts(&listed, &own, &others)
            .iter()
            .map(|m| m.pod.name.as_str())
            .collect();
        assert_eq!(found, ["b-m0"]);
    }

    #[test]
    fn an_address_shared_with_an_own_member_or_a_leaving_pod_is_not_judged() {
        // hostNetwork: both backends' members on one node advertise the node's address.
        let own = [pod("a-m0", "192.168.0.10")];
        let mut leaving = other("b", "b-m1", "10.0.1.7");
        leaving.pod.terminating = true;
        let others = [other("b", "b-m0", "192.168.0.10"), leaving];
        let listed = [segment("192.168.0.10"), segment("10.0.1.7")];
        assert!(foreign_mounts(&listed, &own, &others).is_empty());
    }

    #[test]
    fn a_segment_of_no_known_pod_is_not_foreign() {
        // A replaced member's segment lingers until the master's client TTL: no Pod has its
        // address any more, and it is not another backend's.
        let own = [pod("a-m0", "10.0.0.5")];
        let listed = [segment("10.0.0.5"), segment("10.0.0.9")];
        assert!(foreign_mounts(&listed, &own, &[]).is_empty());
    }

    fn at(name: &str, status: &str, size: u64) -> Segment {
        serde_json::from_value(serde_json::json!({
            "segment_name": name, "size_bytes": size, "status": status,
            "allocator_used_bytes": 0, "allocator_capacity_bytes": size
        }))
        .expect("a segment")
    }

    fn time(s: &str) -> Timestamp {
        s.parse().expect("a time")
    }

    fn judge(
        segments: &[Segment],
        own: &[MemberPod],
        others: &[OtherMember],
        previous: &[UnknownSegment],
        now: &str,
    ) -> Vec<UnknownSegment> {
        let pods_at = BTreeMap::from([("10.0.2.9".to_owned(), "team-b/rogue".to_owned())]);
        unknown_segments(&UnknownInput {
            segments,
            own,
            others,
            pods_at: &pods_at,
            previous,
            now: time(now),
            grace: Duration::from_secs(30),
        })
    }

    #[test]
    fn a_segment_of_no_member_is_unknown_named_with_its_pod_and_confirmed_after_the_grace() {
        let own = [pod("a-m0", "10.0.0.5")];
        let listed = [
            at("10.0.0.5:15000", "OK", 64 << 20),
            at("10.0.2.9:15003", "OK", 32 << 20),
        ];
        let first = judge(&listed, &own, &[], &[], "2026-12-06T10:00:00Z");
        assert_eq!(first.len(), 1);
        let u = &first[0];
        assert_eq!(
            (
                u.segment_name.as_str(),
                u.address.as_str(),
                u.pod.as_deref()
            ),
            ("10.0.2.9:15003", "10.0.2.9", Some("team-b/rogue"))
        );
        assert_eq!(u.size.as_deref(), Some("32Mi"));
        assert_eq!(u.state, "OK");
        // First seen now: a replaced member's segment lingers this long, so not yet counted.
        assert!(!u.confirmed);
        assert_eq!(
            next_confirmation(
                &first,
                time("2026-12-06T10:00:10Z"),
                Duration::from_secs(30)
            ),
            Some(Duration::from_secs(20))
        );
        let later = judge(&listed, &own, &[], &first, "2026-12-06T10:00:29Z");
        assert!(!later[0].confirmed, "within the grace");
        let confirmed = judge(&listed, &own, &[], &later, "2026-12-06T10:00:30Z");
        assert!(confirmed[0].confirmed);
        assert_eq!(
            confirmed[0].first_seen, first[0].first_seen,
            "the first sighting is kept"
        );
        assert_eq!(
            next_confirmation(
                &confirmed,
                time("2026-12-06T10:00:31Z"),
                Duration::from_secs(30)
            ),
            None
        );
        // Gone from the listing: forgotten, and a later one is judged afresh.
        assert!(judge(&listed[..1], &own, &[], &confirmed, "2026-12-06T10:01:00Z").is_empty());
    }

    #[test]
    fn own_members_in_any_state_and_other_backends_members_are_not_unknown() {
        let mut leaving = pod("a-m1", "10.0.0.6");
        leaving.terminating = true;
        leaving.ready = false;
        let own = [pod("a-m0", "10.0.0.5"), leaving];
        let others = [other("b", "b-m0", "10.0.1.7")];
        let listed = [
            at("10.0.0.5:15000", "OK", 1),
            at("10.0.0.6:15000", "OK", 1),
            at("10.0.1.7:15000", "OK", 1),
        ];
        assert!(judge(&listed, &own, &others, &[], "2026-12-06T10:00:00Z").is_empty());
        assert!(unknown_addresses(&listed, &own, &others).is_empty());
        let rogue = [at("10.0.2.9:15003", "OK", 1), at("rogue-host:1", "OK", 1)];
        assert_eq!(
            unknown_addresses(&rogue, &own, &others)
                .into_iter()
                .collect::<Vec<_>>(),
            ["10.0.2.9", "rogue-host"]
        );
    }

    #[test]
    fn a_client_mounting_several_regions_under_one_name_is_one_unknown_segment() {
        let listed = [
            at("10.0.2.9:15003", "OK", 32 << 20),
            at("10.0.2.9:15003", "OK", 32 << 20),
        ];
        let found = judge(&listed, &[], &[], &[], "2026-12-06T10:00:00Z");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].size.as_deref(), Some("64Mi"));
    }

    #[test]
    fn the_grace_is_the_masters_client_ttl_plus_the_slack() {
        let backend = |args: &[&str]| -> KVCacheBackend {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
                "metadata": {"name": "b"},
                "spec": {"connection": {"managed": {"leader": {"extraArgs": args},
                    "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
            }))
            .expect("a backend")
        };
        assert_eq!(grace(&backend(&[])), Duration::from_secs(30));
        assert_eq!(
            grace(&backend(&["default_kv_lease_ttl=10s", "--client_ttl=60"])),
            Duration::from_secs(80)
        );
    }

    #[test]
    fn confirmed_unknown_segments_taking_blocks_are_drained_onto_the_members() {
        let own = [pod("a-m0", "10.0.0.5"), pod("a-m1", "10.0.0.6")];
        let listed = [
            at("10.0.0.5:15000", "OK", 1),
            at("10.0.0.6:15000", "DRAINING", 1),
            at("10.0.2.9:15003", "OK", 1),
            at("10.0.2.8:15003", "DRAINED", 1),
            at("10.0.2.7:15003", "OK", 1),
        ];
        let mut unknown = judge(&listed, &own, &[], &[], "2026-12-06T10:00:00Z");
        for u in &mut unknown {
            // The one at .7 is still within its grace.
            u.confirmed = u.address != "10.0.2.7";
        }
        let drains = quarantine(&unknown, &listed, &own, true);
        assert_eq!(
            drains,
            [DrainRequest::new(
                "10.0.2.9:15003",
                &["10.0.0.5:15000".to_owned()]
            )],
            "only the confirmed one still OK, onto the own member still taking blocks"
        );
        assert!(
            quarantine(&unknown, &listed, &own, false).is_empty(),
            "report only"
        );
        assert!(
            quarantine(&unknown, &listed, &[], true).is_empty(),
            "no member of its own to take the blocks"
        );
    }

    #[test]
    fn pods_at_an_address_are_named_up_to_three() {
        let names = |n: usize| (0..n).map(|i| format!("ns/p{i}")).collect::<Vec<_>>();
        assert_eq!(pods_named(&[]), None);
        assert_eq!(pods_named(&names(1)).as_deref(), Some("ns/p0"));
        assert_eq!(
            pods_named(&names(3)).as_deref(),
            Some("ns/p0, ns/p1, ns/p2")
        );
        assert_eq!(
            pods_named(&names(5)).as_deref(),
            Some(
                "ns/p0, ns/p1, ns/p2 and 2 more (Pods on a node's host network share its address)"
            )
        );
    }
}
