//! The operator against store Pods on real nodes: `kvcache-operator run` (as from a Pod: in a
//! node's network, resolving the leader Service's DNS name through the cluster DNS) reconciles
//! demo-size backends whose leader and members the kubelets run from the local images.
//! One operator and one two-node cluster per test binary; each test has its own backend.
//!
//! The tests, by what they show: a backend's status and life ([`backend`]), what an edit
//! recreates ([`rollout`]) and how a member rollout keeps the cache ([`drained_rollout`]), as a
//! member group narrowed off a node does ([`narrowed_group`]), leader
//! replicas and the election ([`leader`]), the walkthrough
//! applied in either order ([`apply_order`]), quotas and tenants on the running master
//! ([`quota`]), the workloads that use the store ([`workloads`]) and the disk tier
//! ([`disk_tier`]), warm failover on the backend's own etcd ([`warm_failover`]), a warm
//! backend's keys through each leader edit ([`leader_edits`]) and the store workloads'
//! disruption budgets under the eviction API ([`disruption`]).

mod apply_order;
mod backend;
mod disk_tier;
mod disruption;
mod drained_rollout;
mod leader;
mod leader_edits;
mod narrowed_group;
mod quota;
mod rollout;
mod warm_failover;
mod workloads;

use std::sync::{Mutex, OnceLock, RwLock};
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{block_on, client_from, crds_dir, install_crds, wait_object};
use kvcache_e2e::nodes::{self, NodeCluster};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::status::{has_condition, phase};
use kvcache_e2e::{Error, paths, walkthrough};

const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;
/// Where the operator runs the store workloads.
const NAMESPACE: &str = "gpustack-system";

/// The cluster with the CRDs and one operator (every controller).
fn cluster() -> &'static NodeCluster {
    operator();
    nodes::shared()
}

/// The binary's one operator (started with the cluster).
fn operator() -> &'static Mutex<Operator> {
    static OPERATOR: OnceLock<Result<Mutex<Operator>, String>> = OnceLock::new();
    let cluster = nodes::shared();
    let op = OPERATOR.get_or_init(|| {
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            install_crds(&client, &crds_dir()).await?;
            walkthrough::ensure_namespace(&client, NAMESPACE).await
        })
        .map_err(|e| e.to_string())?;
        let dir = paths::scratch("operator-on-nodes").map_err(|e| e.to_string())?;
        Operator::builder(&cluster.nodes.kubeconfig, NAMESPACE)
            .on_nodes(&cluster.nodes)
            .start(&dir)
            .map(Mutex::new)
            .map_err(|e| e.to_string())
    });
    match op {
        Ok(op) => op,
        Err(e) => panic!("the operator could not start on the nodes: {e}"),
    }
}

/// The operator restarted mid-way by one test (write) is down for moments; a test whose Pods
/// pass its webhook (read) waits for it instead of being refused while it is down.
static OPERATOR_UP: RwLock<()> = RwLock::new(());

/// The walkthrough's role asks for one GPU per replica and the nodes offer two in all: the
/// tests that run it take turns.
static GPUS: Mutex<()> = Mutex::new(());

/// The image the tests' backends name themselves, so that only the setting test's backend
/// follows the cluster setting (the render's default, as a user would write it).
const PINNED_IMAGE: &str = kvcache_api::settings::DEFAULT_BACKEND_IMAGE;

/// The walkthrough's backend at demo size under `name`, with its image pinned, changed by
/// `edit`.
fn backend(name: &str, edit: impl Fn(&mut serde_json::Value)) -> KVCacheBackend {
    let text =
        std::fs::read_to_string(walkthrough::examples("walkthrough").join("01-backend.yaml"))
            .expect("the walkthrough's backend");
    let mut v: serde_json::Value = serde_yaml::from_str(&text).expect("YAML");
    v["metadata"]["name"] = name.into();
    v["spec"]["image"] = PINNED_IMAGE.into();
    v["spec"]["connection"]["managed"]["members"][0]["capacityPerMember"] =
        walkthrough::DEMO_CAPACITY_PER_MEMBER.into();
    edit(&mut v);
    // After the edit, which may replace the leader object whole.
    walkthrough::fill_store_resources(&mut v, walkthrough::RIG_STORE_CPU);
    serde_json::from_value(v).expect("a KVCacheBackend")
}

async fn apply(client: &Client, b: &KVCacheBackend) -> Result<(), Error> {
    Api::<KVCacheBackend>::all(client.clone())
        .patch(
            &b.name_any(),
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(b),
        )
        .await?;
    Ok(())
}

async fn wait_backend(
    client: &Client,
    name: &str,
    what: &str,
    ok: impl Fn(&KVCacheBackend) -> bool,
) -> Result<KVCacheBackend, Error> {
    let api: Api<KVCacheBackend> = Api::all(client.clone());
    wait_object(&api, name, what, WAIT, ok).await
}

/// Waits until the backend is Ready with `bytes` of capacity (the store's own figure).
async fn wait_backend_ready(
    client: &Client,
    name: &str,
    bytes: u64,
) -> Result<KVCacheBackend, Error> {
    wait_backend(
        client,
        name,
        &format!("Ready with {}Mi", bytes / MIB),
        |b| phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(bytes),
    )
    .await
}

/// The backend's capacity in bytes, as the serving leader reported it.
fn capacity(b: &KVCacheBackend) -> Option<u64> {
    b.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| parse_bytes(&c.total.0).ok())
}

/// Sends `sig` to the host processes `pids` (a Pod's, from [`kvcache_e2e::pods::host_pids`]).
fn signal(pids: &[i32], sig: nix::sys::signal::Signal) {
    for pid in pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), sig);
    }
}

/// Deletes a test's backend (without waiting: its finalizer releases it and its Pods go).
async fn remove_backend(client: &Client, name: &str) -> Result<(), Error> {
    Api::<KVCacheBackend>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Deletes a ModelDeployment and waits until its Pods are gone (their GPUs free).
async fn remove_model(client: &Client, ns: &str, name: &str) -> Result<(), Error> {
    walkthrough::remove_model(client, ns, name, WAIT).await
}

/// The walkthrough's objects under names of their own (`tag`): namespace and Binding
/// `team-<tag>`, backend `mooncake-<tag>` (image pinned), pool `shared-<tag>`.
fn walkthrough_as(v: &mut serde_json::Value, tag: &str) {
    let team = format!("team-{tag}");
    match v["kind"].as_str() {
        Some("Namespace") => v["metadata"]["name"] = team.into(),
        Some("KVCacheBackend") => {
            v["metadata"]["name"] = format!("mooncake-{tag}").into();
            v["spec"]["image"] = PINNED_IMAGE.into();
        }
        Some("KVCachePool") => {
            v["metadata"]["name"] = format!("shared-{tag}").into();
            v["spec"]["backends"] = serde_json::json!([format!("mooncake-{tag}")]);
        }
        Some("KVCachePoolBinding") => {
            v["metadata"]["name"] = team.clone().into();
            v["metadata"]["namespace"] = team.into();
            v["spec"]["poolRef"]["name"] = format!("shared-{tag}").into();
        }
        Some("ModelDeployment") => {
            v["metadata"]["namespace"] = team.clone().into();
            v["spec"]["kvCache"]["poolRef"]["name"] = team.into();
        }
        _ => {}
    }
}

/// Deletes the walkthrough objects of `tag` (Binding, pool, backend), without waiting: their
/// finalizers release them in order.
async fn remove_walkthrough(client: &Client, tag: &str) -> Result<(), Error> {
    let team = format!("team-{tag}");
    remove_binding(client, &team).await?;
    Api::<KVCachePool>::all(client.clone())
        .delete(&format!("shared-{tag}"), &DeleteParams::default())
        .await?;
    Api::<KVCacheBackend>::all(client.clone())
        .delete(&format!("mooncake-{tag}"), &DeleteParams::default())
        .await?;
    Ok(())
}

/// Deletes a test's Binding (named after its namespace) with its tenant's objects: without
/// `kvcache.gpustack.ai/drop-cached-data` its release waits for the master to evict them (the
/// objects' lease is minutes), and its backend's Pods keep the nodes' memory from the tests
/// that run meanwhile.
async fn remove_binding(client: &Client, namespace: &str) -> Result<(), Error> {
    let api = Api::<KVCachePoolBinding>::namespaced(client.clone(), namespace);
    walkthrough::drop_cached_data(&api, namespace).await?;
    api.delete(namespace, &DeleteParams::default()).await?;
    Ok(())
}

/// What the Binding was granted (`status.effectiveQuota`), in bytes.
fn effective(b: &KVCachePoolBinding) -> Option<u64> {
    b.status
        .as_ref()
        .and_then(|s| s.effective_quota.as_ref())
        .and_then(|q| parse_bytes(&q.0).ok())
}

/// A pool on `backend` with `total`, and one Binding per `(namespace, domain, ceiling)` (named
/// after its namespace; `None`: the domain's name left out, so `default`).
async fn pool_with_bindings(
    client: &Client,
    backend: &str,
    total: &str,
    bindings: &[(&str, Option<&str>, &str)],
) -> Result<(), Error> {
    let pool: KVCachePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
        "metadata": {"name": backend},
        "spec": {"backends": [backend], "quota": {"total": total}},
    }))
    .expect("a pool");
    let pp = PatchParams::apply(walkthrough::MANAGER).force();
    Api::<KVCachePool>::all(client.clone())
        .patch(backend, &pp, &Patch::Apply(&pool))
        .await?;
    for (ns, domain, ceiling) in bindings {
        walkthrough::ensure_namespace(client, ns).await?;
        let mut d = serde_json::json!({"blockSize": 64, "dtype": "bfloat16"});
        if let Some(n) = domain {
            d["name"] = (*n).into();
        }
        let b: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": ns, "namespace": ns},
            "spec": {"poolRef": {"name": backend}, "quota": {"ceiling": ceiling}, "domain": d},
        }))
        .expect("a Binding");
        Api::<KVCachePoolBinding>::namespaced(client.clone(), ns)
            .patch(ns, &pp, &Patch::Apply(&b))
            .await?;
    }
    Ok(())
}

/// Waits until the Binding in `ns` (named after it) reads `QuotaGranted=True/<reason>` with
/// `bytes` effective.
async fn wait_granted(
    client: &Client,
    ns: &str,
    reason: &str,
    bytes: u64,
) -> Result<KVCachePoolBinding, Error> {
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
    let granted = format!("QuotaGranted=True/{reason}");
    wait_object(
        &bindings,
        ns,
        &format!("{granted} with {bytes} bytes effective"),
        WAIT,
        |b| has_condition(b, &granted) && effective(b) == Some(bytes),
    )
    .await
}

/// Deletes the Bindings, the pool and the backend of a quota test, without waiting.
async fn remove_pool_and_backend(
    client: &Client,
    backend: &str,
    namespaces: &[&str],
) -> Result<(), Error> {
    for ns in namespaces {
        remove_binding(client, ns).await?;
    }
    Api::<KVCachePool>::all(client.clone())
        .delete(backend, &DeleteParams::default())
        .await?;
    remove_backend(client, backend).await
}
