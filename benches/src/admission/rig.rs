//! What both admission benches run on: the control plane, the store, the fixtures and the
//! operator, the webhook configurations registered or not, and the objects they create.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{ControlPlane, Options, client_from, crds_dir, install_crds};
use kvcache_e2e::operator::{Operator, register_webhooks};
use kvcache_e2e::paths;
use kvcache_e2e::store::{Master, Member};

const OPERATOR_NS: &str = "kvcache-bench";

pub(super) const NAMESPACES: usize = 20;

const SEGMENT: u64 = 256 << 20;

const CONFIGURATION: &str = "kvcache-operator";

pub(super) fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> anyhow::Result<K> {
    Ok(serde_json::from_value(v)?)
}

/// What both admission benches run on: a loopback control plane, a real multi-tenant master
/// with one member as the pool's external backend (the pool reads its ledger and publishes the
/// address the injection writes), the fixtures, and the release operator with its webhook.
pub(super) struct Rig {
    pub(super) cp: ControlPlane,
    pub(super) kc: PathBuf,
    pub(super) master: Master,
    pub(super) member: Member,
    pub(super) operator: Operator,
    pub(super) port: u16,
    pub(super) base: String,
}

pub(super) fn rig(scratch: &str) -> anyhow::Result<Rig> {
    paths::use_release_builds();
    paths::operator_bin()?;
    let dir = paths::scratch(scratch)?;
    let cp = ControlPlane::start(&dir, &Options::default())?;
    let kc = cp.kubeconfig.clone();
    let (master, member) =
        kvcache_e2e::store::multi_tenant_store(&dir, "store", SEGMENT, Duration::from_secs(120))?;
    let (client_addr, admin_addr) = (
        master.address(),
        format!("127.0.0.1:{}", master.metrics_port),
    );
    let port = kvcache_e2e::process::free_port()?;
    let base = format!("https://127.0.0.1:{port}");
    block_on(create_fixtures(kc.clone(), client_addr, admin_addr))??;
    let operator = Operator::builder(&kc, OPERATOR_NS)
        .extra(&[
            format!("--webhook-addr=127.0.0.1:{port}"),
            "--webhook-name=127.0.0.1".into(),
        ])
        .start(&dir)?;
    Ok(Rig {
        cp,
        kc,
        master,
        member,
        operator,
        port,
        base,
    })
}

/// What every round needs before the operator starts: the CRDs, the namespaces, the external
/// backend over the master and its pool, and the Binding each Pod namespace's Pods name.
async fn create_fixtures(
    kc: PathBuf,
    client_addr: String,
    admin_addr: String,
) -> anyhow::Result<()> {
    let client = client_from(&kc).await?;
    install_crds(&client, &crds_dir()).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let pp = PatchParams::apply("bench-admission").force();
    let all = std::iter::once(OPERATOR_NS.to_owned()).chain(
        ["without", "with", "pods-without", "pods-with"]
            .iter()
            .flat_map(|s| (0..NAMESPACES).map(move |i| format!("{s}-{i:02}"))),
    );
    for name in all {
        let o: Namespace = object(
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        )?;
        namespaces.patch(&name, &pp, &Patch::Apply(&o)).await?;
    }
    let backend: KVCacheBackend = object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "store"},
        "spec": {"type": "Mooncake", "connection": {"external": {"endpoints": [
            {"name": "Client", "address": client_addr}, {"name": "Admin", "address": admin_addr}]}}}
    }))?;
    Api::<KVCacheBackend>::all(client.clone())
        .patch("store", &pp, &Patch::Apply(&backend))
        .await?;
    let pool: KVCachePool = object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "pool"},
        "spec": {"backends": ["store"], "quota": {"total": "1Gi"}}
    }))?;
    Api::<KVCachePool>::all(client.clone())
        .patch("pool", &pp, &Patch::Apply(&pool))
        .await?;
    // The Bindings the Pods name, one per Pod namespace.
    for side in ["pods-without", "pods-with"] {
        for i in 0..NAMESPACES {
            let ns = format!("{side}-{i:02}");
            Api::<KVCachePoolBinding>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &binding(&ns, "b-0000")?)
                .await?;
        }
    }
    Ok(())
}

/// Waits until the pool publishes its client endpoint.
pub(super) async fn wait_client_endpoint(kc: PathBuf) -> anyhow::Result<()> {
    let client = client_from(&kc).await?;
    kvcache_e2e::cluster::wait_object(
        &Api::<KVCachePool>::all(client),
        "pool",
        "the pool's client endpoint",
        Duration::from_secs(120),
        |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.client_endpoint.is_some())
        },
    )
    .await?;
    Ok(())
}

pub(super) async fn unregister(client: &kube::Client) -> anyhow::Result<()> {
    let dp = DeleteParams::default();
    for r in [
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(CONFIGURATION, &dp)
            .await
            .map(drop),
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(CONFIGURATION, &dp)
            .await
            .map(drop),
    ] {
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Registers the configurations and waits until the operator wrote their `caBundle` and a
/// dry-run create is answered by the webhook (its warning-free admission of a pool).
pub(super) async fn register(client: &kube::Client, base: &str) -> anyhow::Result<()> {
    register_webhooks(client, OPERATOR_NS, base, true).await?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let v = validating.get(CONFIGURATION).await?;
        let m = mutating.get(CONFIGURATION).await?;
        let trusted = v
            .webhooks
            .iter()
            .flatten()
            .all(|w| w.client_config.ca_bundle.is_some())
            && m.webhooks
                .iter()
                .flatten()
                .all(|w| w.client_config.ca_bundle.is_some());
        if trusted {
            let probe: KVCachePool = object(serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "probe"},
                "spec": {"backends": ["store"], "quota": {"total": "1Gi"}}
            }))?;
            let dry = PostParams {
                dry_run: true,
                ..Default::default()
            };
            if Api::<KVCachePool>::all(client.clone())
                .create(&dry, &probe)
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the webhook configurations were not trusted and answering within 120 s (caBundle written: {trusted})"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) fn binding(ns: &str, name: &str) -> anyhow::Result<KVCachePoolBinding> {
    object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"poolRef": {"name": "pool"}, "quota": {"ceiling": "256Ki"},
                 "domain": {"name": format!("{ns}-{name}"), "blockSize": 64, "dtype": "bfloat16"}}
    }))
}

/// An engine Pod opted in to injection on the namespace's first Binding (it is never scheduled:
/// the control plane has no nodes; its create is what is measured).
pub(super) fn engine_pod(ns: &str, name: &str) -> anyhow::Result<Pod> {
    object(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"kvcache.gpustack.ai/inject": "true"},
            "annotations": {"kvcache.gpustack.ai/binding": "b-0000", "kvcache.gpustack.ai/engine": "vLLM"}},
        "spec": {"containers": [{"name": "engine", "image": "gpustack/runner:cpu-vllm0.29.0",
            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]}]}
    }))
}

/// [`engine_pod`] on the Binding `binding`.
pub(super) fn engine_pod_on(ns: &str, name: &str, binding: &str) -> anyhow::Result<Pod> {
    let mut pod = engine_pod(ns, name)?;
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("kvcache.gpustack.ai/binding".into(), binding.into());
    Ok(pod)
}
