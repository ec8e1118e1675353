//! The backend and ModelDeployment statuses as pure functions of what was observed: the store's
//! real answers (captured from `mooncake_master` 0.3.13.post1), member Pods and role
//! Deployments, no API server.

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::conditions;
use kvcache_api::backend::{BackendPhase, KVCacheBackendStatus, ObjectRef};
use kvcache_api::condition::{Cond, Status, find};
use kvcache_render::members::rollout::stale_member_pods;
use kvcache_render::observe::read::{LeaderReplicas, MemberPod};
use kvcache_render::observe::store::{
    Health, Metrics, ReadError, Segment, SegmentStatus, StoreReading,
};
use kvcache_render::status::backend::{Observation, backend_status};

const MI: u64 = 1 << 20;

/// `/get_segments_detail` as the real master answered with one 64 MiB member.
const SEGMENTS: &str = r#"{"total_segments":1,"segments":[{"segment_name":"10.0.0.5:13360","segment_id":"17748296431250894867-10526357289198217641","client_id":"5931000652488417973-221714976145051047","base_address":"0x7f0fa8000000","size_bytes":67108864,"size_human":"0.0625 GiB","te_endpoint":"10.0.0.5:15184","protocol":"tcp","status":"OK","allocator_used_bytes":0,"allocator_capacity_bytes":67108864,"allocator_usage_percent":0E0}]}"#;

const HEALTH: &str = r#"{"status":"ok","role":"leader","ha_state":"serving","service_ready":true,"leader_address":null,"view_version":null}"#;

fn backend(yaml_members: &str, leader: &str) -> KVCacheBackend {
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: mooncake-dram, generation: 3}}\nspec:\n  connection:\n    managed:\n      leader: {leader}\n      members:\n{yaml_members}"
    ))
    .expect("backend")
}

fn dram() -> KVCacheBackend {
    backend(
        "        - medium: DRAM\n          capacityPerMember: 64Mi\n",
        "{}",
    )
}

fn metrics(memory: u64, extra: &str) -> Metrics {
    Metrics::parse(&format!(
        "# HELP master_total_capacity_bytes x\nmaster_total_capacity_bytes {memory}\nsegment_total_capacity_bytes{{segment=\"10.0.0.5:13360\"}} {memory}\nmaster_active_clients 2\nmaster_total_file_capacity_bytes 0\n{extra}"
    ))
}

fn segment(ip: &str, id: &str) -> Segment {
    Segment {
        segment_name: format!("{ip}:13360"),
        segment_id: id.into(),
        client_id: format!("client-{id}"),
        size_bytes: 64 * MI,
        allocator_used_bytes: 0,
        status: SegmentStatus::Ok,
    }
}

fn pod(name: &str, node: &str, ip: &str) -> MemberPod {
    MemberPod {
        name: name.into(),
        node: node.into(),
        ip: ip.into(),
        group: 0,
        ready: true,
        terminating: false,
        hash: "h1".into(),
        problem: None,
        survey: None,
        drain: None,
        leaving: None,
    }
}

fn serving(memory: u64, segments: Vec<Segment>) -> StoreReading {
    StoreReading {
        health: Health::parse("h", HEALTH),
        metrics: Ok(metrics(memory, "")),
        segments: Ok(segments),
    }
}

fn observation(store: Option<StoreReading>, members: Vec<MemberPod>) -> Observation {
    Observation {
        generation: Some(3),
        deleting: false,
        used_by: Vec::new(),
        bound_namespaces: Vec::new(),
        endpoint: Some("mooncake-dram-leader.gpustack-system.svc:50051".into()),
        leader: Some(LeaderReplicas {
            desired: 1,
            ready: 1,
            updated: 1,
            total: 1,
            observed: true,
        }),
        lease_holder: Some(Some("mooncake-dram-leader-abc".into())),
        store,
        members,
        rendered_hashes: vec!["h1".into()],
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

fn cond<'a>(c: &'a [Cond], t: &str) -> &'a Cond {
    find(c, t).unwrap_or_else(|| panic!("no {t} in {c:?}"))
}

#[test]
fn the_real_answers_parse() {
    let segments = Segment::parse_all("u", SEGMENTS).expect("listing");
    assert_eq!(segments.len(), 1);
    assert_eq!(segments[0].host(), "10.0.0.5");
    assert_eq!(segments[0].size_bytes, 64 * MI);
    let health = Health::parse("u", HEALTH).expect("health");
    assert!(health.service_ready);
    let m = metrics(64 * MI, "master_put_end_requests_total 3\n");
    assert_eq!(m.memory_bytes, Some(64 * MI));
    assert_eq!(m.put_ends, Some(3));
    assert_eq!(m.active_clients, Some(2));
    assert!(Segment::parse_all("u", "<html>").is_err());
}

#[test]
fn mounted_members_make_it_ready_with_capacity_from_the_store() {
    let b = dram();
    let obs = observation(
        Some(serving(
            128 * MI,
            vec![segment("10.0.0.5", "a"), segment("10.0.0.6", "b")],
        )),
        vec![
            pod("m-1", "node-1", "10.0.0.5"),
            pod("m-2", "node-2", "10.0.0.6"),
        ],
    );
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Ready);
    assert_eq!(s.phase_message, None);
    assert_eq!(
        s.capacity.as_ref().map(|c| c.total.as_str().to_owned()),
        Some("128Mi".into())
    );
    assert_eq!(
        cond(&s.conditions, conditions::MEMBERS_MOUNTED).status,
        Status::True
    );
    assert_eq!(s.members.len(), 2);
    assert_eq!(s.members[0].node_name, "node-1");
    assert_eq!(s.members[0].medium, "DRAM");
    assert_eq!(
        cond(&s.conditions, conditions::ELECTION_OBSERVED).reason,
        "HolderElected"
    );
    assert_eq!(
        cond(&s.conditions, conditions::ROLLOUT_COMPLETE).status,
        Status::True
    );
}

#[test]
fn a_backend_that_cannot_be_rendered_is_an_error_whatever_runs() {
    let mut obs = observation(
        Some(serving(128 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    obs.render_refused = Some((
        "NoStoreImage",
        "KVCacheBackend mooncake-dram names no image and no setting supplies one".into(),
    ));
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Error);
    assert_eq!(
        s.phase_message.as_deref(),
        Some("KVCacheBackend mooncake-dram names no image and no setting supplies one")
    );
    let rendered = cond(&s.conditions, "Rendered");
    assert_eq!(
        (rendered.status, rendered.reason),
        (Status::False, "NoStoreImage")
    );
}

#[test]
fn unreadable_settings_name_the_key_and_say_what_is_kept_without_touching_the_phase() {
    let mut obs = observation(
        Some(serving(128 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    let fine = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert!(find(&fine.conditions, conditions::SETTINGS_READ).is_none());
    let why = "gpustack-settings: model-deployment-kv-cache-dtype-owned: \"yes\" is neither true nor false";
    for (kept, says) in [
        (true, "the last good settings are kept"),
        (false, "left as they are"),
    ] {
        obs.settings_refused = Some((why.into(), kept));
        let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
        let c = cond(&s.conditions, conditions::SETTINGS_READ);
        assert_eq!((c.status, c.reason), (Status::False, "SettingsUnreadable"));
        assert!(
            c.message.starts_with(why) && c.message.contains(says),
            "{}",
            c.message
        );
        assert_eq!(s.phase, fine.phase);
    }
}

#[test]
fn another_backends_member_on_this_master_degrades_and_is_named() {
    let mut obs = observation(
        Some(serving(
            128 * MI,
            vec![segment("10.0.0.5", "a"), segment("10.0.1.7", "b")],
        )),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    obs.other_members = vec![kvcache_render::members::mounts::OtherMember {
        backend: "mooncake-other".into(),
        pod: pod("other-m-0", "node-0", "10.0.1.7"),
    }];
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::MEMBERS_MOUNTED);
    assert_eq!((c.status, c.reason), (Status::False, "ForeignMember"));
    assert!(
        c.message.contains("other-m-0 of backend mooncake-other"),
        "{}",
        c.message
    );
    assert_eq!(s.phase, BackendPhase::Degraded);
}

#[test]
fn a_ready_member_the_master_does_not_list_degrades_and_is_named() {
    let obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![
            pod("m-1", "node-1", "10.0.0.5"),
            pod("m-2", "node-2", "10.0.0.6"),
        ],
    );
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Degraded);
    let c = cond(&s.conditions, conditions::MEMBERS_MOUNTED);
    assert_eq!((c.status, c.reason), (Status::False, "SegmentsShort"));
    assert!(c.message.contains("m-2 (node node-2)"), "{}", c.message);
    assert!(!c.message.contains("m-1"), "{}", c.message);
    assert_eq!(
        s.capacity.map(|c| c.total.as_str().to_owned()),
        Some("64Mi".into()),
        "capacity is what the store reports, not the spec"
    );
}

#[test]
fn no_ready_leader_is_provisioning_with_no_capacity() {
    let mut obs = observation(None, vec![pod("m-1", "node-1", "10.0.0.5")]);
    obs.leader = Some(LeaderReplicas {
        desired: 1,
        ready: 0,
        updated: 1,
        total: 1,
        observed: true,
    });
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Provisioning);
    assert_eq!(s.capacity, None, "absent, not zero");
    assert_eq!(
        cond(&s.conditions, conditions::LEADER_AVAILABLE).reason,
        "NoReadyReplica"
    );
}

#[test]
fn an_unreachable_leader_is_an_error_and_clears_capacity() {
    let unreachable = ReadError::Unreachable {
        url: "http://x:9003/health".into(),
        cause: kvcache_quota::admin::NoAnswer::Refused,
    };
    let obs = observation(
        Some(StoreReading {
            health: Err(unreachable.clone()),
            metrics: Err(unreachable.clone()),
            segments: Err(unreachable),
        }),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    let previous = KVCacheBackendStatus {
        capacity: Some(kvcache_api::backend::Capacity {
            total: kvcache_api::Quantity::from("64Mi"),
            ..Default::default()
        }),
        ..Default::default()
    };
    let s = backend_status(&dram(), &obs, &previous);
    assert_eq!(s.phase, BackendPhase::Error);
    assert_eq!(s.capacity, None);
    assert!(
        s.phase_message
            .as_deref()
            .is_some_and(|m| m.contains("connection refused"))
    );
}

#[test]
fn a_failed_scrape_clears_capacity_and_says_so() {
    let mut reading = serving(64 * MI, vec![segment("10.0.0.5", "a")]);
    reading.metrics = Err(ReadError::Status {
        url: "http://x:9003/metrics".into(),
        status: 500,
    });
    let obs = observation(Some(reading), vec![pod("m-1", "node-1", "10.0.0.5")]);
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.capacity, None);
    let c = cond(&s.conditions, conditions::CAPACITY_OBSERVED);
    assert_eq!((c.status, c.reason), (Status::False, "ScrapeFailed"));
}

#[test]
fn an_old_master_without_the_listing_is_unknown_not_degraded() {
    let mut reading = serving(64 * MI, vec![]);
    reading.segments = Err(ReadError::Status {
        url: "http://x:9003/get_segments_detail".into(),
        status: 404,
    });
    let obs = observation(Some(reading), vec![pod("m-1", "node-1", "10.0.0.5")]);
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Ready);
    let c = cond(&s.conditions, conditions::MEMBERS_MOUNTED);
    assert_eq!(
        (c.status, c.reason),
        (Status::Unknown, "SegmentListingNotServed")
    );
}

#[test]
fn a_member_that_cannot_start_degrades_with_its_own_reason() {
    let mut stuck = pod("m-2", "", "");
    stuck.ready = false;
    stuck.problem = Some((
        "Unschedulable".into(),
        "0/2 nodes are available: 2 Insufficient memory.".into(),
    ));
    let obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5"), stuck],
    );
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Degraded);
    assert!(
        s.phase_message
            .as_deref()
            .is_some_and(|m| m.contains("Insufficient memory")),
        "{:?}",
        s.phase_message
    );
    assert_eq!(
        cond(&s.conditions, conditions::MEMBERS_MOUNTED).reason,
        "MemberUnschedulable"
    );
}

#[test]
fn zero_capacity_with_ready_members_is_no_segments() {
    let obs = observation(
        Some(serving(0, vec![])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Degraded);
    assert_eq!(
        cond(&s.conditions, conditions::MEMBERS_MOUNTED).reason,
        "NoSegments"
    );
}

#[test]
fn members_not_reattached_after_a_failover_show() {
    let mut reading = serving(64 * MI, vec![segment("10.0.0.5", "a")]);
    if let Ok(m) = reading.metrics.as_mut() {
        m.active_clients = Some(0);
    }
    let obs = observation(Some(reading), vec![pod("m-1", "node-1", "10.0.0.5")]);
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(
        cond(&s.conditions, conditions::MEMBERS_MOUNTED).reason,
        "ClientsNotReattached"
    );
}

#[test]
fn pool_writes_follow_the_counters() {
    let case = |extra: &str, used: u64| {
        let mut seg = segment("10.0.0.5", "a");
        seg.allocator_used_bytes = used;
        let reading = StoreReading {
            health: Health::parse("h", HEALTH),
            metrics: Ok(metrics(64 * MI, extra)),
            segments: Ok(vec![seg]),
        };
        let obs = observation(Some(reading), vec![pod("m-1", "node-1", "10.0.0.5")]);
        let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
        cond(&s.conditions, conditions::POOL_WRITES).clone()
    };
    assert_eq!(
        case("master_put_end_requests_total 2\n", 0).status,
        Status::True
    );
    assert_eq!(case("", 4096).status, Status::True);
    let revoked = case(
        "master_put_start_requests_total 5\nmaster_put_revoke_requests_total 5\nmaster_put_end_requests_total 0\n",
        0,
    );
    assert_eq!(
        (revoked.status, revoked.reason),
        (Status::False, "PutsRevoked")
    );
    assert_eq!(
        case("master_put_start_requests_total 0\n", 0).reason,
        "NoPutsYet"
    );
}

#[test]
fn deletion_held_by_a_pool_names_it() {
    let mut obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    obs.deleting = true;
    obs.used_by = vec![ObjectRef {
        kind: "KVCachePool".into(),
        namespace: None,
        name: "shared-dram".into(),
    }];
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Deleting);
    assert!(
        s.phase_message
            .as_deref()
            .is_some_and(|m| m.contains("KVCachePool shared-dram"))
    );
    assert_eq!(
        cond(&s.conditions, conditions::DELETABLE).status,
        Status::False
    );
}

#[test]
fn a_declared_tier_the_master_does_not_report_is_named() {
    let b = backend(
        "        - medium: DRAM\n          capacityPerMember: 64Mi\n          localDisks: [{path: /var/lib/kvcache}]\n",
        "{}",
    );
    let obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    assert_eq!(s.phase, BackendPhase::Degraded);
    assert_eq!(
        cond(&s.conditions, conditions::TIER_REGISTERED).reason,
        "TierNotRegistered"
    );
}

#[test]
fn the_tier_survey_is_written_once() {
    let b = backend(
        "        - medium: DRAM\n          capacityPerMember: 64Mi\n          localDisks: [{path: /var/lib/kvcache}]\n",
        "{}",
    );
    let mut full = pod("m-1", "node-1", "10.0.0.5");
    full.survey = Some("entries=3 path=/var/lib/kvcache".into());
    let obs = observation(Some(serving(64 * MI, vec![])), vec![full]);
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::TIER_WAS_EMPTY);
    assert_eq!((c.status, c.reason), (Status::False, "PreexistingContent"));
    assert!(
        c.message.contains("node node-1 (3 entries)"),
        "{}",
        c.message
    );
    // Later Pods report empty: the first verdict stands.
    let stored = KVCacheBackendStatus {
        conditions: kvcache_api::condition::merge(
            &[],
            &s.conditions,
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            None,
        ),
        ..Default::default()
    };
    let mut empty = pod("m-1b", "node-1", "10.0.0.5");
    empty.survey = Some("entries=0 path=/var/lib/kvcache".into());
    let later = observation(Some(serving(64 * MI, vec![])), vec![empty]);
    let s = backend_status(&b, &later, &stored);
    assert_eq!(
        cond(&s.conditions, conditions::TIER_WAS_EMPTY).status,
        Status::False
    );
}

#[test]
fn exactly_the_pods_with_another_fingerprint_are_replaced() {
    let mut old = pod("m-old", "node-1", "10.0.0.5");
    old.hash = "h0".into();
    let mut going = pod("m-going", "node-3", "10.0.0.7");
    going.hash = "h0".into();
    going.terminating = true;
    let pods = vec![old, pod("m-new", "node-2", "10.0.0.6"), going];
    assert_eq!(stale_member_pods(&pods, &["h1".into()]), ["m-old"]);
    let obs = observation(Some(serving(64 * MI, vec![])), pods);
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    assert_eq!(
        cond(&s.conditions, conditions::ROLLOUT_COMPLETE).reason,
        "RolloutInProgress"
    );
}

/// The member rollout's steps for `obs`: one group on two nodes, with or without a tier.
fn member_steps(obs: &Observation, tier: bool) -> Vec<kvcache_render::members::rollout::GroupStep> {
    use kvcache_render::members::rollout::{GroupFacts, RolloutInput, member_rollout};
    member_rollout(&RolloutInput {
        members: &obs.members,
        rendered: &obs.rendered_hashes,
        groups: &[GroupFacts {
            tier,
            desired: Some(2),
        }],
        store: obs.store.as_ref(),
        jobs: &Default::default(),
        refused: &Default::default(),
        now: "2026-12-02T12:00:00Z".parse().expect("a time"),
        deadline: std::time::Duration::from_secs(600),
        leader_unsettled: false,
    })
}

#[test]
fn while_members_roll_the_rollout_condition_says_drained_or_not_and_the_rest_is_unchanged() {
    let mut a = pod("m-a", "node-1", "10.0.0.5");
    a.hash = "h0".into();
    let mut b = pod("m-b", "node-2", "10.0.0.6");
    b.hash = "h0".into();
    let mut held = segment("10.0.0.5", "a");
    held.allocator_used_bytes = 8 * MI;
    let store = serving(128 * MI, vec![held, segment("10.0.0.6", "b")]);
    let plain = observation(Some(store), vec![a, b]);
    let before = backend_status(&dram(), &plain, &KVCacheBackendStatus::default());
    let mut drained = plain.clone();
    drained.rollout = member_steps(&drained, false);
    let s = backend_status(&dram(), &drained, &KVCacheBackendStatus::default());
    let rollout = cond(&s.conditions, conditions::ROLLOUT_COMPLETE);
    assert_eq!(
        (rollout.status, rollout.reason),
        (Status::False, "MembersDraining")
    );
    assert_eq!(
        rollout.message,
        "leader: 1 of 1 replicas updated (1 Pods in all); member group 0: draining member Pod m-a (node node-1): its segment 10.0.0.5:13360 (8Mi) goes to the other members before the Pod is replaced (2 member Pods to replace)"
    );
    let mut tiered = plain.clone();
    tiered.rollout = member_steps(&tiered, true);
    let t = backend_status(&dram(), &tiered, &KVCacheBackendStatus::default());
    let rollout = cond(&t.conditions, conditions::ROLLOUT_COMPLETE);
    assert_eq!(rollout.reason, "MembersRolledWithoutDrain");
    assert!(rollout.message.ends_with(
        "member Pod m-a (node node-1) replaced without a drain: the group has a disk tier, whose keys the master leaves out of a drain (2 member Pods to replace)"
    ));
    // Every other condition, the phase and the rows are as without the rollout's steps.
    let others = |c: &[Cond]| {
        c.iter()
            .filter(|c| c.type_ != conditions::ROLLOUT_COMPLETE)
            .cloned()
            .collect::<Vec<_>>()
    };
    for after in [&s, &t] {
        assert_eq!(others(&after.conditions), others(&before.conditions));
        assert_eq!(
            (&after.phase, &after.members),
            (&before.phase, &before.members)
        );
    }
    assert_eq!(
        cond(&before.conditions, conditions::ROLLOUT_COMPLETE).reason,
        "RolloutInProgress"
    );
}

#[test]
fn the_rollout_is_complete_only_once_the_last_replaced_member_went_and_its_successor_exists() {
    let store = serving(
        128 * MI,
        vec![segment("10.0.0.5", "a"), segment("10.0.0.6", "b")],
    );
    let rollout_of = |members: Vec<_>| {
        let mut obs = observation(Some(store.clone()), members);
        obs.rollout = member_steps(&obs, false);
        let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
        cond(&s.conditions, conditions::ROLLOUT_COMPLETE).clone()
    };
    // The last member replaced, still terminating (and still Ready as it goes).
    let mut going = pod("m-b", "node-2", "10.0.0.6");
    going.terminating = true;
    let r = rollout_of(vec![pod("m-a", "node-1", "10.0.0.5"), going]);
    assert_eq!((r.status, r.reason), (Status::False, "RolloutInProgress"));
    assert!(
        r.message
            .ends_with("member group 0: waiting for member Pod m-b (node node-2) to go (0 member Pods to replace)"),
        "{}",
        r.message
    );
    // Gone, its successor not created yet.
    let r = rollout_of(vec![pod("m-a", "node-1", "10.0.0.5")]);
    assert_eq!((r.status, r.reason), (Status::False, "RolloutInProgress"));
    assert!(r.message.contains("(1 of 2 exist)"), "{}", r.message);
    // Its successor exists.
    let r = rollout_of(vec![
        pod("m-a", "node-1", "10.0.0.5"),
        pod("m-c", "node-2", "10.0.0.6"),
    ]);
    assert_eq!((r.status, r.reason), (Status::True, "UpToDate"));
}

#[test]
fn standbys_wait_for_election_to_be_enabled_first() {
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
    use kvcache_render::members::rollout::hold_standbys;
    use kvcache_render::objects::backend::{BackendInputs, render};
    let leader = |yaml: &str| -> Deployment {
        let b = backend(
            "        - medium: DRAM\n          capacityPerMember: 64Mi\n",
            yaml,
        );
        render(&BackendInputs {
            backend: &b,
            store_image: "store:1",
            namespace: "ns",
            elector_image: "elector:1",
            etcd_image: "etcd:1",
            bound_namespaces: &[],
            policy: None,
            access: &kvcache_render::objects::backend::StoreAccess::IN_CLUSTER,
        })
        .expect("renders")
        .deployment
        .expect("a leader")
    };
    let none = leader("{electionBackend: None}");
    let one = leader("{replicas: 1}");
    let three = leader("{replicas: 3}");
    assert!(
        !hold_standbys(None, &three),
        "a new backend starts with all replicas"
    );
    assert!(
        hold_standbys(Some(&none), &three),
        "first enable election at one replica"
    );
    let mut rolling = one.clone();
    rolling.metadata.generation = Some(2);
    rolling.status = Some(DeploymentStatus {
        observed_generation: Some(1),
        ..Default::default()
    });
    assert!(
        hold_standbys(Some(&rolling), &three),
        "the electing template is still rolling out"
    );
    let mut done = one.clone();
    done.metadata.generation = Some(2);
    done.status = Some(DeploymentStatus {
        observed_generation: Some(2),
        updated_replicas: Some(1),
        replicas: Some(1),
        ..Default::default()
    });
    assert!(
        !hold_standbys(Some(&done), &three),
        "then the standbys come"
    );
    assert!(
        !hold_standbys(Some(&none), &one),
        "one replica needs no second step"
    );
}

#[test]
fn the_running_version_is_reported_and_a_disagreeing_tag_is_named() {
    let mut obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    obs.store_version = Some(("0.3.11.post1".into(), Some("0.3.13.post1".into())));
    let s = backend_status(&dram(), &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::STORE_VERSION_OBSERVED);
    assert_eq!((c.status, c.reason), (Status::False, "TagDisagrees"));
    assert!(c.message.contains("0.3.11.post1") && c.message.contains("0.3.13.post1"));
    let written = kvcache_render::status::backend::apply(
        &KVCacheBackendStatus::default(),
        s,
        &obs,
        &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
    );
    assert_eq!(written.store_version.as_deref(), Some("0.3.11.post1"));
}

mod model_deployment {
    use kvcache_api::condition::{Cond, Status};
    use kvcache_api::model::ModelDeploymentPhase;
    use kvcache_render::status::model::{
        ModelObservation, Resolution, RoleObservation, Unresolved, model_deployment_status,
        model_status,
    };

    fn role(ready: i32) -> RoleObservation {
        RoleObservation {
            name: "server".into(),
            desired: 2,
            ready,
            updated: 2,
            total: 2,
            observed: true,
            unmanaged: false,
        }
    }

    fn attached() -> ModelObservation {
        ModelObservation {
            resolution: Resolution::Resolved {
                binding: "team-a".into(),
                pool: "shared-dram".into(),
                tenant: "default".into(),
            },
            refusal: None,
            roles: vec![role(2)],
            tenant_charged: Some(1 << 20),
            held: false,
            deleting: false,
            missing_instance_types: Vec::new(),
            foreign: Vec::new(),
        }
    }

    fn find<'a>(conds: &'a [Cond], t: &str) -> &'a Cond {
        conds
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t} in {conds:?}"))
    }

    fn deployment() -> kvcache_api::ModelDeployment {
        serde_yaml::from_str(
            r#"
apiVersion: worker.gpustack.ai/v1
kind: ModelDeployment
metadata: {name: qwen-chat, namespace: team-a, generation: 4}
spec:
  model: {name: Qwen/Qwen3-8B}
  engine: {name: vLLM, version: 0.29.0}
  kvCache: {poolRef: {name: team-a}}
  roles:
    - {name: server, replicas: 2, instanceType: gpu-a100}
"#,
        )
        .expect("a ModelDeployment")
    }

    #[test]
    fn the_whole_status_names_the_attachment_as_resolved_and_each_role() {
        let md = deployment();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
        let domain: kvcache_api::pool::Domain =
            serde_json::from_value(serde_json::json!({"blockSize": 64, "dtype": "bfloat16"}))
                .expect("a domain");
        let extra = vec![Cond::yes(
            "SharedCacheObserved",
            "EnginesRead",
            "read 2 engines",
        )];
        let s = model_deployment_status(&md, &attached(), Some(&domain), None, extra, &now);
        assert_eq!(s.observed_generation, Some(4));
        let kv = s.kv_cache.expect("kvCache status");
        assert_eq!(
            (kv.binding.as_str(), kv.pool.as_deref()),
            ("team-a", Some("shared-dram"))
        );
        assert_eq!(kv.domain, Some(domain));
        assert_eq!((s.roles[0].name.as_str(), s.roles[0].ready), ("server", 2));
        assert!(
            s.conditions
                .iter()
                .any(|c| c.type_ == "SharedCacheObserved")
        );
        // Unresolved: the reference as written, no pool or domain.
        let mut obs = attached();
        obs.resolution = Resolution::BindingNotFound {
            binding: "team-a".into(),
            namespace: "team-a".into(),
        };
        let s = model_deployment_status(&md, &obs, None, None, Vec::new(), &now);
        let kv = s.kv_cache.expect("kvCache status");
        assert_eq!((kv.pool, kv.domain), (None, None));
    }

    #[test]
    fn every_instance_type_present_is_resolved() {
        let (phase, _, conds) = model_status(&attached());
        let c = find(&conds, "InstanceTypesResolved");
        assert_eq!((c.status, c.reason), (Status::True, "Resolved"));
        assert_eq!(phase, ModelDeploymentPhase::Ready);
    }

    #[test]
    fn a_missing_instance_type_is_a_condition_naming_the_role_and_the_type() {
        let mut obs = attached();
        obs.missing_instance_types = vec![("server".into(), "gpu-h100".into())];
        // The render fails on it too: nothing is applied.
        obs.refusal = Some((
            "ReferenceNotFound",
            "InstanceType gpu-h100 not found".into(),
        ));
        let (phase, _, conds) = model_status(&obs);
        let c = find(&conds, "InstanceTypesResolved");
        assert_eq!(
            (c.status, c.reason),
            (Status::False, "InstanceTypeNotFound")
        );
        assert!(
            c.message.contains("role server") && c.message.contains("gpu-h100"),
            "{}",
            c.message
        );
        assert_eq!(phase, ModelDeploymentPhase::Degraded);
        let r = find(&conds, "ReplicasUpToDate");
        assert_eq!((r.status, r.reason), (Status::False, "RolloutHeldByCache"));
    }

    #[test]
    fn a_binding_missing_from_the_namespace_says_what_to_name() {
        let mut obs = attached();
        obs.resolution = Resolution::BindingNotFound {
            binding: "shared-dram".into(),
            namespace: "team-a".into(),
        };
        obs.tenant_charged = None;
        let (_, _, conds) = model_status(&obs);
        let c = find(&conds, "DomainRegistered");
        assert_eq!((c.status, c.reason), (Status::False, "BindingNotFound"));
        assert!(
            c.message.contains("a Binding in this namespace"),
            "{}",
            c.message
        );
    }

    #[test]
    fn a_binding_whose_pool_or_backend_is_missing_names_the_missing_one() {
        for (why, message) in [
            (
                Unresolved::NoPool {
                    pool: "shared-dram".into(),
                },
                "KVCachePoolBinding team-a/team-a: its KVCachePool shared-dram does not exist",
            ),
            (
                Unresolved::NoBackend {
                    backend: "dram".into(),
                },
                "KVCachePoolBinding team-a/team-a: its pool's KVCacheBackend dram does not exist",
            ),
        ] {
            let mut obs = attached();
            obs.resolution = Resolution::BindingNotReady {
                binding: "team-a/team-a".into(),
                why,
            };
            obs.tenant_charged = None;
            let (_, _, conds) = model_status(&obs);
            let c = find(&conds, "DomainRegistered");
            assert_eq!((c.status, c.reason), (Status::False, "BindingNotReady"));
            assert_eq!(c.message, message);
        }
    }

    #[test]
    fn a_deleted_binding_it_still_names_degrades_it_saying_the_store_is_lost_and_what_to_do() {
        let mut obs = attached();
        obs.resolution = Resolution::BindingDeleted {
            binding: "team-a/team-a".into(),
        };
        let (phase, message, conds) = model_status(&obs);
        let d = find(&conds, "DomainRegistered");
        assert_eq!((d.status, d.reason), (Status::False, "BindingDeleted"));
        for words in [
            "KVCachePoolBinding team-a/team-a was deleted",
            "no longer reaches the store",
            "spec.kvCache.poolRef.name",
        ] {
            assert!(d.message.contains(words), "{words:?} in {}", d.message);
        }
        // What the store charged before is no attachment now.
        let c = find(&conds, "CacheAttached");
        assert_eq!((c.status, c.reason), (Status::False, "BindingDeleted"));
        assert!(c.message.contains("team-a/team-a"), "{}", c.message);
        assert_eq!(phase, ModelDeploymentPhase::Degraded);
        assert_eq!(message.as_deref(), Some(d.message.as_str()));
    }

    #[test]
    fn without_kv_cache_it_is_not_applicable() {
        let mut obs = attached();
        obs.resolution = Resolution::NotApplicable;
        obs.tenant_charged = None;
        let (_, _, conds) = model_status(&obs);
        let c = find(&conds, "DomainRegistered");
        assert_eq!((c.status, c.reason), (Status::True, "NotApplicable"));
    }
}

// --- warm failover (docs/warm-failover.md) ---------------------------------------------------

/// `/health` of a master in Mooncake's etcd HA as 0.3.13.post1 answered, serving and standby.
fn etcd_health(view: i64, serving: bool) -> String {
    if serving {
        format!(
            r#"{{"status":"ok","role":"leader","ha_state":"serving","service_ready":true,"leader_address":"10.0.0.9:50051","view_version":{view}}}"#
        )
    } else {
        format!(
            r#"{{"status":"ok","role":"standby","ha_state":"standby","service_ready":false,"leader_address":"10.0.0.9:50051","view_version":{view}}}"#
        )
    }
}

fn warm_reading(view: i64, serving: bool, keys: u64) -> StoreReading {
    StoreReading {
        health: Health::parse("h", &etcd_health(view, serving)),
        metrics: Ok(metrics(64 * MI, &format!("master_key_count {keys}\n"))),
        segments: Ok(vec![segment("10.0.0.5", "s1")]),
    }
}

#[test]
fn a_warm_backend_records_each_failover_with_the_keys_on_either_side() {
    let b = backend(
        "        - medium: DRAM\n          capacityPerMember: 64Mi\n",
        "{replicas: 2, electionBackend: Etcd}",
    );
    let pods = vec![pod("m-0", "node-0", "10.0.0.5")];
    let pass = |previous: &KVCacheBackendStatus, reading: StoreReading, ready: i32| {
        let mut obs = observation(Some(reading), pods.clone());
        obs.lease_holder = None;
        obs.etcd = Some(kvcache_api::backend::EtcdStatus {
            replicas: 3,
            ready,
            endpoints: "e".into(),
        });
        let computed = backend_status(&b, &obs, previous);
        let status = kvcache_render::status::backend::apply(
            previous,
            computed.clone(),
            &obs,
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        );
        (computed, status)
    };
    // First reading: view 2 with 40 keys; no failover seen yet.
    let (c, s1) = pass(
        &KVCacheBackendStatus::default(),
        warm_reading(2, true, 40),
        3,
    );
    let e = cond(&c.conditions, conditions::ELECTION_OBSERVED);
    assert_eq!((e.status, e.reason), (Status::True, "EtcdElected"));
    assert!(
        e.message.contains("10.0.0.9:50051") && e.message.contains("view 2"),
        "{e:?}"
    );
    assert!(find(&c.conditions, conditions::FAILOVER_KEPT_CACHE).is_none());
    assert_eq!(
        cond(&c.conditions, conditions::ETCD_AVAILABLE).status,
        Status::True
    );
    let record = s1.election.clone().expect("election");
    assert_eq!((record.view_version, record.keys), (Some(2), Some(40)));
    // The standby took over with every key: kept.
    let (c, s2) = pass(&s1, warm_reading(3, true, 40), 3);
    let k = cond(&c.conditions, conditions::FAILOVER_KEPT_CACHE);
    assert_eq!((k.status, k.reason), (Status::True, "Kept"));
    assert!(
        k.message.contains("view 2 to 3") && k.message.contains("kept 40 of 40"),
        "{k:?}"
    );
    // While no master serves, the record stays and the election is campaigning.
    let (c, s3) = pass(&s2, warm_reading(3, false, 0), 1);
    assert_eq!(s3.election, s2.election);
    assert_eq!(
        cond(&c.conditions, conditions::ELECTION_OBSERVED).reason,
        "Campaigning"
    );
    let q = cond(&c.conditions, conditions::ETCD_AVAILABLE);
    assert_eq!((q.status, q.reason), (Status::False, "NoQuorum"));
    assert!(
        q.message.contains("1 of 3") && q.message.contains("2 needed"),
        "{q:?}"
    );
    // A reading of an older view (the old master still in the Service), or a new view whose
    // key count could not be read: nothing recorded yet.
    let (_, stale) = pass(&s3, warm_reading(2, true, 7), 1);
    assert_eq!(
        stale.election, s3.election,
        "an older view is not a failover"
    );
    let mut unread = warm_reading(4, true, 0);
    unread.metrics = Err(ReadError::from_answer("m", 503, "no"));
    let (_, waiting) = pass(&s3, unread, 1);
    assert_eq!(
        waiting.election, s3.election,
        "a new view waits for its key count"
    );
    // A master that came back empty: the keys were lost, said with the figures.
    let (c, _) = pass(&s3, warm_reading(4, true, 0), 2);
    let k = cond(&c.conditions, conditions::FAILOVER_KEPT_CACHE);
    assert_eq!((k.status, k.reason), (Status::False, "KeysLost"));
    assert!(k.message.contains("kept 0 of 40"), "{k:?}");
}

#[test]
fn network_isolation_is_stated_once_rendered_and_a_host_network_group_is_named_without_degrading() {
    let b = dram();
    let ready = || {
        observation(
            Some(serving(
                128 * MI,
                vec![segment("10.0.0.5", "a"), segment("10.0.0.6", "b")],
            )),
            vec![
                pod("m-1", "node-1", "10.0.0.5"),
                pod("m-2", "node-2", "10.0.0.6"),
            ],
        )
    };
    // Not rendered in this pass: nothing said.
    let s = backend_status(&b, &ready(), &KVCacheBackendStatus::default());
    assert!(
        s.conditions.iter().all(|c| c.type_ != "NetworkIsolated"),
        "{:?}",
        s.conditions
    );
    let mut obs = ready();
    obs.unguarded_groups = Some(Vec::new());
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, "NetworkIsolated");
    assert_eq!((c.status, c.reason), (Status::True, "PoliciesApplied"));
    obs.unguarded_groups = Some(vec!["mooncake-dram-member-1".into()]);
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, "NetworkIsolated");
    assert_eq!((c.status, c.reason), (Status::False, "HostNetworkMembers"));
    assert!(
        c.message.contains("mooncake-dram-member-1"),
        "{}",
        c.message
    );
    // A warning the user acts on, not a fault of the store: the phase stays Ready.
    assert_eq!(s.phase, BackendPhase::Ready);
}

#[test]
fn unknown_segments_are_named_once_confirmed_and_false_when_none() {
    use kvcache_api::backend::UnknownSegment;
    let b = dram();
    let mut obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    // No serving listing judged this pass.
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::UNKNOWN_SEGMENTS);
    assert_eq!((c.status, c.reason), (Status::Unknown, "NotChecked"));
    let rogue = |confirmed| UnknownSegment {
        segment_name: "10.0.2.9:15003".into(),
        address: "10.0.2.9".into(),
        pod: Some("team-b/rogue".into()),
        size: Some("32Mi".into()),
        state: "DRAINED".into(),
        first_seen: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
        confirmed,
    };
    obs.unknown_segments = Some(Vec::new());
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::UNKNOWN_SEGMENTS);
    assert_eq!((c.status, c.reason), (Status::False, "None"));
    // Within its grace: not counted, but said.
    obs.unknown_segments = Some(vec![rogue(false)]);
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::UNKNOWN_SEGMENTS);
    assert_eq!((c.status, c.reason), (Status::False, "None"));
    assert!(c.message.contains("1 more"), "{}", c.message);
    obs.unknown_segments = Some(vec![rogue(true)]);
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::UNKNOWN_SEGMENTS);
    assert_eq!((c.status, c.reason), (Status::True, "MountedByNoMember"));
    assert!(
        c.message
            .contains("10.0.2.9:15003 (32Mi at address 10.0.2.9, Pod team-b/rogue, state DRAINED)")
            && c.message.contains("drained onto this backend's members"),
        "{}",
        c.message
    );
    // The phase is the store's service: an unknown segment does not change it.
    assert_eq!(s.phase, BackendPhase::Ready);
    obs.drain_unknown = false;
    let s = backend_status(&b, &obs, &KVCacheBackendStatus::default());
    let c = cond(&s.conditions, conditions::UNKNOWN_SEGMENTS);
    assert!(
        c.message.contains("--unknown-segments=report"),
        "{}",
        c.message
    );
}

#[test]
fn network_isolated_says_what_the_probe_found_and_names_what_it_dialled() {
    use kvcache_api::backend::{IsolationProbe, ProbeResult};
    use kvcache_render::objects::backend::probe::Isolation;
    let b = dram();
    let mut obs = observation(
        Some(serving(64 * MI, vec![segment("10.0.0.5", "a")])),
        vec![pod("m-1", "node-1", "10.0.0.5")],
    );
    obs.unguarded_groups = Some(Vec::new());
    let probe = |result| IsolationProbe {
        policies: "f00dfeedcafe0123".into(),
        target: "10.244.0.7:50051".into(),
        pod: "gpustack-system/mooncake-dram-probe-f00dfeed".into(),
        result,
        message: "refused: Connection refused".into(),
        probed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
    };
    let said = |obs: &Observation| {
        let s = backend_status(&b, obs, &KVCacheBackendStatus::default());
        let c = cond(&s.conditions, conditions::NETWORK_ISOLATED).clone();
        (c.status, c.reason, c.message, s.phase)
    };
    obs.isolation = Some(Isolation::Probed(probe(ProbeResult::Enforced)));
    let (status, reason, message, _) = said(&obs);
    assert_eq!((status, reason), (Status::True, "Enforced"));
    assert!(
        message.contains("probe Pod gpustack-system/mooncake-dram-probe-f00dfeed")
            && message.contains("at 10.244.0.7:50051 and was refused"),
        "{message}"
    );
    obs.isolation = Some(Isolation::Probed(probe(ProbeResult::NotEnforced)));
    let (status, reason, message, phase) = said(&obs);
    assert_eq!((status, reason), (Status::False, "NotEnforced"));
    assert!(
        message.contains("at 10.244.0.7:50051 and connected")
            && message.contains("an-enforcer-is-required"),
        "{message}"
    );
    assert_eq!(
        phase,
        BackendPhase::Ready,
        "a warning, not the store's fault"
    );
    obs.isolation = Some(Isolation::Probed(probe(ProbeResult::Inconclusive)));
    assert_eq!(said(&obs).1, "ProbeFailed");
    obs.isolation = Some(Isolation::Probing { previous: None });
    assert_eq!(said(&obs).1, "Probing");
    obs.isolation = Some(Isolation::Off);
    let (status, reason, message, _) = said(&obs);
    assert_eq!((status, reason), (Status::Unknown, "Unverified"));
    assert!(message.contains("--isolation-probe=false"), "{message}");
    obs.isolation = Some(Isolation::OwnNamespaceBound);
    assert_eq!(said(&obs).1, "Unverified");
    // The host network first: no probe result makes those members covered.
    obs.isolation = Some(Isolation::Probed(probe(ProbeResult::Enforced)));
    obs.unguarded_groups = Some(vec!["mooncake-dram-member-1".into()]);
    assert_eq!(said(&obs).1, "HostNetworkMembers");
}
