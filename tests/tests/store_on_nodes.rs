//! The store on real nodes, with the operator not involved: the objects `kvcache-operator
//! render` prints for the walkthrough (at demo size) are applied with the client, and the real
//! kubelets run them from the locally built images: the leader through the elector, one member
//! per node mounting through the leader Service's DNS name, and the engine stand-in playing vLLM.
//! Each test has its own operator namespace on the one shared two-node cluster.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kvcache_e2e::cluster::block_on;
use kvcache_e2e::nodes::{self, NODE_ALLOCATABLE_MEMORY};
use kvcache_e2e::pods::{self, ip_of, name_of, node_of};
use kvcache_e2e::store::{Lookup, metric_value};
use kvcache_e2e::walkthrough::{self, backend_pods, role_pods};
use kvcache_e2e::{Error, paths};
use kvcache_render::objects::backend::ADMIN_PORT;

/// Time for Pods to start from the local images.
const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

/// Renders the demo-size walkthrough (changed by `edit`) into operator namespace `ns` and
/// applies it.
async fn apply_walkthrough(
    client: &kube::Client,
    ns: &str,
    edit: impl Fn(&mut serde_json::Value) -> bool,
) -> Result<(), Error> {
    let dir = paths::scratch(ns)?;
    let manifests = walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, edit)?;
    let objects = walkthrough::render(&manifests, ns)?;
    walkthrough::apply(client, &objects).await
}

/// Only the store: the walkthrough without its ModelDeployment, the backend changed by `edit`.
fn backend_only(
    edit: impl Fn(&mut serde_json::Value) + 'static,
) -> impl Fn(&mut serde_json::Value) -> bool {
    move |v: &mut serde_json::Value| {
        edit(v);
        v["kind"] != "ModelDeployment"
    }
}

/// The leader Service's address as Pods dial it.
fn leader_service(ns: &str, port: i32) -> String {
    format!("mooncake-dram-leader.{ns}.svc:{port}")
}

/// Reads the master's /metrics through the leader Service, from inside `pod`.
async fn master_metrics(api: &Api<Pod>, pod: &str, ns: &str) -> Result<String, Error> {
    master_get(api, pod, ns, "metrics").await
}

/// Reads one of the master's admin pages through the leader Service, from inside `pod`.
async fn master_get(api: &Api<Pod>, pod: &str, ns: &str, page: &str) -> Result<String, Error> {
    pods::master_page(api, pod, &leader_service(ns, ADMIN_PORT), page).await
}

/// Waits until the master, read through the Service from inside `pod`, reports `bytes` of
/// capacity.
async fn wait_capacity(api: &Api<Pod>, pod: &str, ns: &str, bytes: u64) -> Result<String, Error> {
    wait_master(api, pod, ns, "master_total_capacity_bytes", bytes as f64).await
}

/// Waits until the master, read through the Service from inside `pod`, reports the unlabelled
/// sample `name` at `want`, and returns its metrics. The store has no watch: its figures are
/// read again every half second; a read that fails is read again.
async fn wait_master(
    api: &Api<Pod>,
    pod: &str,
    ns: &str,
    name: &str,
    want: f64,
) -> Result<String, Error> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = master_metrics(api, pod, ns).await;
        if let Ok(text) = &seen
            && metric_value(text, name) == Some(want)
        {
            return Ok(text.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Wait {
                what: format!("{name} {want} through the leader Service of {ns} ({WAIT:?})"),
                reason: match seen {
                    Ok(text) => format!(
                        "it reports {:?}; its segments: {}",
                        metric_value(&text, name),
                        master_get(api, pod, ns, "get_all_segments")
                            .await
                            .unwrap_or_else(|e| e.to_string())
                    ),
                    Err(e) => e.to_string(),
                },
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn walkthrough_at_demo_size_runs_on_real_pods() {
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;
        let ns = "kvc-walk";
        apply_walkthrough(&client, ns, |_| true).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);

        // The leader runs the master through the elector and is Ready only once it serves.
        let leader =
            pods::wait_ready(&store, &backend_pods("mooncake-dram", "leader"), 1, WAIT).await?;
        let log = pods::wait_log(
            &store,
            name_of(&leader[0]),
            Some("master"),
            "mooncake_master",
            WAIT,
        )
        .await?;
        assert!(
            log.contains("0.3.13.post1"),
            "the elector asks the master for its version before it starts it; log:\n{log}"
        );

        // One member per node, each dialling the master by the Service's DNS name.
        let members =
            pods::wait_ready(&store, &backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        let on: std::collections::BTreeSet<&str> = members.iter().filter_map(node_of).collect();
        assert_eq!(
            on.len(),
            2,
            "one member per node: {}",
            pods::describe(&members)
        );
        for m in &members {
            let env = m.spec.as_ref().expect("a Pod spec").containers[0]
                .env
                .clone()
                .unwrap_or_default();
            let master = env
                .iter()
                .find(|e| e.name == "MOONCAKE_MASTER")
                .and_then(|e| e.value.clone());
            assert_eq!(master.as_deref(), Some(leader_service(ns, 50051).as_str()));
        }

        // The master, read through the Service, counts both members: 2 x 256 MiB.
        wait_capacity(&store, name_of(&members[0]), ns, 512 * MIB).await?;
        // The master's client count need not move with its capacity: wait for it too.
        wait_master(
            &store,
            name_of(&members[0]),
            ns,
            "master_active_clients",
            2.0,
        )
        .await?;

        // The rendered qwen-chat role (the engine stand-in as vLLM 0.29.0) writes and reads a
        // block under tenant `default` through the injected settings.
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-a");
        let engines = pods::wait_ready(&team, &role_pods("qwen-chat", "server"), 2, WAIT).await?;
        for e in &engines {
            let log = pods::wait_log(&team, name_of(e), None, "get key=", WAIT).await?;
            assert!(
                log.contains(&format!("master {}", leader_service(ns, 50051))),
                "{log}"
            );
            assert!(log.contains("tenant default"), "{log}");
            assert!(
                log.contains(&format!("bytes={} rc=0", MIB)),
                "the put succeeds: {log}"
            );
            assert!(
                log.contains(&format!("exist=1 bytes={}", MIB)),
                "the block reads back: {log}"
            );
        }
        // Both engines' blocks, as the master counts them (read until it does, not once).
        wait_master(&store, name_of(&members[0]), ns, "master_key_count", 2.0).await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn three_leader_replicas_serve_one_at_a_time_and_a_failover_is_a_cold_cache() {
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;
        let ns = "kvc-ha";
        apply_walkthrough(
            &client,
            ns,
            backend_only(|v| {
                if v["kind"] == "KVCacheBackend" {
                    v["spec"]["connection"]["managed"]["leader"]["replicas"] = 3.into();
                }
            }),
        )
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        let leaders: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let selector = backend_pods("mooncake-dram", "leader");

        // 3 desired, 1 ready: the standbys wait for the Lease and never pass readiness.
        let members =
            pods::wait_ready(&store, &backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        let first = pods::wait_pods(&store, &selector, "3 running, exactly 1 Ready", WAIT, |p| {
            p.len() == 3 && p.iter().filter(|p| pods::is_ready(p)).count() == 1
        })
        .await?;
        let serving = first
            .iter()
            .find(|p| pods::is_ready(p))
            .expect("a Ready leader");
        let d = kvcache_e2e::cluster::wait_object(
            &leaders,
            "mooncake-dram-leader",
            "3 desired / 1 ready",
            WAIT,
            |d| {
                let s = d.status.as_ref();
                s.and_then(|s| s.replicas) == Some(3) && s.and_then(|s| s.ready_replicas) == Some(1)
            },
        )
        .await?;
        assert_eq!(d.spec.expect("a Deployment spec").replicas, Some(3));
        let slice = only_leader_slice(&slices).await?;
        let ready: Vec<String> = ready_addresses(&slice);
        assert_eq!(
            ready,
            vec![ip_of(serving).expect("the leader's address").to_owned()],
            "{slice:#?}"
        );

        // A key written before the failover.
        let member = name_of(&members[0]).to_owned();
        write_and_hit(&store, ns, &member, "before-failover").await?;

        // The serving leader goes: a standby takes the Lease and serves, members remount, and
        // the earlier key is gone (the master keeps its objects in memory only).
        let gone = name_of(serving).to_owned();
        store.delete(&gone, &DeleteParams::default()).await?;
        let next = pods::wait_pods(
            &store,
            &selector,
            "a Ready leader other than the deleted one",
            WAIT,
            |p| p.iter().any(|p| pods::is_ready(p) && name_of(p) != gone),
        )
        .await?;
        let new_leader = next
            .iter()
            .find(|p| pods::is_ready(p) && name_of(p) != gone)
            .expect("a new Ready leader");
        assert_eq!(
            remounted_lookup(&store, ns, &member, "before-failover").await?,
            Lookup::Miss
        );
        let slice = only_leader_slice(&slices).await?;
        assert_eq!(
            ready_addresses(&slice),
            vec![
                ip_of(new_leader)
                    .expect("the new leader's address")
                    .to_owned()
            ]
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

async fn only_leader_slice(slices: &Api<EndpointSlice>) -> Result<EndpointSlice, Error> {
    let lp = ListParams::default().labels("kubernetes.io/service-name=mooncake-dram-leader");
    let mut list = slices.list(&lp).await?.items;
    assert_eq!(list.len(), 1, "one EndpointSlice for the leader Service");
    Ok(list.remove(0))
}

/// The addresses of a slice whose endpoints are ready.
fn ready_addresses(slice: &EndpointSlice) -> Vec<String> {
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .flat_map(|e| e.addresses.clone())
        .collect()
}

/// Once the master reports both demo members, writes 4 KiB under `key` (default tenant) from
/// inside `member` and reads it back: a hit.
async fn write_and_hit(store: &Api<Pod>, ns: &str, member: &str, key: &str) -> Result<(), Error> {
    let master = leader_service(ns, 50051);
    wait_capacity(store, member, ns, 512 * MIB).await?;
    assert_eq!(
        pods::store_put(store, member, &master, key, None, 4096).await?,
        0
    );
    assert_eq!(
        pods::store_get(store, member, &master, key, None).await?,
        Lookup::Hit(4096)
    );
    Ok(())
}

/// Once the master (a new one, after a failover or a restart) reports both demo members again,
/// reads `key` from inside `member`.
async fn remounted_lookup(
    store: &Api<Pod>,
    ns: &str,
    member: &str,
    key: &str,
) -> Result<Lookup, Error> {
    wait_capacity(store, member, ns, 512 * MIB).await?;
    pods::store_get(store, member, &leader_service(ns, 50051), key, None).await
}

#[test]
fn a_single_leader_restart_gives_a_cold_cache() {
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;
        let ns = "kvc-restart";
        apply_walkthrough(&client, ns, backend_only(|_| {})).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        let member_pods = backend_pods("mooncake-dram", "member-0");
        let members = pods::wait_ready(&store, &member_pods, 2, WAIT).await?;
        let selector = backend_pods("mooncake-dram", "leader");
        let leader = pods::wait_ready(&store, &selector, 1, WAIT).await?;
        let member = name_of(&members[0]).to_owned();
        write_and_hit(&store, ns, &member, "before-restart").await?;

        // The one leader restarts (its Pod deleted; the ReplicaSet starts another): the new
        // master starts empty, the members re-register their segments, the key misses.
        let gone = name_of(&leader[0]).to_owned();
        store.delete(&gone, &DeleteParams::default()).await?;
        pods::wait_pods(
            &store,
            &selector,
            "a Ready leader other than the deleted one",
            WAIT,
            |p| p.iter().any(|p| pods::is_ready(p) && name_of(p) != gone),
        )
        .await?;
        assert_eq!(
            remounted_lookup(&store, ns, &member, "before-restart").await?,
            Lookup::Miss
        );
        // The members are the same Pods: they kept running and mounted again, nothing restarted
        // them; the cache is cold all the same.
        let after = pods::wait_ready(&store, &member_pods, 2, WAIT).await?;
        let uids = |p: &[Pod]| -> Vec<Option<String>> {
            let mut u: Vec<_> = p.iter().map(|p| p.metadata.uid.clone()).collect();
            u.sort();
            u
        };
        assert_eq!(uids(&after), uids(&members));
        walkthrough::delete_namespace(&client, ns).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_store_and_engine_on_different_version_lines_start_healthy_and_fail_every_write() {
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;
        let ns = "kvc-lines";
        apply_walkthrough(&client, ns, backend_only(|_| {})).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        let members =
            pods::wait_ready(&store, &backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        wait_capacity(&store, name_of(&members[0]), ns, 512 * MIB).await?;

        // The same engine (the stand-in as SGLang, its settings written by hand), once with the
        // store's client line (0.3.13.post1) and once with SGLang 0.5.18's (0.3.12.post1),
        // against the 0.3.13.post1 store. No injection: the operator refuses the older pair.
        let env = serde_json::json!([
            {"name": "MOONCAKE_MASTER", "value": leader_service(ns, 50051)},
            {"name": "MOONCAKE_PROTOCOL", "value": "tcp"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "STANDIN_RETRY_SECONDS", "value": "0"},
            // What injection hands an engine: no segment of its own.
            {"name": "MOONCAKE_GLOBAL_SEGMENT_SIZE", "value": "0"},
        ]);
        let engines = [
            ("same-line", kvcache_e2e::images::ENGINE.name),
            ("older-line", kvcache_e2e::images::ENGINE_OLD_CLIENT.name),
        ];
        let command = ["sglang", "serve", "--hicache-storage-backend", "mooncake"];
        for (name, image) in engines {
            let pod = standin_pod(name, image, &command, env.clone(), Some(SGLANG_PORT));
            store.create(&Default::default(), &pod).await?;
        }
        let mut answers = Vec::new();
        for (name, _) in engines {
            // Healthy: the client set up, the readiness probe passes.
            if let Err(e) = pods::wait_pod(&store, name, "Ready", WAIT, pods::is_ready).await {
                let log = pods::logs(&store, name, None).await.unwrap_or_default();
                panic!("{e}\n--- its log:\n{log}");
            }
            let mut puts = Vec::new();
            for i in 0..5 {
                let body = pods::proxy_get(
                    &client,
                    ns,
                    name,
                    SGLANG_PORT,
                    &format!("put?key={name}-{i}&size=65536"),
                )
                .await?;
                let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
                puts.push(v["rc"].as_i64().expect("rc"));
            }
            let body =
                pods::proxy_get(&client, ns, name, SGLANG_PORT, &format!("get?key={name}-0"))
                    .await?;
            let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            let exist = v["exist"].as_i64().expect("exist");
            let p = store.get(name).await?;
            answers.push((name, puts, exist, pods::is_ready(&p)));
        }
        let [same, older] = &answers[..] else {
            unreachable!()
        };
        assert_eq!(*same, ("same-line", vec![0; 5], 1, true), "{answers:?}");
        // The older line: still Ready, every write refused, the read is not a hit.
        assert_eq!((older.0, older.3), ("older-line", true), "{answers:?}");
        assert!(
            older.1.iter().all(|rc| *rc != 0),
            "every write fails: {answers:?}"
        );
        // Its read fails inside the client (RPC_FAIL) and answers exist 0: a miss to the engine.
        assert_eq!(older.2, 0, "the read looks like a miss: {answers:?}");
        walkthrough::delete_namespace(&client, ns).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The stand-in's port when it plays SGLang.
const SGLANG_PORT: u16 = 30000;

#[test]
fn a_members_memory_request_is_its_segment_plus_the_buffer_and_one_that_does_not_fit_stays_pending()
{
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;
        let ns = "kvc-big";
        // More than a node offers: the member's request is this plus its buffer.
        let too_big = format!("{}Mi", NODE_ALLOCATABLE_MEMORY / MIB);
        apply_walkthrough(
            &client,
            ns,
            backend_only(move |v| {
                if v["kind"] == "KVCacheBackend" {
                    v["spec"]["connection"]["managed"]["members"][0]["capacityPerMember"] =
                        too_big.clone().into();
                }
            }),
        )
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pending = pods::wait_pods(
            &store,
            &backend_pods("mooncake-dram", "member-0"),
            "2 Pending members, unschedulable for memory",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().all(|p| {
                        p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| {
                                    c.type_ == "PodScheduled"
                                        && c.status == "False"
                                        && c.reason.as_deref() == Some("Unschedulable")
                                        && c.message
                                            .as_deref()
                                            .is_some_and(|m| m.contains("Insufficient memory"))
                                })
                            })
                    })
            },
        )
        .await?;
        let segment = NODE_ALLOCATABLE_MEMORY;
        let buffer = kvcache_render::objects::backend::DEFAULT_LOCAL_BUFFER;
        for p in &pending {
            assert_eq!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Pending")
            );
            // The member container's memory request: capacityPerMember plus the client's
            // transfer buffer (the render's 16Mi default), so it is a claim on the node.
            let member = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "member"))
                .expect("the member container");
            let request = member
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
                .map(|q| kvcache_api::quantity::parse_bytes(&q.0).expect("bytes"))
                .expect("a memory request");
            assert_eq!(request, segment + buffer, "{}", name_of(p));
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The walkthrough's backend with a demo-size disk tier at `path` (under the examples'
/// `/var/lib/kvcache`, each node's own folder): `walkthrough::demo_tier`. The master offloads an
/// object when it evicts it from memory (`-offload_on_evict`, derived from the declaration), so
/// the test fills the segments twice.
fn disk_tier(path: &'static str) -> impl Fn(&mut serde_json::Value) + 'static {
    move |v: &mut serde_json::Value| {
        if v["kind"] == "KVCacheBackend" {
            walkthrough::demo_tier(v, path);
        }
    }
}

/// The uid the store image runs as (what the tier folder must be writable by).
const STORE_UID: u32 = 65532;

#[test]
fn a_disk_tier_writes_buckets_on_the_node_and_an_unwritable_one_keeps_the_member_unready() {
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    // Each node's own view of /var/lib/kvcache: the tier folder, owned by the image's user,
    // and a locked folder owned by root.
    let mut tiers = Vec::new();
    for n in &cluster.nodes.nodes {
        let root = n.host_root.join("var/lib/kvcache");
        let tier = root.join("tier");
        let locked = root.join("locked");
        for (dir, uid) in [(&tier, STORE_UID), (&locked, 0)] {
            std::fs::create_dir_all(dir).expect("the tier folder");
            std::os::unix::fs::chown(dir, Some(uid), Some(0)).expect("chown");
            std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o750))
                .expect("chmod");
        }
        tiers.push(tier);
    }
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;

        // The writable tier: members Ready; two rounds of 56 MiB into 64 MiB of segments.
        let ns = "kvc-disk";
        apply_walkthrough(&client, ns, backend_only(disk_tier("/var/lib/kvcache/tier"))).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        let members = pods::wait_ready(&store, &backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        let member = name_of(&members[0]).to_owned();
        let before = wait_capacity(&store, &member, ns, 64 * MIB).await?;
        let allocated_before = metric_value(&before, "master_allocated_file_size_bytes").unwrap_or(0.0);
        let master = leader_service(ns, 50051);
        let ip = ip_of(&members[0]).expect("a member address").to_owned();
        let out = pods::exec(&store, &member, None, &[
            "python3", "-c", kvcache_e2e::pods::PUT_MANY, &master, &ip, "2", "56", "1048576",
        ]).await?;
        assert!(out.success && out.stdout.contains("round 1 ok"), "{out:?}");

        // The tier's declared 1Gi per member, two members.
        let tier_bytes = (2u64 << 30) as f64;
        let deadline = tokio::time::Instant::now() + WAIT;
        let buckets = loop {
            let buckets: Vec<_> = tiers
                .iter()
                .flat_map(|t| std::fs::read_dir(t).into_iter().flatten().flatten())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "bucket"))
                .collect();
            let metrics = master_metrics(&store, &member, ns).await?;
            let allocated = metric_value(&metrics, "master_allocated_file_size_bytes").unwrap_or(0.0);
            // The tiers' declared capacity: each member registers its own, apart from its mount.
            let declared = metric_value(&metrics, "master_total_file_capacity_bytes");
            if !buckets.is_empty() && allocated > allocated_before && declared == Some(tier_bytes) {
                break buckets;
            }
            if tokio::time::Instant::now() >= deadline {
                let mut logs = String::new();
                for m in &members {
                    let log = pods::logs(&store, name_of(m), Some("member")).await.unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    logs.push_str(&format!("\n--- {}:\n{}", name_of(m), tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
                }
                panic!(
                    "no .bucket file under {tiers:?} with master_allocated_file_size_bytes above {allocated_before} and master_total_file_capacity_bytes {tier_bytes} (now {allocated} and {declared:?}; buckets {buckets:?}); members' logs:{logs}"
                );
            }
            // Buckets are written on the members' one-second heartbeat; the folders have no watch.
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert!(!buckets.is_empty());

        // The locked folder: the survey stops each member before the store starts, saying why.
        let ns = "kvc-locked";
        apply_walkthrough(&client, ns, backend_only(disk_tier("/var/lib/kvcache/locked"))).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        let stuck = pods::wait_pods(&store, &backend_pods("mooncake-dram", "member-0"), "2 members whose tier survey failed", WAIT, |p| {
            p.len() == 2 && p.iter().all(|p| survey_message(p).is_some_and(|m| m.contains("not writable")))
        })
        .await?;
        for p in &stuck {
            assert!(!pods::is_ready(p));
            let m = survey_message(p).expect("the survey's message");
            assert!(m.contains(&format!("uid {STORE_UID}")) && m.contains("install -d -o 65532"), "{m}");
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The tier survey's termination message, once it ended.
fn survey_message(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "tier-survey")
        .and_then(|c| {
            c.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .or(c.state.as_ref().and_then(|s| s.terminated.as_ref()))
        })
        .and_then(|t| t.message.clone())
}

/// A bare Pod of the engine stand-in (no injection: its settings are written here by hand),
/// Ready on its `/health` at `port` when given.
fn standin_pod(
    name: &str,
    image: &str,
    command: &[&str],
    env: serde_json::Value,
    port: Option<u16>,
) -> Pod {
    let probe = port.map(
        |p| serde_json::json!({"httpGet": {"path": "/health", "port": p}, "periodSeconds": 1}),
    );
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "engine",
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
                "env": env,
                "readinessProbe": probe,
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
            }],
        },
    }))
    .expect("a Pod")
}

#[test]
fn the_engine_stand_in_missing_a_setting_ends_at_once_saying_which() {
    let cluster = nodes::shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = kvcache_e2e::cluster::client_from(&kc).await?;
        let ns = "kvc-standin";
        walkthrough::ensure_namespace(&client, ns).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), ns);
        // The Mooncake connector named, the client document's path missing: the stand-in ends
        // at once, saying which.
        let current = kvcache_e2e::images::ENGINE.name;
        let connector = r#"{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both"}"#;
        store
            .create(
                &Default::default(),
                &standin_pod(
                    "no-config-path",
                    current,
                    &[
                        "vllm",
                        "serve",
                        "a-model",
                        "--kv-transfer-config",
                        connector,
                    ],
                    serde_json::json!([]),
                    None,
                ),
            )
            .await?;
        let ended = pods::wait_pod(&store, "no-config-path", "Failed", WAIT, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
        })
        .await?;
        let terminated = ended
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state)
            .and_then(|s| s.terminated)
            .expect("the container ended");
        assert_eq!(terminated.exit_code, 2);
        let log = pods::logs(&store, "no-config-path", None).await?;
        assert!(log.contains("MOONCAKE_CONFIG_PATH is not set"), "{log}");
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
