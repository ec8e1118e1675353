//! The backend controller's pass decided from recorded inputs (the snapshot inputs under
//! `tests/inputs/`, live objects built from what the render returns), without an API server.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSetStatus, DeploymentStatus};
use k8s_openapi::jiff::Timestamp;
use kvcache_api::manifest::{self, Object};
use kvcache_api::{KVCacheBackend, Settings};
use kvcache_render::plan::backend::{BackendRead, plan};
use kvcache_render::world::World;

/// An operator in a Pod (a `static`: the read borrows it beyond one expression).
static IN_CLUSTER: kvcache_render::objects::backend::StoreAccess =
    kvcache_render::objects::backend::StoreAccess::IN_CLUSTER;

const NS: &str = "gpustack-system";

fn input(name: &str) -> (KVCacheBackend, World) {
    let path = format!("{}/tests/inputs/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("input");
    let objects: Vec<Object> = manifest::parse(&path, &text)
        .expect("input parses")
        .into_iter()
        .map(|m| m.object)
        .collect();
    let world = World::from_objects(&objects);
    let backend = world.backends().next().expect("a backend").clone();
    (backend, world)
}

fn read<'a>(
    b: &'a KVCacheBackend,
    world: &'a World,
    settings: Option<&'a Settings>,
) -> BackendRead<'a> {
    BackendRead {
        backend: b,
        namespace: NS,
        access: &IN_CLUSTER,
        settings,
        settings_refused: None,
        world,
        deployments: &[],
        daemon_sets: &[],
        stateful_sets: &[],
        lease: None,
        store_pods: &[],
        nodes: &[],
        store: None,
        jobs: BTreeMap::new(),
        pods_at: &NO_PODS,
        drain_unknown: true,
        probe_pods: &[],
        probe: true,
        now: Timestamp::UNIX_EPOCH,
    }
}

/// No Pod looked up at an unknown address.
static NO_PODS: BTreeMap<String, String> = BTreeMap::new();

#[test]
fn a_managed_backend_renders_its_objects_and_decides_each_groups_step() {
    let (b, world) = input("two-groups.yaml");
    let settings = Settings::default();
    let p = plan(&read(&b, &world, Some(&settings))).expect("a plan");
    let objects = p.objects.expect("objects to apply");
    assert_eq!(objects.daemon_sets.len(), 2);
    assert_eq!(p.groups.len(), 2);
    assert!(
        p.groups.iter().all(|g| g.desired.is_none()),
        "no DaemonSet read yet"
    );
    assert_eq!(p.observation.rollout.len(), 2);
    assert_eq!(p.observation.rendered_hashes.len(), 2);
    assert!(p.observation.endpoint.is_some());
    assert!(p.write_policy);
    assert!(p.foreign.is_empty());
}

#[test]
fn what_runs_is_read_back_into_the_groups_and_the_leader() {
    let (b, world) = input("two-groups.yaml");
    let settings = Settings::default();
    let first = plan(&read(&b, &world, Some(&settings))).expect("a plan");
    let objects = first.objects.expect("objects");
    let mut daemon_sets = objects.daemon_sets.clone();
    daemon_sets[1].status = Some(DaemonSetStatus {
        desired_number_scheduled: 2,
        ..Default::default()
    });
    let mut leader = objects.deployment.clone().expect("a leader");
    leader.status = Some(DeploymentStatus {
        ready_replicas: Some(1),
        ..Default::default()
    });
    let deployments = [leader];
    let again = plan(&BackendRead {
        daemon_sets: &daemon_sets,
        deployments: &deployments,
        ..read(&b, &world, Some(&settings))
    })
    .expect("a plan");
    assert_eq!(
        again.groups.iter().map(|g| g.desired).collect::<Vec<_>>(),
        [None, Some(2)]
    );
    assert_eq!(again.observation.leader.map(|l| l.ready), Some(1));
}

#[test]
fn without_settings_or_a_store_image_nothing_is_rendered_and_the_reason_is_kept() {
    let (b, world) = input("walkthrough-backend.yaml");
    let unsettled = plan(&BackendRead {
        settings_refused: Some("kv-cache-dtype-owned: not a boolean".into()),
        ..read(&b, &world, None)
    })
    .expect("a plan");
    assert!(unsettled.objects.is_none());
    assert_eq!(
        unsettled.observation.settings_refused,
        Some(("kv-cache-dtype-owned: not a boolean".into(), false))
    );
    let imageless = Settings {
        kv_cache_backend_image: None,
        ..Settings::default()
    };
    let mut own = b.clone();
    own.spec.image = None;
    let p = plan(&read(&own, &world, Some(&imageless))).expect("a plan");
    assert!(p.objects.is_none());
    assert_eq!(
        p.observation.render_refused.map(|(reason, _)| reason),
        Some("NoStoreImage")
    );
}

#[test]
fn an_external_backend_renders_nothing_and_reports_its_client_address() {
    let (b, world) = input("external.yaml");
    let settings = Settings::default();
    let p = plan(&read(&b, &world, Some(&settings))).expect("a plan");
    assert!(p.objects.is_none());
    assert!(p.observation.rollout.is_empty());
    assert!(p.observation.endpoint.is_some(), "{:?}", p.observation);
}

#[test]
fn the_namespaces_bound_to_a_backend_reach_its_status_sorted() {
    let (b, mut world) = input("external.yaml");
    let extra = "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: p}\nspec: {backends: [outside], quota: {total: 1Gi}}\n---\napiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: elsewhere}\nspec: {backends: [other], quota: {total: 1Gi}}\n";
    let mut text = extra.to_owned();
    for (ns, pool) in [
        ("team-b", "p"),
        ("team-a", "p"),
        ("team-a", "p"),
        ("team-c", "elsewhere"),
    ] {
        text.push_str(&format!("---\napiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: {pool}-{ns}, namespace: {ns}}}\nspec: {{poolRef: {{name: {pool}}}, quota: {{ceiling: 1Mi}}, domain: {{name: {ns}, blockSize: 64, dtype: bfloat16}}}}\n"));
    }
    for m in manifest::parse("extra", &text).expect("parses") {
        world.add(m.object);
    }
    let settings = Settings::default();
    let p = plan(&read(&b, &world, Some(&settings))).expect("a plan");
    assert_eq!(p.observation.bound_namespaces, ["team-a", "team-b"]);
    let computed =
        kvcache_render::status::backend::backend_status(&b, &p.observation, &Default::default());
    let status = kvcache_render::status::backend::apply(
        &Default::default(),
        computed,
        &p.observation,
        &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    assert_eq!(status.bound_namespaces, ["team-a", "team-b"]);
    let written = serde_json::to_value(&status).expect("json");
    assert_eq!(
        written["boundNamespaces"],
        serde_json::json!(["team-a", "team-b"])
    );
}

#[test]
fn a_rogue_segment_on_the_serving_master_is_tracked_and_drained_once_past_its_grace() {
    use k8s_openapi::api::core::v1::Pod;
    use kvcache_render::observe::store::{Health, Metrics, Segment, StoreReading};
    let (b, world) = input("walkthrough-backend.yaml");
    let settings = Settings::default();
    let member: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "m0", "labels": {
            "app.kubernetes.io/name": "kv-cache-backend",
            "app.kubernetes.io/instance": b.metadata.name.clone(),
            "app.kubernetes.io/component": "member-0"}},
        "spec": {"nodeName": "n0", "containers": []},
        "status": {"podIP": "10.0.0.5"}
    }))
    .expect("a Pod");
    let pods = [member];
    let listing = r#"{"segments":[
        {"segment_name":"10.0.0.5:15000","size_bytes":67108864,"status":"OK"},
        {"segment_name":"10.0.2.9:15003","size_bytes":33554432,"status":"OK"}]}"#;
    let store = StoreReading {
        health: Health::parse("h", r#"{"service_ready":true}"#),
        metrics: Ok(Metrics::parse("master_total_capacity_bytes 100663296\n")),
        segments: Segment::parse_all("s", listing),
    };
    assert_eq!(
        kvcache_render::plan::backend::unknown_addresses(&b, &pods, Some(&store))
            .into_iter()
            .collect::<Vec<_>>(),
        ["10.0.2.9"]
    );
    let pods_at = BTreeMap::from([("10.0.2.9".to_owned(), "team-b/rogue".to_owned())]);
    let at = |now: &str, b: &KVCacheBackend| {
        plan(&BackendRead {
            store_pods: &pods,
            nodes: &[],
            store: Some(store.clone()),
            pods_at: &pods_at,
            now: now.parse().expect("a time"),
            ..read(b, &world, Some(&settings))
        })
        .expect("a plan")
    };
    let first = at("2026-12-06T10:00:00Z", &b);
    let seen = first.observation.unknown_segments.clone().expect("judged");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].pod.as_deref(), Some("team-b/rogue"));
    assert!(!seen[0].confirmed);
    assert!(first.quarantine.is_empty(), "not within its grace");
    assert_eq!(first.recheck, Some(std::time::Duration::from_secs(30)));
    // The next pass reads the first sighting from the status it wrote.
    let mut stored = b.clone();
    stored.status = Some(kvcache_api::backend::KVCacheBackendStatus {
        unknown_segments: seen,
        ..Default::default()
    });
    let later = at("2026-12-06T10:00:31Z", &stored);
    assert!(later.observation.unknown_segments.expect("judged")[0].confirmed);
    assert_eq!(later.quarantine.len(), 1);
    assert_eq!(later.quarantine[0].segments, ["10.0.2.9:15003"]);
    assert_eq!(later.quarantine[0].target_segments, ["10.0.0.5:15000"]);
    assert_eq!(later.recheck, None);
    // Report only: judged the same, nothing drained.
    let reported = plan(&BackendRead {
        store_pods: &pods,
        nodes: &[],
        store: Some(store.clone()),
        pods_at: &pods_at,
        drain_unknown: false,
        now: "2026-12-06T10:00:31Z".parse().expect("a time"),
        ..read(&stored, &world, Some(&settings))
    })
    .expect("a plan");
    assert!(reported.quarantine.is_empty());
    assert!(!reported.observation.drain_unknown);
}

#[test]
fn a_group_narrowed_away_from_a_node_drains_its_member_there_before_its_template_is_applied() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kvcache_render::members::maintenance::Leaving;
    use kvcache_render::members::rollout::Step;
    use kvcache_render::objects::backend::pod_spec_hash;
    use kvcache_render::objects::desired::Write;
    use kvcache_render::observe::read::{DRAIN_JOB_ANNOTATION, DRAIN_STARTED_ANNOTATION};
    use kvcache_render::observe::store::{
        DrainJob, Health, JobStatus, Metrics, Segment, StoreReading,
    };
    use std::sync::Arc;

    let (b, world) = input("walkthrough-backend.yaml");
    let settings = Settings::default();
    // What runs: the template of every Linux node.
    let live = plan(&read(&b, &world, Some(&settings)))
        .expect("a plan")
        .objects
        .expect("objects")
        .daemon_sets;
    let old = pod_spec_hash(&live[0]);
    let node = |name: &str, pool: &str| -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({"metadata": {"name": name,
                "labels": {"kubernetes.io/os": "linux", "pool": pool}}}))
            .expect("a Node"),
        )
    };
    let nodes = [node("n0", "gpu"), node("n1", "cpu")];
    let member = |name: &str, on: &str, ip: &str, drain: Option<&str>| -> Pod {
        let mut annotations = serde_json::json!({"kvcache.gpustack.ai/pod-spec-hash": old});
        if let Some(job) = drain {
            annotations[DRAIN_STARTED_ANNOTATION] = "2026-12-06T09:59:00Z".into();
            annotations[DRAIN_JOB_ANNOTATION] = job.into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations, "labels": {
                "app.kubernetes.io/name": "kv-cache-backend",
                "app.kubernetes.io/instance": b.metadata.name.clone(),
                "app.kubernetes.io/component": "member-0"}},
            "spec": {"nodeName": on, "containers": []},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("a Pod")
    };
    let store = |m1: &str| StoreReading {
        health: Health::parse("h", r#"{"service_ready":true}"#),
        metrics: Ok(Metrics::parse("master_total_capacity_bytes 134217728\n")),
        segments: Segment::parse_all(
            "s",
            &format!(
                r#"{{"segments":[
                {{"segment_name":"10.0.0.5:15000","size_bytes":67108864,"allocator_used_bytes":0,"status":"OK"}},
                {{"segment_name":"10.0.1.5:15000","size_bytes":67108864,"allocator_used_bytes":1048576,"status":"{m1}"}}]}}"#
            ),
        ),
    };
    // The edit: the group keeps the GPU nodes only.
    let mut edited = b.clone();
    if let Some(m) = edited.spec.connection.managed.as_mut() {
        m.members[0]
            .node_selector
            .insert("pool".into(), "gpu".into());
    }
    let pods = [
        member("m0", "n0", "10.0.0.5", None),
        member("m1", "n1", "10.0.1.5", None),
    ];
    let pass = |pods: &[Pod], store: StoreReading, jobs: BTreeMap<String, _>| {
        plan(&BackendRead {
            daemon_sets: &live,
            store_pods: pods,
            nodes: &nodes,
            store: Some(store),
            jobs,
            now: "2026-12-06T10:00:00Z".parse().expect("a time"),
            ..read(&edited, &world, Some(&settings))
        })
        .expect("a plan")
    };
    let first = pass(&pods, store("OK"), BTreeMap::new());
    let ds = live[0].metadata.name.clone().expect("a name");
    assert_eq!(first.held_groups, std::slice::from_ref(&ds));
    let write_of = |p: &kvcache_render::plan::backend::BackendPlan| {
        p.desired()
            .expect("a set")
            .objects
            .iter()
            .find(|o| o.kind.kind == "DaemonSet" && o.name == ds)
            .map(|o| o.write)
    };
    assert_eq!(
        write_of(&first),
        Some(Write::Keep),
        "the live template stays"
    );
    let marked: Vec<_> = first
        .observation
        .members
        .iter()
        .map(|m| (m.name.as_str(), m.leaving.clone()))
        .collect();
    assert_eq!(marked, [("m0", None), ("m1", Some(Leaving::GroupNarrowed))]);
    let step = &first.observation.rollout[0];
    assert!(
        matches!(&step.step, Step::StartDrain { pod, targets, .. } if pod == "m1" && targets == &["10.0.0.5:15000"]),
        "{step:?}"
    );
    assert_eq!(
        first.observation.rendered_hashes[0], old,
        "nothing else of the group rolls"
    );

    // Drained: the template goes out (the DaemonSet controller deletes m1 then).
    let pods = [
        member("m0", "n0", "10.0.0.5", None),
        member("m1", "n1", "10.0.1.5", Some("j-1")),
    ];
    let done = DrainJob {
        job_id: "j-1".into(),
        status: JobStatus::Succeeded,
        succeeded_units: 3,
        migrated_bytes: 1 << 20,
        ..Default::default()
    };
    let then = pass(
        &pods,
        store("DRAINED"),
        BTreeMap::from([("j-1".to_owned(), Ok(done))]),
    );
    assert!(then.held_groups.is_empty());
    assert_eq!(write_of(&then), Some(Write::Apply));
    assert_eq!(then.observation.rollout[0].held.len(), 1);

    // A warm backend whose master does not serve: no drain can start, and none is given up on
    // (the next master brings the keys back), so the template waits for the drain to come.
    let mut warm = edited.clone();
    if let Some(m) = warm.spec.connection.managed.as_mut() {
        m.leader.election_backend = kvcache_api::backend::ElectionBackend::Etcd;
    }
    let pods = [
        member("m0", "n0", "10.0.0.5", None),
        member("m1", "n1", "10.0.1.5", None),
    ];
    let not_serving = StoreReading {
        health: Health::parse("h", r#"{"service_ready":false}"#),
        ..store("OK")
    };
    let unsettled = plan(&BackendRead {
        daemon_sets: &live,
        store_pods: &pods,
        nodes: &nodes,
        store: Some(not_serving),
        now: "2026-12-06T10:00:00Z".parse().expect("a time"),
        ..read(&warm, &world, Some(&settings))
    })
    .expect("a plan");
    assert!(
        matches!(
            unsettled.observation.rollout[0].step,
            Step::Wait {
                until: kvcache_render::members::rollout::Until::Leader,
                ..
            }
        ),
        "{:?}",
        unsettled.observation.rollout[0]
    );
    assert_eq!(
        unsettled.held_groups,
        std::slice::from_ref(&ds),
        "m1 is neither drained nor given up on: the live template stays"
    );
    assert_eq!(write_of(&unsettled), Some(Write::Keep));
}
