//! `cargo xtask bench rollout`: a member rollout of a memory group on two real nodes with the
//! operator (as from a Pod): two members of 256 MiB hold 160 keys of 1 MiB (written through the
//! store's Python client; about half on each, all of them fitting on one), then one more
//! variable in the group's template rolls both members. Measured: the share of the keys read back
//! with their bytes afterwards, the time from the edit to `RolloutComplete=True` with both
//! members replaced, Ready and mounted, each drain (`MemberDraining` to `MemberDrained`) and the
//! fewest members serving at once. Method and figures in benches/README.md ("rollout").

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kvcache_api::KVCacheBackend;
use kvcache_e2e::cluster::{self, block_on, client_from};
use kvcache_e2e::rollout::{KeyCount, MemberWatch, keys};
use kvcache_e2e::{Error, pods, walkthrough};
use kvcache_render::objects::backend::{RPC_PORT, leader_name};

const NS: &str = "gpustack-system";
const KEYS: usize = 160;
const SIZE: usize = 1 << 20;
const FULL: u64 = 512 << 20;
const WAIT: Duration = Duration::from_secs(180);
const ROLLOUT: Duration = Duration::from_secs(600);

/// One round's figures.
struct Round {
    read: KeyCount,
    took: Duration,
    drains: Vec<Duration>,
    fewest: Option<usize>,
    rolled_without: usize,
}

fn manifest(name: &str, value: &str) -> Result<KVCacheBackend, Error> {
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}}}\nspec:\n  type: Mooncake\n  connection:\n    managed:\n      leader: {{multiTenancy: false, resources: {{requests: {{cpu: 100m, memory: 128Mi}}}}}}\n      members:\n        - nodeSelector: {{kubernetes.io/os: linux}}\n          medium: DRAM\n          capacityPerMember: 256Mi\n          resources: {{requests: {{cpu: 100m}}}}\n          extraEnv: [{{name: KVCACHE_BENCH_ROUND, value: \"{value}\"}}]\n"
    ))
    .map_err(|e| Error::Invalid {
        path: name.into(),
        what: "backend",
        reason: e.to_string(),
    })
}

/// Applies the backend `b` (server-side apply, forced, the walkthrough's field manager).
pub(crate) async fn apply(client: &Client, b: &KVCacheBackend) -> Result<(), Error> {
    Api::<KVCacheBackend>::all(client.clone())
        .patch(
            &b.name_any(),
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(b),
        )
        .await?;
    Ok(())
}

fn full(b: &KVCacheBackend) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| kvcache_api::quantity::parse_bytes(&c.total.0).ok())
        == Some(FULL)
}

/// `RolloutComplete=True`.
pub(crate) fn rollout_complete(b: &KVCacheBackend) -> bool {
    kvcache_e2e::status::has_condition(b, "RolloutComplete=True")
}

/// The backend's events of `reason`, oldest first, with their times.
pub(crate) async fn events(
    client: &Client,
    backend: &str,
    reason: &str,
) -> Result<Vec<(k8s_openapi::jiff::Timestamp, String)>, Error> {
    let mut out: Vec<_> = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(backend))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| Some((e.event_time?.0, e.note.unwrap_or_default())))
        .collect();
    out.sort();
    Ok(out)
}

async fn round(client: &Client, name: &str) -> Result<Round, Error> {
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    apply(client, &manifest(name, "first")?).await?;
    cluster::wait_object(&backends, name, "Ready with 512Mi", WAIT, |b| {
        full(b) && rollout_complete(b)
    })
    .await?;
    let store: Api<Pod> = Api::namespaced(client.clone(), NS);
    let selector = walkthrough::backend_pods(name, "member-0");
    let members = pods::wait_ready(&store, &selector, 2, WAIT).await?;
    let before: Vec<String> = members
        .iter()
        .map(|p| p.uid().unwrap_or_default())
        .collect();
    let master = format!("{}.{NS}.svc:{RPC_PORT}", leader_name(name));
    let wrote = keys(
        &store,
        pods::name_of(&members[0]),
        &master,
        "put",
        name,
        KEYS,
        SIZE,
    )
    .await?;
    println!(
        "{name}: wrote {} of {} keys of {SIZE} bytes",
        wrote.ok, wrote.of
    );

    let watch = MemberWatch::start(store.clone(), &selector);
    watch.listed(WAIT).await?;
    let edited = Instant::now();
    apply(client, &manifest(name, "second")?).await?;
    let replaced = pods::wait_pods(
        &store,
        &selector,
        "2 Ready member Pods, none of the earlier ones",
        ROLLOUT,
        |p| {
            p.len() == 2
                && p.iter()
                    .all(|p| pods::is_ready(p) && !before.contains(&p.uid().unwrap_or_default()))
        },
    )
    .await?;
    cluster::wait_object(
        &backends,
        name,
        "the edit observed, RolloutComplete=True, 512Mi",
        ROLLOUT,
        |b| {
            b.status.as_ref().and_then(|s| s.observed_generation) == b.metadata.generation
                && rollout_complete(b)
                && full(b)
        },
    )
    .await?;
    let took = edited.elapsed();
    let read = keys(
        &store,
        pods::name_of(&replaced[0]),
        &master,
        "get",
        name,
        KEYS,
        SIZE,
    )
    .await?;
    let started = events(client, name, "MemberDraining").await?;
    let drained = events(client, name, "MemberDrained").await?;
    let without = events(client, name, "MemberRolledWithoutDrain").await?;
    for (_, note) in started.iter().chain(&drained).chain(&without) {
        println!("{name}: {note}");
    }
    println!("{name}: member Pods:\n  {}", watch.timeline().join("\n  "));
    // One member at a time: the i-th drain started ends with the i-th member drained.
    let drains = started
        .iter()
        .zip(&drained)
        .filter_map(|((from, _), (to, _))| Duration::try_from(to.duration_since(*from)).ok())
        .collect();
    backends.delete(name, &DeleteParams::default()).await?;
    Ok(Round {
        read,
        took,
        drains,
        fewest: watch.fewest_serving(),
        rolled_without: without.len(),
    })
}

/// `cargo xtask bench rollout`.
pub fn rollout(runs: usize) -> anyhow::Result<()> {
    let bench = crate::operator::with_operator("bench-rollout", NS)?;
    let kc = bench.nodes.control_plane.kubeconfig.clone();
    let rounds = block_on(async move {
        let client = client_from(&kc).await?;
        let mut rounds = Vec::new();
        for i in 0..runs {
            rounds.push(round(&client, &format!("bench-rollout-{i}")).await?);
        }
        Ok::<_, Error>(rounds)
    })?;
    let secs = |d: &Duration| format!("{:.1} s", d.as_secs_f64());
    println!();
    println!(
        "| member rollout, 2 members of 256 MiB, {KEYS} keys of 1 MiB | keys read back with their bytes | edit to RolloutComplete=True (both replaced, Ready, mounted) | each drain (MemberDraining to MemberDrained) | fewest members serving | rolled without a drain |"
    );
    println!("|---|---|---|---|---|---|");
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "| run {} | {} of {} ({:.1} %) | {} | {} | {} of 2 | {} |",
            i + 1,
            r.read.ok,
            r.read.of,
            r.read.percent(),
            secs(&r.took),
            r.drains.iter().map(secs).collect::<Vec<_>>().join(", "),
            r.fewest.map_or("?".to_owned(), |f| f.to_string()),
            r.rolled_without
        );
    }
    drop(bench);
    Ok(())
}
