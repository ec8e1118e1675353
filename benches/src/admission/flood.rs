//! `cargo xtask bench admission --flood`: admission under attack from another source.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kvcache_api::KVCachePoolBinding;
use kvcache_e2e::cluster::client_from;

use super::metrics::{quantile, refusals};
use super::rig::{
    Rig, binding, block_on, engine_pod, engine_pod_on, register, rig, wait_client_endpoint,
};

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
