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

mod flood;
mod metrics;
mod rig;

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kvcache_e2e::Watched;
use kvcache_e2e::cluster::client_from;
use kvcache_e2e::operator::Operator;

pub use flood::flood;
use metrics::{Calls, bucket_quantile, mean_between, minus, quantile};
use rig::{
    NAMESPACES, Rig, binding, block_on, engine_pod, register, rig, unregister, wait_client_endpoint,
};

/// The load `cargo xtask bench admission` applies (its `--creates` and `--concurrency`).
pub struct Shape {
    /// Bindings created per round (and as many Pods).
    pub creates: usize,
    /// Requests in flight.
    pub concurrency: usize,
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

/// The namespace of create `i` on `side` (creates spread over [`NAMESPACES`] namespaces).
fn ns(side: &str, i: usize) -> String {
    format!("{side}-{:02}", i % NAMESPACES)
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
