//! Store leadership with our elector, against the real API server and real store processes:
//! never two serving masters, failover on kill -9 and on SIGTERM with members following the
//! Lease, a cold cache afterwards, and a clear refusal without RBAC.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kvcache_e2e::cluster::wait_object;
use kvcache_e2e::failover::{LeaseTiming, Rig};
use kvcache_e2e::store::{self, Lookup, Member, MemberOptions};
use kvcache_e2e::{paths, shared};
use nix::sys::signal::Signal;

const SEGMENT: u64 = 64 << 20;

#[tokio::test(flavor = "multi_thread")]
async fn failover_keeps_one_master_and_members_follow() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "elector")
        .await
        .expect("namespace");
    let kubeconfig = cluster.control_plane.kubeconfig.clone();
    let timing = LeaseTiming::default();
    tokio::task::spawn_blocking(move || {
        let mut rig = Rig::start(&kubeconfig, &ns, "store-leader", 3, 2, SEGMENT, timing)
            .expect("rig starts");
        let watch = rig.watch_for_split_brain();

        let first = rig
            .wait_leader(None, Duration::from_secs(30))
            .expect("a leader");
        rig.wait_capacity(first, 2 * SEGMENT, Duration::from_secs(30))
            .expect("both members mount on the leader");
        let standbys_ready = rig.leaders.iter().flatten().filter(|s| s.ready()).count();
        assert_eq!(
            standbys_ready, 1,
            "standbys are not ready: 3 desired / 1 ready"
        );
        let address = rig.leaders[first].as_ref().expect("slot").address();
        assert_eq!(
            store::put(&address, "before-kill", None, 4096).expect("put"),
            0
        );
        assert_eq!(
            store::get(&address, "before-kill", None).expect("get"),
            Lookup::Hit(4096),
            "the key reads back before the failover"
        );

        // kill -9 of the leader elector and its master.
        let t = Instant::now();
        rig.stop_leader(first, true);
        let second = rig
            .wait_leader(Some(first), Duration::from_secs(30))
            .expect("a standby takes over");
        let serving_after = t.elapsed();
        rig.wait_capacity(second, 2 * SEGMENT, Duration::from_secs(30))
            .expect("members remount to the new leader");
        assert!(
            serving_after < timing.duration + Duration::from_secs(5),
            "took {serving_after:?}"
        );
        let address = rig.leaders[second].as_ref().expect("slot").address();
        assert_eq!(
            store::get(&address, "before-kill", None).expect("get"),
            Lookup::Miss,
            "a failover leaves a cold cache"
        );
        assert_eq!(
            store::put(&address, "before-term", None, 4096).expect("put"),
            0
        );
        assert_eq!(
            store::get(&address, "before-term", None).expect("get"),
            Lookup::Hit(4096),
            "the key reads back before the handover"
        );

        // SIGTERM: the leader releases the Lease and the last standby takes over at once.
        let t = Instant::now();
        rig.stop_leader(second, false);
        let third = rig
            .wait_leader(Some(second), Duration::from_secs(30))
            .expect("handover");
        let handover = t.elapsed();
        rig.wait_capacity(third, 2 * SEGMENT, Duration::from_secs(30))
            .expect("members remount");
        assert!(
            handover < timing.duration,
            "a released Lease is taken without waiting for expiry ({handover:?})"
        );
        let address = rig.leaders[third].as_ref().expect("slot").address();
        assert_eq!(
            store::get(&address, "before-term", None).expect("get"),
            Lookup::Miss,
            "cold after a handover too"
        );

        let (samples, violations) = watch.finish();
        assert!(samples > 100, "the watch sampled ({samples})");
        assert_eq!(
            violations,
            0,
            "two masters served at once in {violations} of {samples} samples (logs: {})",
            rig.dir().display()
        );
    })
    .await
    .expect("the scenario thread");
}

/// A pause is not a loss. Every elector and master stopped for longer than the lease (a node
/// stalled, or store Pods starved by engines on every core) leaves the leader leading, with its
/// master and its keys, once they run again; the leader paused alone is replaced, and its master
/// is stopped by its elector's first pass after the pause.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_past_the_lease_keeps_the_leader_unless_a_standby_took_over() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "paused")
        .await
        .expect("namespace");
    let kubeconfig = cluster.control_plane.kubeconfig.clone();
    let leases = kube::Api::<Lease>::namespaced(client, &ns);
    let timing = LeaseTiming::default();
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let rig = Rig::start(&kubeconfig, &ns, "paused-leader", 3, 1, SEGMENT, timing)
            .expect("rig starts");
        let first = rig
            .wait_leader(None, Duration::from_secs(30))
            .expect("a leader");
        rig.wait_capacity(first, SEGMENT, Duration::from_secs(30))
            .expect("the member mounts");
        let address = rig.leaders[first].as_ref().expect("slot").address();
        assert_eq!(store::put(&address, "before-pause", None, 4096).expect("put"), 0);
        let identity = rig.leaders[first].as_ref().expect("slot").identity.clone();
        let before = runtime
            .block_on(leases.get("paused-leader"))
            .expect("the Lease");
        let master = rig.master_pid(first).expect("the leader runs a master");
        let watch = rig.watch_for_split_brain();

        // Every elector and master stops for longer than the lease.
        let all: Vec<usize> = (0..rig.leaders.len()).collect();
        for &i in &all {
            rig.signal_leader(i, Signal::SIGSTOP, true);
        }
        std::thread::sleep(timing.duration + Duration::from_secs(4));
        let resumed = Timestamp::now();
        for &i in &all {
            rig.signal_leader(i, Signal::SIGCONT, true);
        }
        // The leader's first renewal after the pause decides: wait for one written after it.
        let renewed = runtime
            .block_on(wait_object(
                &leases,
                "paused-leader",
                "renewed after the pause",
                Duration::from_secs(20),
                |l: &Lease| {
                    l.spec
                        .as_ref()
                        .and_then(|s| s.renew_time.as_ref())
                        .is_some_and(|t| t.0 > resumed)
                },
            ))
            .expect("the Lease is renewed after the pause");
        let spec = renewed.spec.unwrap_or_default();
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(identity.as_str()),
            "the leader kept the Lease"
        );
        assert_eq!(
            spec.lease_transitions,
            before.spec.and_then(|s| s.lease_transitions),
            "the Lease did not change hands"
        );
        assert_eq!(rig.master_pid(first), Some(master), "the same master runs");
        assert_eq!(
            rig.wait_leader(None, Duration::from_secs(10)).expect("a leader"),
            first
        );
        assert_eq!(
            store::get(&address, "before-pause", None).expect("get"),
            Lookup::Hit(4096),
            "the key outlived the pause"
        );

        // The leader alone stops for longer than the lease: a standby takes over meanwhile.
        let old_master = rig
            .signal_leader(first, Signal::SIGSTOP, true)
            .expect("the leader's master");
        let second = rig
            .wait_leader(Some(first), Duration::from_secs(30))
            .expect("a standby takes over from the paused leader");
        // Only the elector runs again: its first pass must stop the (still frozen) master, so it
        // never answers beside the new one.
        rig.signal_leader(first, Signal::SIGCONT, false);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rig.master_pid(first) == Some(old_master) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            rig.master_pid(first),
            None,
            "the paused leader's elector stopped its master within 10 s of running again (logs: {})",
            rig.dir().display()
        );
        assert_eq!(rig.leader(), Some(second), "one leader serves");

        let (samples, violations) = watch.finish();
        // A frozen master holds each probe until its timeout: fewer samples than in a free run.
        assert!(samples >= 10, "the watch sampled ({samples})");
        assert_eq!(
            violations,
            0,
            "two masters served at once in {violations} of {samples} samples (logs: {})",
            rig.dir().display()
        );
    })
    .await
    .expect("the scenario thread");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_mode_member_survives_a_single_leader_restart() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "single")
        .await
        .expect("namespace");
    let ns_for_lease = ns.clone();
    let kubeconfig = cluster.control_plane.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        let mut rig = Rig::start(
            &kubeconfig,
            &ns,
            "single-leader",
            1,
            0,
            SEGMENT,
            LeaseTiming::default(),
        )
        .expect("rig");
        let leader = rig
            .wait_leader(None, Duration::from_secs(30))
            .expect("leader");
        let slot = rig.leaders[leader].as_ref().expect("slot");
        let place = slot.slot_address();
        // A member in Service mode: a fixed address (the leader Service on a cluster).
        let dir = paths::scratch("service-member").expect("dir");
        let _member =
            Member::start(&dir, &MemberOptions::new(slot.address(), SEGMENT)).expect("member");
        rig.wait_capacity(leader, SEGMENT, Duration::from_secs(20))
            .expect("mounted");

        // The single leader dies and comes back (same Pod name, same address).
        rig.stop_leader(leader, true);
        let restarted = rig.start_leader("leader-0", Some(place)).expect("restart");
        rig.leaders[leader] = Some(restarted);
        rig.wait_leader(None, Duration::from_secs(30))
            .expect("the same identity leads again at once");
        rig.wait_capacity(leader, SEGMENT, Duration::from_secs(30))
            .expect("the member remounts by heartbeat");
    })
    .await
    .expect("the scenario thread");
    // The leader published what its master binary says it is, not what a tag claims.
    let lease =
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client, &ns_for_lease)
            .get("single-leader")
            .await
            .expect("the Lease");
    assert_eq!(
        lease
            .metadata
            .annotations
            .unwrap_or_default()
            .get(kvcache_api::STORE_VERSION_ANNOTATION)
            .map(String::as_str),
        Some(paths::MOONCAKE_VERSION)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_lease_rights_the_elector_says_so_and_stays_not_ready() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "norbac")
        .await
        .expect("namespace");
    let kubeconfig = cluster
        .control_plane
        .user_kubeconfig("no-rights", "nobody")
        .expect("user");
    tokio::task::spawn_blocking(move || {
        let mut rig = Rig::start(
            &kubeconfig,
            &ns,
            "store-leader",
            1,
            0,
            SEGMENT,
            LeaseTiming::default(),
        )
        .expect("rig");
        let slot = rig.leaders[0].as_mut().expect("slot");
        slot.proc
            .wait_log(
                "permission denied: this Pod's ServiceAccount may not get leases.coordination.k8s.io",
                Duration::from_secs(20),
            )
            .expect("the elector names the refused verb");
        // The line, read as the JSON object it is, names the Lease and its namespace.
        let text = std::fs::read_to_string(&slot.proc.log).expect("the elector's log");
        let refusal = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|l| l["fields"]["error"].as_str().map(str::to_owned))
            .find(|e| e.contains("may not get leases.coordination.k8s.io"))
            .expect("a refusal in a JSON log line");
        assert!(
            refusal.contains("\"store-leader\" in namespace norbac"),
            "names the Lease and its namespace: {refusal}"
        );
        // Its /readyz answers, and answers not ready.
        let url = format!("http://127.0.0.1:{}/readyz", slot.ready_port);
        let answer = ureq::get(&url)
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .expect("the readiness server answers");
        assert_eq!(answer.status(), 503, "not ready without the Lease");
        assert!(!slot.master_serving(), "no master runs");
        assert!(
            kvcache_e2e::failover::children_of(slot.proc.pid()).is_empty(),
            "the elector started no master"
        );
    })
    .await
    .expect("the scenario thread");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_master_that_exits_hands_over() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "childexit")
        .await
        .expect("namespace");
    let kubeconfig = cluster.control_plane.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        let mut rig = Rig::start(
            &kubeconfig,
            &ns,
            "exit-leader",
            2,
            0,
            SEGMENT,
            LeaseTiming::default(),
        )
        .expect("rig");
        let first = rig
            .wait_leader(None, Duration::from_secs(30))
            .expect("leader");
        // The master dies on its own: the elector releases the Lease and exits non-zero.
        let master = kvcache_e2e::failover::children_of(
            rig.leaders[first].as_ref().expect("slot").proc.pid(),
        );
        assert_eq!(master.len(), 1, "one master under the leader elector");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(master[0]),
            nix::sys::signal::Signal::SIGKILL,
        );
        let t = Instant::now();
        rig.wait_leader(Some(first), Duration::from_secs(30))
            .expect("a standby takes over");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "the Lease was released, not left to expire ({:?})",
            t.elapsed()
        );
        let slot = rig.leaders[first].as_mut().expect("slot");
        slot.proc
            .wait_log("the store process exited", Duration::from_secs(10))
            .expect("the elector says why it stops");
        slot.proc
            .wait_exit(Duration::from_secs(10))
            .expect("the elector exits when its master does");
    })
    .await
    .expect("the scenario thread");
}
