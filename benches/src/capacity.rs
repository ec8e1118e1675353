//! `cargo xtask bench capacity`: how soon a backend's `status.capacity` follows the master's own
//! figure after a member Pod is replaced.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::{cluster, pods, store, walkthrough};

use crate::failover::{fmt, stats};
use crate::operator::with_operator;

const FULL: u64 = 512 << 20;
const NS: &str = "gpustack-system";
const NAME: &str = "bench-capacity";

/// `cargo xtask bench capacity`: on two real nodes with the operator (as from a Pod), a
/// demo-size backend (2 members of 256 MiB); each round deletes one member Pod, its DaemonSet
/// starts another, and the time is taken from the moment the master's own `/metrics` (read
/// directly from the leader Pod every 10 ms) first shows the full capacity again to the moment
/// the backend's `status.capacity` (on a watch) shows it.
pub fn capacity(runs: usize) -> anyhow::Result<()> {
    let bench = with_operator("bench-capacity", NS)?;
    let kc = bench.nodes.control_plane.kubeconfig.clone();
    let samples = block_on(async move {
        let client = client_from(&kc).await?;
        let backend: KVCacheBackend = serde_yaml::from_str(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {NAME}}}\nspec:\n  type: Mooncake\n  connection:\n    managed:\n      leader: {{resources: {{requests: {{cpu: 100m, memory: 128Mi}}}}}}\n      members:\n        - nodeSelector: {{kubernetes.io/os: linux}}\n          medium: DRAM\n          capacityPerMember: 256Mi\n          resources: {{requests: {{cpu: 100m}}}}\n"
        ))
        .map_err(|e| kvcache_e2e::Error::Invalid {
            path: NAME.into(),
            what: "backend",
            reason: e.to_string(),
        })?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        backends
            .patch(
                NAME,
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(&backend),
            )
            .await?;
        let store_pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let mut samples = Vec::new();
        for round in 0..runs {
            let lag = one_round(&backends, &store_pods).await?;
            println!(
                "round {}/{runs}: status.capacity {} after the master",
                round + 1,
                fmt(lag)
            );
            samples.push(lag);
        }
        Ok(samples)
    })?;
    print_capacity(samples, runs);
    drop(bench);
    Ok(())
}

/// The backend at full capacity (both members' 256 MiB).
fn full(b: &KVCacheBackend) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| kvcache_api::quantity::parse_bytes(&c.total.0).ok())
        == Some(FULL)
}

/// One round: a member Pod deleted, and the time from the master's own figure showing full
/// capacity again to the backend's `status.capacity` showing it.
async fn one_round(
    backends: &Api<KVCacheBackend>,
    store_pods: &Api<Pod>,
) -> Result<Duration, kvcache_e2e::Error> {
    cluster::wait_object(
        backends,
        NAME,
        "full capacity",
        Duration::from_secs(120),
        full,
    )
    .await?;
    let leader = pods::wait_ready(
        store_pods,
        &walkthrough::backend_pods(NAME, "leader"),
        1,
        Duration::from_secs(120),
    )
    .await?;
    let ip = pods::ip_of(&leader[0]).unwrap_or_default().to_owned();
    let members = store_pods
        .list(&ListParams::default().labels(&walkthrough::backend_pods(NAME, "member-0")))
        .await?
        .items;
    let victim = members
        .first()
        .map(|p| pods::name_of(p).to_owned())
        .unwrap_or_default();
    // The master's own figure, polled: when it drops, then when it is full again.
    let url = format!(
        "http://{ip}:{}/metrics",
        kvcache_render::objects::backend::ADMIN_PORT
    );
    let store_full = tokio::task::spawn_blocking(move || {
        let reading = || {
            store::http_get(&url)
                .ok()
                .and_then(|t| store::metric_value(&t, "master_total_capacity_bytes"))
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while reading() == Some(FULL as f64) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        while reading() != Some(FULL as f64) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        Instant::now()
    });
    store_pods.delete(&victim, &DeleteParams::default()).await?;
    cluster::wait_object(
        backends,
        NAME,
        "capacity below full",
        Duration::from_secs(120),
        |b| !full(b),
    )
    .await?;
    cluster::wait_object(
        backends,
        NAME,
        "full capacity again",
        Duration::from_secs(120),
        full,
    )
    .await?;
    let status_full = Instant::now();
    let store_full = store_full.await.map_err(|e| kvcache_e2e::Error::Wait {
        what: "the store's reading".into(),
        reason: e.to_string(),
    })?;
    Ok(status_full.saturating_duration_since(store_full))
}

/// The capacity table: the lag's median and spread over the runs.
fn print_capacity(samples: Vec<Duration>, runs: usize) {
    let (median, min, max) = stats(samples);
    println!();
    println!(
        "| from the master registering the last member to status.capacity | median | min | max | reference |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {runs} runs, 2 members of 256 MiB, real nodes | {} | {} | {} | up to 15 s (polls every 15 s) |",
        fmt(median),
        fmt(min),
        fmt(max)
    );
}
