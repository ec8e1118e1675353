//! `cargo xtask bench admission`: the webhook's cost, through a real API server. Bindings and
//! injected Pods are created at a fixed concurrency twice in one run, once with the webhook
//! configurations registered and once without (the same operator runs both times, so only the
//! admission call differs); reported: the end-to-end create latencies of both and their ratio,
//! and the handler's own p50/p99 from the operator's histogram; then where the added time goes,
//! in means: the API server's own timing of its calls to the webhooks
//! (`apiserver_admission_webhook_admission_duration_seconds`), the handler's share of a call,
//! and the rest of what a create with the webhook adds.
//!
//! The order is Bindings without, Bindings with, Pods without, Pods with: each pair runs
//! back to back on a store (etcd) of the same size within a few percent.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{ControlPlane, Options, client_from, crds_dir, install_crds};
use kvcache_e2e::operator::{Operator, register_webhooks};
use kvcache_e2e::store::{Master, Member};
use kvcache_e2e::{Watched, paths};
use kvcache_render::exposition::{Exposition, Sample};

/// The load `cargo xtask bench admission` applies (its `--creates` and `--concurrency`).
pub struct Shape {
    /// Bindings created per round (and as many Pods).
    pub creates: usize,
    /// Requests in flight.
    pub concurrency: usize,
}

const OPERATOR_NS: &str = "kvcache-bench";
const NAMESPACES: usize = 20;
const SEGMENT: u64 = 256 << 20;
const CONFIGURATION: &str = "kvcache-operator";

fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> anyhow::Result<K> {
    Ok(serde_json::from_value(v)?)
}

/// The `q` quantile of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The value of `s`'s label `name`.
fn label<'a>(s: &'a Sample, name: &str) -> Option<&'a str> {
    s.labels
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// One webhook's buckets from `/metrics`: (upper bound in seconds, cumulative count).
fn buckets(text: &str, webhook: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for s in Exposition::parse(text).samples {
        if s.name != "kvcache_operator_webhook_request_duration_seconds_bucket"
            || label(&s, "webhook") != Some(webhook)
        {
            continue;
        }
        // `+Inf` reads as infinity.
        let Some(Ok(le)) = label(&s, "le").map(str::parse::<f64>) else {
            continue;
        };
        // Outcomes (allowed, refused, ...) are summed per bound.
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some(slot) => slot.1 += s.value,
            None => out.push((le, s.value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

fn minus(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map(|(_, m)| *m)
                .unwrap_or(0.0);
            (*le, n - was)
        })
        .collect()
}

/// The `_sum` and `_count` of the histogram `metric` in Prometheus text, added over the series
/// whose labels hold every `(name, value)` of `with`.
fn sum_count(text: &str, metric: &str, with: &[(&str, &str)]) -> (f64, f64) {
    let (sum, count) = (format!("{metric}_sum"), format!("{metric}_count"));
    let mut out = (0.0, 0.0);
    for s in Exposition::parse(text).samples {
        let slot = if s.name == sum {
            &mut out.0
        } else if s.name == count {
            &mut out.1
        } else {
            continue;
        };
        if with
            .iter()
            .all(|(name, want)| label(&s, name) == Some(*want))
        {
            *slot += s.value;
        }
    }
    out
}

/// What the operator's webhook server refused so far, by reason, from its `/metrics` and the
/// counter `metric`: `reason count, ...`.
fn refusals(text: &str, metric: &str) -> String {
    Exposition::parse(text)
        .samples
        .iter()
        .filter(|s| s.name == metric && label(s, "server") == Some("webhook"))
        .filter_map(|s| Some(format!("{} {}", label(s, "reason")?, s.value)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The mean of the samples added between two `(sum, count)` readings, in seconds.
fn mean_between(after: (f64, f64), before: (f64, f64)) -> Option<f64> {
    let n = after.1 - before.1;
    (n > 0.0).then(|| (after.0 - before.0) / n)
}

/// The API server's `/metrics` (its own timing of admission webhook calls).
async fn apiserver_metrics(client: &kube::Client) -> anyhow::Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// The API server's timing of its webhook calls on create, and the handler's own (its
/// histogram's buckets and its sum and count), read before and after the creates with the
/// webhook: one reading of each `/metrics`.
struct Calls {
    apiserver: (f64, f64),
    handler: (f64, f64),
    buckets: Vec<(f64, f64)>,
}

impl Calls {
    async fn read(
        client: &kube::Client,
        operator: &Operator,
        webhook: &str,
    ) -> anyhow::Result<Self> {
        let handler = operator.metrics()?;
        Ok(Calls {
            apiserver: sum_count(
                &apiserver_metrics(client).await?,
                "apiserver_admission_webhook_admission_duration_seconds",
                &[("operation", "CREATE")],
            ),
            handler: sum_count(
                &handler,
                "kvcache_operator_webhook_request_duration_seconds",
                &[("webhook", webhook)],
            ),
            buckets: buckets(&handler, webhook),
        })
    }
}

/// A quantile from cumulative buckets, interpolated linearly inside the bucket it falls in
/// (as Prometheus' `histogram_quantile` does).
fn bucket_quantile(b: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in b {
        if n >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = if n > lower.1 {
                (rank - lower.1) / (n - lower.1)
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, n);
    }
    None
}

/// Creates `n` objects made by `make(i)` at `concurrency`, returning each create's latency.
async fn timed<K, F>(
    apis: &[Api<K>],
    n: usize,
    concurrency: usize,
    make: F,
) -> anyhow::Result<Vec<Duration>>
where
    K: Watched + serde::Serialize,
    F: Fn(usize) -> anyhow::Result<K>,
{
    let objects: Vec<(usize, K)> = (0..n)
        .map(|i| make(i).map(|o| (i, o)))
        .collect::<anyhow::Result<_>>()?;
    let mut out: Vec<Duration> = futures::stream::iter(objects)
        .map(|(i, o)| {
            let api = apis[i % apis.len()].clone();
            async move {
                let t = Instant::now();
                api.create(&PostParams::default(), &o).await?;
                anyhow::Ok(t.elapsed())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect()
        .await?;
    out.sort();
    Ok(out)
}

async fn unregister(client: &kube::Client) -> anyhow::Result<()> {
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
async fn register(client: &kube::Client, base: &str) -> anyhow::Result<()> {
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

fn binding(ns: &str, name: &str) -> anyhow::Result<KVCachePoolBinding> {
    object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"poolRef": {"name": "pool"}, "quota": {"ceiling": "256Ki"},
                 "domain": {"name": format!("{ns}-{name}"), "blockSize": 64, "dtype": "bfloat16"}}
    }))
}

/// An engine Pod opted in to injection on the namespace's first Binding (it is never scheduled:
/// the control plane has no nodes; its create is what is measured).
fn engine_pod(ns: &str, name: &str) -> anyhow::Result<Pod> {
    object(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"kvcache.gpustack.ai/inject": "true"},
            "annotations": {"kvcache.gpustack.ai/binding": "b-0000", "kvcache.gpustack.ai/engine": "vLLM"}},
        "spec": {"containers": [{"name": "engine", "image": "gpustack/runner:cpu-vllm0.29.0",
            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]}]}
    }))
}

/// One kind of create, measured both ways.
struct Round {
    /// Each create's latency without the webhook, sorted.
    without: Vec<Duration>,
    /// Each create's latency with the webhook, sorted.
    with: Vec<Duration>,
    /// The handler's histogram buckets over the creates with the webhook.
    handler: Vec<(f64, f64)>,
    /// The API server's and the handler's timings before and after the creates with it.
    calls: (Calls, Calls),
}

/// What both admission benches run on: a loopback control plane, a real multi-tenant master
/// with one member as the pool's external backend (the pool reads its ledger and publishes the
/// address the injection writes), the fixtures, and the release operator with its webhook.
struct Rig {
    cp: ControlPlane,
    kc: PathBuf,
    master: Master,
    member: Member,
    operator: Operator,
    port: u16,
    base: String,
}

fn rig(scratch: &str) -> anyhow::Result<Rig> {
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

pub fn admission(shape: Shape) -> anyhow::Result<()> {
    println!(
        "admission: {n} Binding creates and {n} injected Pod creates at {c} concurrent, with and without the webhook",
        n = shape.creates,
        c = shape.concurrency
    );
    let Rig {
        cp,
        kc,
        master,
        member,
        operator,
        port: _,
        base,
    } = rig("bench-admission")?;
    // The pool's client endpoint (the injection needs it) before anything is measured.
    block_on(wait_client_endpoint(kc.clone()))??;
    let rounds = block_on(async {
        let client = client_from(&kc).await?;
        anyhow::Ok(vec![
            (
                "Binding create",
                binding_round(&client, &operator, &base, &shape).await?,
            ),
            (
                "injected Pod create",
                pod_round(&client, &operator, &base, &shape).await?,
            ),
        ])
    })??;
    print_rounds(&shape, &rounds);
    drop(operator);
    drop(member);
    drop(master);
    drop(cp);
    Ok(())
}

/// The namespace of create `i` on `side` (creates spread over [`NAMESPACES`] namespaces).
fn ns(side: &str, i: usize) -> String {
    format!("{side}-{:02}", i % NAMESPACES)
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
async fn wait_client_endpoint(kc: PathBuf) -> anyhow::Result<()> {
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

/// The APIs of `K` in every namespace of `side`.
fn apis<K: Watched + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>>(
    client: &kube::Client,
    side: &str,
) -> Vec<Api<K>> {
    (0..NAMESPACES)
        .map(|i| Api::namespaced(client.clone(), &ns(side, i)))
        .collect()
}

/// Bindings created without the webhook, then with it, and the `validate` handler's histogram
/// over the second.
async fn binding_round(
    client: &kube::Client,
    operator: &Operator,
    base: &str,
    shape: &Shape,
) -> anyhow::Result<Round> {
    let (n, c) = (shape.creates, shape.concurrency);
    unregister(client).await?;
    let without = timed(&apis(client, "without"), n, c, |i| {
        binding(&ns("without", i), &format!("b-{:04}", i / NAMESPACES + 1))
    })
    .await?;
    register(client, base).await?;
    let before = Calls::read(client, operator, "validate").await?;
    let with = timed(&apis(client, "with"), n, c, |i| {
        binding(&ns("with", i), &format!("b-{:04}", i / NAMESPACES + 1))
    })
    .await?;
    let after = Calls::read(client, operator, "validate").await?;
    let handler = minus(&after.buckets, &before.buckets);
    let calls = (before, after);
    Ok(Round {
        without,
        with,
        handler,
        calls,
    })
}

/// Engine Pods created without the webhook, then with it (each one checked injected), and the
/// `inject` handler's histogram over the second.
async fn pod_round(
    client: &kube::Client,
    operator: &Operator,
    base: &str,
    shape: &Shape,
) -> anyhow::Result<Round> {
    let (n, c) = (shape.creates, shape.concurrency);
    unregister(client).await?;
    let without = timed(&apis::<Pod>(client, "pods-without"), n, c, |i| {
        engine_pod(&ns("pods-without", i), &format!("engine-{i:05}"))
    })
    .await?;
    register(client, base).await?;
    let before = Calls::read(client, operator, "inject").await?;
    let with = timed(&apis::<Pod>(client, "pods-with"), n, c, |i| {
        engine_pod(&ns("pods-with", i), &format!("engine-{i:05}"))
    })
    .await?;
    let after = Calls::read(client, operator, "inject").await?;
    let handler = minus(&after.buckets, &before.buckets);
    let calls = (before, after);
    // Each Pod was injected (the annotation the webhook writes), else the round measured
    // nothing.
    let sample = Api::<Pod>::namespaced(client.clone(), &ns("pods-with", 0))
        .get("engine-00000")
        .await?;
    let injected = sample
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kvcache.gpustack.ai/injected"));
    anyhow::ensure!(
        injected,
        "a Pod created with the webhook registered was not injected"
    );
    Ok(Round {
        without,
        with,
        handler,
        calls,
    })
}

/// The rounds as the table of benches/README.md ("admission").
fn print_rounds(shape: &Shape, rounds: &[(&str, Round)]) {
    let (n, c) = (shape.creates, shape.concurrency);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!();
    println!(
        "| {n} creates at {c} concurrent | without webhook p50 / p99 | with webhook p50 / p99 | ratio (p50, p99) | handler p50 / p99 (histogram) | goal |"
    );
    println!("|---|---|---|---|---|---|");
    for (what, r) in rounds {
        let (a50, a99) = (quantile(&r.without, 0.5), quantile(&r.without, 0.99));
        let (b50, b99) = (quantile(&r.with, 0.5), quantile(&r.with, 0.99));
        let h = |q| {
            bucket_quantile(&r.handler, q)
                .map(|s| format!("{:.2} ms", s * 1000.0))
                .unwrap_or_else(|| "none recorded".into())
        };
        println!(
            "| {what} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.2}x, {:.2}x | {} / {} | handler p99 < 5 ms, creates <= 1.3x |",
            ms(a50),
            ms(a99),
            ms(b50),
            ms(b99),
            ms(b50) / ms(a50).max(f64::EPSILON),
            ms(b99) / ms(a99).max(f64::EPSILON),
            h(0.5),
            h(0.99),
        );
    }
    println!();
    println!(
        "| {n} creates at {c} concurrent, means | added per create | the API server's webhook calls per create | the handler's share | the calls' transport and encoding | the rest of the added time |"
    );
    println!("|---|---|---|---|---|---|");
    for (what, r) in rounds {
        let mean = |d: &[Duration]| {
            d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len().max(1) as f64
        };
        let added = mean(&r.with) - mean(&r.without);
        let (before, after) = &r.calls;
        // The API server calls each matching webhook once per create: its calls per create.
        let calls = (after.apiserver.0 - before.apiserver.0) / r.with.len().max(1) as f64;
        let handler = mean_between(after.handler, before.handler).unwrap_or(0.0);
        let text = |v: f64| format!("{:.1} ms", v * 1000.0);
        println!(
            "| {what} | {} | {} | {} | {} | {} |",
            text(added),
            text(calls),
            text(handler),
            text(calls - handler),
            text(added - calls),
        );
    }
}

/// `cargo xtask bench admission --flood`: the attacks of
/// `tests/tests/webhook.rs::a_flood_from_one_source_leaves_admission_to_everyone_else`, from
/// another loopback source address than the API server's, one after another: 600 connections
/// sending 1.5 MB of a 2 MB review at once and then a byte every 2 s (held 20 s), 600 idle
/// connections (15 s), 6,000 forged reviews at 32 at once (each naming a Binding that does not
/// exist: a live read each). Throughout each, injected Pods (dry run) and Bindings are created
/// one after another through the API server; reported per attack: their p50/p99 beside the
/// unloaded ones, what the operator refused (its counters) and its peak memory (`VmHWM`).
pub fn flood() -> anyhow::Result<()> {
    use kvcache_e2e::flood::{Target, forged, idle, peak_memory, slow_bodies};
    let Rig {
        cp,
        kc,
        master,
        member,
        operator,
        port,
        base,
    } = rig("bench-admission-flood")?;
    let pid = operator.proc.pid();
    block_on(wait_client_endpoint(kc.clone()))??;
    let target = Target {
        addr: format!("127.0.0.1:{port}").parse()?,
        source: "127.0.0.2".parse()?,
        path: "/mutate-pods",
    };
    let review = kvcache_e2e::flood::forged_review(
        "pods-with-00",
        serde_json::to_value(engine_pod_on("pods-with-00", "forged", "no-such-binding")?)?,
    );
    let rows = block_on(async {
        let client = client_from(&kc).await?;
        register(&client, &base).await?;
        let mut rows = Vec::new();
        let mut created = 0usize;
        let r = phase(&client, "unloaded", created, None).await?;
        created += r.4;
        rows.push((r, operator.metrics()?, peak_memory(pid)));
        let t = target.clone();
        let slow = tokio::spawn(async move {
            slow_bodies(
                &t,
                600,
                2_000_000,
                1_500_000,
                Duration::from_secs(2),
                Duration::from_secs(20),
            )
            .await
        });
        let r = phase(&client, "600 slow 2 MB bodies", created, Some(slow)).await?;
        created += r.4;
        rows.push((r, operator.metrics()?, peak_memory(pid)));
        let t = target.clone();
        let idle_flood = tokio::spawn(async move { idle(&t, 600, Duration::from_secs(15)).await });
        let r = phase(&client, "600 idle connections", created, Some(idle_flood)).await?;
        created += r.4;
        rows.push((r, operator.metrics()?, peak_memory(pid)));
        let t = target.clone();
        let forging = tokio::spawn(async move { forged(&t, 32, 6_000, &review).await });
        let r = phase(
            &client,
            "6,000 forged reviews, 32 at once",
            created,
            Some(forging),
        )
        .await?;
        rows.push((r, operator.metrics()?, peak_memory(pid)));
        anyhow::Ok(rows)
    })??;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!();
    println!(
        "| attack (from 127.0.0.2) | injected Pod p50 / p99 | Binding p50 / p99 | Pods / Bindings created | attack: opened / closed unanswered / refused / answers | operator refused so far (connections; requests) | operator peak memory so far |"
    );
    println!("|---|---|---|---|---|---|---|");
    for ((name, pods, bindings, tally, _), metrics, peak) in &rows {
        let refused = |metric: &str| refusals(metrics, metric);
        println!(
            "| {name} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {} / {} | {} | {}; {} | {} MiB |",
            ms(quantile(pods, 0.5)),
            ms(quantile(pods, 0.99)),
            ms(quantile(bindings, 0.5)),
            ms(quantile(bindings, 0.99)),
            pods.len(),
            bindings.len(),
            tally.as_ref().map_or("-".into(), |t| format!(
                "{} / {} / {} / {:?}",
                t.opened, t.closed, t.refused, t.statuses
            )),
            refused("kvcache_operator_connections_refused_total"),
            refused("kvcache_operator_requests_refused_total"),
            peak.map_or(0, |p| p >> 20),
        );
    }
    anyhow::ensure!(
        !rows.is_empty() && operator.proc.pid() == pid,
        "the operator was restarted during the flood"
    );
    drop(operator);
    drop(member);
    drop(master);
    drop(cp);
    Ok(())
}

/// One attack of the flood bench: (its name, the Pod and Binding latencies, what the attack saw,
/// how many Bindings were created).
type Phase = (
    &'static str,
    Vec<Duration>,
    Vec<Duration>,
    Option<kvcache_e2e::flood::Tally>,
    usize,
);

async fn phase(
    client: &kube::Client,
    name: &'static str,
    start: usize,
    attack: Option<tokio::task::JoinHandle<kvcache_e2e::flood::Tally>>,
) -> anyhow::Result<Phase> {
    let (pods, bindings, n) = admissions_during(client, start, attack.as_ref()).await?;
    let tally = match attack {
        Some(a) => Some(a.await?),
        None => None,
    };
    Ok((name, pods, bindings, tally, n))
}

/// Injected Pods (dry run) and Bindings created one after another, four Pods to a Binding,
/// until `attack` is done (or 40 creates when there is none); their latencies, sorted, and how
/// many Bindings were created (their names go on from `start`).
async fn admissions_during(
    client: &kube::Client,
    start: usize,
    attack: Option<&tokio::task::JoinHandle<kvcache_e2e::flood::Tally>>,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, usize)> {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let ns = "pods-with-00";
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
    let (mut p, mut b, mut i) = (Vec::new(), Vec::new(), 0usize);
    loop {
        let done = match attack {
            Some(a) => a.is_finished() || i >= 2_000,
            None => i >= 40,
        };
        if done {
            break;
        }
        let t = Instant::now();
        pods.create(&dry, &engine_pod(ns, &format!("flood-{i}"))?)
            .await
            .map_err(|e| anyhow::anyhow!("an injected Pod refused during the flood: {e}"))?;
        p.push(t.elapsed());
        if i % 4 == 3 {
            let t = Instant::now();
            bindings
                .create(
                    &PostParams::default(),
                    &binding(ns, &format!("f-{:05}", start + b.len()))?,
                )
                .await
                .map_err(|e| anyhow::anyhow!("a Binding refused during the flood: {e}"))?;
            b.push(t.elapsed());
        }
        i += 1;
    }
    p.sort();
    b.sort();
    let n = b.len();
    Ok((p, b, n))
}

/// [`engine_pod`] on the Binding `binding`.
fn engine_pod_on(ns: &str, name: &str, binding: &str) -> anyhow::Result<Pod> {
    let mut pod = engine_pod(ns, name)?;
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("kvcache.gpustack.ai/binding".into(), binding.into());
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_counts_are_read_per_series_and_added_over_the_matching_ones() {
        let text = "\
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name=\"inject.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"admit\",le=\"0.005\"} 3
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"inject.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"admit\"} 0.5
apiserver_admission_webhook_admission_duration_seconds_count{name=\"inject.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"admit\"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"validate.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"validating\"} 0.25
apiserver_admission_webhook_admission_duration_seconds_count{name=\"validate.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"validating\"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"validate.kvcache\",operation=\"UPDATE\",rejected=\"false\",type=\"validating\"} 9
";
        let metric = "apiserver_admission_webhook_admission_duration_seconds";
        assert_eq!(
            sum_count(text, metric, &[("operation", "CREATE")]),
            (0.75, 20.0)
        );
        assert_eq!(sum_count(text, metric, &[("type", "admit")]), (0.5, 10.0));
        assert_eq!(sum_count(text, metric, &[("name", "nothing")]), (0.0, 0.0));
        assert_eq!(mean_between((0.75, 20.0), (0.25, 10.0)), Some(0.05));
        assert_eq!(mean_between((0.75, 20.0), (0.75, 20.0)), None);
    }

    #[test]
    fn samples_are_read_as_the_format_writes_them_not_by_substring() {
        // Valid text all three must read: a space after a label's comma, a comma inside a
        // value, a timestamp after a value.
        let text = "\
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\", outcome=\"allowed\", le=\"0.001\"} 5
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\", outcome=\"allowed\", le=\"+Inf\"} 6
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"a,b\",operation=\"CREATE\"} 0.5
apiserver_admission_webhook_admission_duration_seconds_count{name=\"a,b\",operation=\"CREATE\"} 2
# TYPE kvcache_operator_connections_refused counter
kvcache_operator_connections_refused_total{server=\"webhook\",reason=\"source_full\"} 3 1700000000000
kvcache_operator_connections_refused_total{server=\"metrics\",reason=\"full\"} 1
kvcache_operator_connections_refused_total{server=\"webhook\",reason=\"full\"} 2
";
        assert_eq!(
            buckets(text, "inject"),
            [(0.001, 5.0), (f64::INFINITY, 6.0)]
        );
        assert_eq!(
            sum_count(
                text,
                "apiserver_admission_webhook_admission_duration_seconds",
                &[("name", "a,b")]
            ),
            (0.5, 2.0)
        );
        assert_eq!(
            refusals(text, "kvcache_operator_connections_refused_total"),
            "source_full 3, full 2"
        );
    }

    #[test]
    fn a_quantile_from_buckets_interpolates_inside_its_bucket() {
        let text = "\
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\",outcome=\"allowed\",le=\"0.001\"} 50
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\",outcome=\"allowed\",le=\"0.002\"} 90
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\",outcome=\"allowed\",le=\"+Inf\"} 100
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"validate\",outcome=\"allowed\",le=\"0.001\"} 7
";
        let b = buckets(text, "inject");
        assert_eq!(b.len(), 3);
        let p50 = bucket_quantile(&b, 0.5).expect("p50");
        assert!((p50 - 0.001).abs() < 1e-9, "{p50}");
        let p70 = bucket_quantile(&b, 0.7).expect("p70");
        assert!((p70 - 0.0015).abs() < 1e-9, "{p70}");
        // In the +Inf bucket: the last finite bound.
        assert_eq!(bucket_quantile(&b, 0.99), Some(0.002));
    }
}
