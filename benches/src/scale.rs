//! `cargo xtask bench scale`: the operator (release build) against a real API server with many
//! objects: 10 external backends (one real multi-tenant master with one member each, on
//! loopback), 10 pools, and Bindings and ModelDeployments spread over namespaces. Reports the
//! time from a cold start to everything converged, the operator's resident memory at rest,
//! and how many reconciles one Binding ceiling edit triggers, by controller.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kvcache_api::{InstanceType, KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{ControlPlane, Options, client_from, crds_dir, install_crds};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::status::has_condition;
use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions};
use kvcache_e2e::{Watched, paths};

/// The sizes `cargo xtask bench scale` runs at (its `--backends`, `--namespaces` and
/// `--per-namespace`).
pub struct Shape {
    /// Backends (one master each) and as many pools.
    pub backends: usize,
    /// Namespaces (`team-000`, …) the Bindings and ModelDeployments are spread over.
    pub namespaces: usize,
    /// Bindings (and as many ModelDeployments) per namespace.
    pub per_namespace: usize,
}

const MANAGER: &str = "bench-scale";
const CEILING: &str = "256Ki";
const EDITED: &str = "512Ki";
const SEGMENT: u64 = 256 << 20;
const OPERATOR_NS: &str = "gpustack-system";

/// Runs `f` on a runtime of its own (the harness's `block_on` is for its own error type).
fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

fn ns_name(i: usize) -> String {
    format!("team-{i:03}")
}

fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> anyhow::Result<K> {
    Ok(serde_json::from_value(v)?)
}

async fn apply<K: Watched + serde::Serialize>(
    api: &Api<K>,
    name: &str,
    obj: &K,
) -> anyhow::Result<()> {
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await?;
    Ok(())
}

/// `reconciles` counters by controller from the operator's `/metrics`.
fn reconciles(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, value) in kvcache_e2e::store::samples(text, "kvcache_operator_reconciles_total") {
        let controller = labels.get("controller").cloned().unwrap_or_default();
        *out.entry(controller).or_insert(0.0) += value;
    }
    out
}

fn diff(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), (v - before.get(k).unwrap_or(&0.0)) as u64))
        .collect()
}

fn resident_kib(pid: u32) -> anyhow::Result<u64> {
    kvcache_e2e::process::resident_kib(pid)
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// A cache of `K` kept by a watch (one LIST, then events): the benchmark reads its counts from
/// here, so that observing convergence costs the API server little.
fn watched<K: Watched>(api: Api<K>) -> kube::runtime::reflector::Store<K> {
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (reader, writer) = reflector::store();
    tokio::spawn(
        reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .for_each(|_| futures::future::ready(())),
    );
    reader
}

/// How many Bindings are granted and how many ModelDeployments have their domain registered.
fn converged(
    bindings: &kube::runtime::reflector::Store<KVCachePoolBinding>,
    models: &kube::runtime::reflector::Store<ModelDeployment>,
) -> (usize, usize) {
    let b = bindings
        .state()
        .iter()
        .filter(|b| {
            has_condition::<KVCachePoolBinding>(b, "QuotaGranted=True")
                && b.status
                    .as_ref()
                    .is_some_and(|s| s.effective_quota.is_some())
        })
        .count();
    let m = models
        .state()
        .iter()
        .filter(|m| {
            has_condition::<ModelDeployment>(m, "DomainRegistered=True")
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.observed_generation == m.metadata.generation)
        })
        .count();
    (b, m)
}

/// Waits until the operator's reconcile counters hold still for `quiet`.
fn settle(operator: &Operator, quiet: Duration, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    let mut last = reconciles(&operator.metrics()?);
    let mut since = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now = reconciles(&operator.metrics()?);
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return Ok(());
        }
    }
    anyhow::bail!(
        "the operator's reconcile counters never held still for {quiet:?} within {limit:?}"
    )
}

pub fn scale(shape: Shape) -> anyhow::Result<()> {
    paths::use_release_builds();
    // Built now, so that the cold start below measures the operator, not the compiler.
    paths::operator_bin()?;
    let dir = paths::scratch("bench-scale")?;
    let cp = ControlPlane::start(&dir, &Options::default())?;
    let kc = cp.kubeconfig.clone();
    let total = shape.namespaces * shape.per_namespace;
    println!(
        "scale: {} backends, {} pools, {total} Bindings and {total} ModelDeployments in {} namespaces",
        shape.backends, shape.backends, shape.namespaces
    );
    let stores = start_stores(&dir, shape.backends)?;
    let endpoints: Vec<(String, String)> = stores
        .iter()
        .map(|(m, _)| (m.address(), format!("127.0.0.1:{}", m.metrics_port)))
        .collect();

    // Every object, before the operator starts (a cold start).
    let t = Instant::now();
    block_on(create_objects(kc.clone(), &shape, endpoints))??;
    println!("created every object in {:.1}s", t.elapsed().as_secs_f64());

    // Cold start: from launching the operator to every Binding granted and every
    // ModelDeployment registered (watched; counted every second).
    let t = Instant::now();
    // Periodic work stretched to 10 minutes (store polls, ledger re-reads, ModelDeployment
    // resyncs), so that what an edit triggers is told apart from what a timer does.
    let operator = Operator::builder(&kc, OPERATOR_NS)
        .extra(&[
            "--store-poll-stable=10m".into(),
            "--ledger-interval=10m".into(),
            "--model-resync=10m".into(),
        ])
        .start(&dir)?;
    let convergence = block_on(wait_converged(kc.clone(), total, t))??;
    println!(
        "converged {:.1}s after the operator started",
        convergence.as_secs_f64()
    );

    // At rest: the reconcile counters hold still for 10 s (the timers are stretched to 10
    // minutes, so only what converging started is still draining until then).
    let settled = Instant::now();
    settle(&operator, Duration::from_secs(10), Duration::from_secs(600))?;
    println!(
        "at rest {:.1}s after converging",
        settled.elapsed().as_secs_f64()
    );
    let rss = resident_kib(operator.proc.pid())?;
    println!("operator RSS at rest: {:.1} MiB", rss as f64 / 1024.0);
    for (kind, count, bytes) in block_on(cached_bytes(kc.clone()))?? {
        println!(
            "cached {kind}: {count} objects, {:.1} MiB as JSON without managedFields ({} B each on average)",
            bytes as f64 / 1048576.0,
            bytes / count.max(1) as u64
        );
    }

    // A quiet window of the same length as the edit's, to tell periodic work from the edit's.
    let window = Duration::from_secs(20);
    let before_quiet = reconciles(&operator.metrics()?);
    std::thread::sleep(window);
    let quiet = diff(&reconciles(&operator.metrics()?), &before_quiet);

    let before = reconciles(&operator.metrics()?);
    let t = Instant::now();
    block_on(edit_one_ceiling(kc.clone()))??;
    let granted = t.elapsed();
    std::thread::sleep(window.saturating_sub(granted));
    let edit = diff(&reconciles(&operator.metrics()?), &before);
    println!(
        "the edited grant read back after {:.2}s",
        granted.as_secs_f64()
    );

    print_figures(
        &shape,
        &Figures {
            convergence,
            rss_kib: rss,
            granted,
            window,
            edit,
            quiet,
        },
    );
    drop(operator);
    drop(stores);
    drop(cp);
    Ok(())
}

/// What the operator's caches hold, kind by kind (the kinds `kvcache-operator`'s context
/// reflects): how many objects and their JSON bytes as cached (`managedFields` dropped). A
/// measure of the data behind the resting RSS, not of its in-memory form.
async fn cached_bytes(kc: PathBuf) -> anyhow::Result<Vec<(&'static str, usize, u64)>> {
    async fn kind<K: Watched + serde::Serialize>(
        api: Api<K>,
        name: &'static str,
    ) -> anyhow::Result<(&'static str, usize, u64)> {
        let mut listed = api.list(&Default::default()).await?.items;
        let mut bytes = 0u64;
        for o in &mut listed {
            o.meta_mut().managed_fields = None;
            bytes += serde_json::to_vec(o)?.len() as u64;
        }
        Ok((name, listed.len(), bytes))
    }
    let client = client_from(&kc).await?;
    Ok(vec![
        kind(
            Api::<KVCachePoolBinding>::all(client.clone()),
            "KVCachePoolBinding",
        )
        .await?,
        kind(
            Api::<ModelDeployment>::all(client.clone()),
            "ModelDeployment",
        )
        .await?,
        kind(Api::<KVCachePool>::all(client.clone()), "KVCachePool").await?,
        kind(Api::<KVCacheBackend>::all(client.clone()), "KVCacheBackend").await?,
        kind(Api::<InstanceType>::all(client.clone()), "InstanceType").await?,
    ])
}

/// The stores: one multi-tenant master with one member each, starting with no tenant, each
/// waited for until its member's segment is registered.
fn start_stores(dir: &Path, backends: usize) -> anyhow::Result<Vec<(Master, Member)>> {
    let mut stores: Vec<(Master, Member)> = Vec::new();
    for i in 0..backends {
        let d = dir.join(format!("store-{i}"));
        std::fs::create_dir_all(&d)?;
        let file = d.join("tenant-quota-policy.yaml");
        std::fs::write(
            &file,
            kvcache_quota::policy::render(&format!("store-{i}"), &[])?.to_yaml(),
        )?;
        let master = Master::start(&d, MasterOptions::multi_tenant(&file))?;
        let member = Member::start(&d, &MemberOptions::new(master.address(), SEGMENT))?;
        master.wait_capacity(SEGMENT, Duration::from_secs(120))?;
        stores.push((master, member));
    }
    Ok(stores)
}

/// The CRDs and every object: the namespaces, one InstanceType, an external backend over each
/// store with its pool, then the Bindings and ModelDeployments (16 at a time).
async fn create_objects(
    kc: PathBuf,
    shape: &Shape,
    endpoints: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let client = client_from(&kc).await?;
    install_crds(&client, &crds_dir()).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for n in std::iter::once(OPERATOR_NS.to_owned()).chain((0..shape.namespaces).map(ns_name)) {
        apply(&namespaces, &n, &object(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))?).await?;
    }
    apply(&Api::<InstanceType>::all(client.clone()), "cpu-small", &object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "InstanceType", "metadata": {"name": "cpu-small"},
        "spec": {"resources": {"cpu": "100m", "memory": "128Mi"}}
    }))?).await?;
    for (i, (client_addr, admin_addr)) in endpoints.iter().enumerate() {
        apply(&Api::<KVCacheBackend>::all(client.clone()), &format!("store-{i}"), &object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": format!("store-{i}")},
            "spec": {"type": "Mooncake", "connection": {"external": {"endpoints": [
                {"name": "Client", "address": client_addr}, {"name": "Admin", "address": admin_addr}
            ]}}}
        }))?).await?;
        apply(&Api::<KVCachePool>::all(client.clone()), &format!("pool-{i}"), &object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": format!("pool-{i}")},
            "spec": {"backends": [format!("store-{i}")], "quota": {"total": "1Gi"}}
        }))?).await?;
    }
    let (per, backends) = (shape.per_namespace, shape.backends);
    let work: Vec<(usize, usize)> = (0..shape.namespaces)
        .flat_map(|n| (0..per).map(move |j| (n, j)))
        .collect();
    futures::stream::iter(work)
        .map(|(n, j)| create_binding_and_model(client.clone(), n, j, (n * per + j) % backends))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Binding `j` of namespace `n` on pool `pool`, and the ModelDeployment that names it.
async fn create_binding_and_model(
    client: kube::Client,
    n: usize,
    j: usize,
    pool: usize,
) -> anyhow::Result<()> {
    let ns = ns_name(n);
    apply(&Api::<KVCachePoolBinding>::namespaced(client.clone(), &ns), &format!("binding-{j:02}"), &object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": format!("binding-{j:02}"), "namespace": ns},
        "spec": {"poolRef": {"name": format!("pool-{pool}")}, "quota": {"ceiling": CEILING},
                 "domain": {"name": format!("{ns}-{j:02}"), "blockSize": 64, "dtype": "bfloat16"}}
    }))?).await?;
    apply(&Api::<ModelDeployment>::namespaced(client.clone(), &ns), &format!("model-{j:02}"), &object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
        "metadata": {"name": format!("model-{j:02}"), "namespace": ns},
        "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "engine": {"name": "vLLM", "version": "0.29.0"},
                 "kvCache": {"poolRef": {"name": format!("binding-{j:02}")}},
                 "roles": [{"name": "server", "replicas": 0, "instanceType": "cpu-small"}]}
    }))?).await?;
    Ok(())
}

/// Waits (30 minutes at most) until all `total` Bindings are granted and all `total`
/// ModelDeployments registered, counted every second from watched caches; returns the time
/// since `started`.
async fn wait_converged(kc: PathBuf, total: usize, started: Instant) -> anyhow::Result<Duration> {
    let client = client_from(&kc).await?;
    let bindings = watched(Api::<KVCachePoolBinding>::all(client.clone()));
    let models = watched(Api::<ModelDeployment>::all(client.clone()));
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let (b, m) = converged(&bindings, &models);
        if b == total && m == total {
            return Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "not converged after 30 minutes: {b}/{total} Bindings granted, {m}/{total} ModelDeployments registered"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Raises the first Binding's ceiling and waits until its grant reads back the new figure.
async fn edit_one_ceiling(kc: PathBuf) -> anyhow::Result<()> {
    let client = client_from(&kc).await?;
    let api: Api<KVCachePoolBinding> = Api::namespaced(client, &ns_name(0));
    api.patch(
        "binding-00",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"quota": {"ceiling": EDITED}}})),
    )
    .await?;
    kvcache_e2e::cluster::wait_object(
        &api,
        "binding-00",
        "the edited grant read back",
        Duration::from_secs(120),
        |b| {
            b.status
                .as_ref()
                .and_then(|s| s.effective_quota.as_ref())
                .and_then(|q| kvcache_api::quantity::parse_bytes(&q.0).ok())
                == Some(512 << 10)
        },
    )
    .await?;
    Ok(())
}

/// What the benchmark measured.
struct Figures {
    /// From the operator's start to everything converged.
    convergence: Duration,
    /// The operator's resident memory at rest.
    rss_kib: u64,
    /// From the ceiling edit to the grant read back.
    granted: Duration,
    /// The window the reconciles are counted in.
    window: Duration,
    /// Reconciles by controller in the window of the edit.
    edit: BTreeMap<String, u64>,
    /// Reconciles by controller in a window without an edit.
    quiet: BTreeMap<String, u64>,
}

/// The figures as the table of benches/README.md ("scale").
fn print_figures(shape: &Shape, f: &Figures) {
    let total = shape.namespaces * shape.per_namespace;
    println!();
    println!(
        "| {total} Bindings + {total} ModelDeployments, {} namespaces, {} backends | figure | goal |",
        shape.namespaces, shape.backends
    );
    println!("|---|---|---|");
    println!(
        "| cold start to converged | {:.1} s | |",
        f.convergence.as_secs_f64()
    );
    println!(
        "| operator RSS at rest (release) | {:.1} MiB | under 48 MiB |",
        f.rss_kib as f64 / 1024.0
    );
    println!(
        "| one ceiling edit: grant read back | {:.2} s | |",
        f.granted.as_secs_f64()
    );
    for (controller, n) in &f.edit {
        let q = f.quiet.get(controller).copied().unwrap_or(0);
        println!(
            "| one ceiling edit: {controller} reconciles in {}s (same window, no edit: {q}) | {n} | Binding, its pool, its ModelDeployments |",
            f.window.as_secs()
        );
    }
}
