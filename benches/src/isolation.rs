//! `cargo xtask bench isolation`: how soon a Binding created opens its namespace to the store,
//! a Binding deleted closes it, and how soon a store client its namespace opened before the
//! deletion can neither write nor read (docs/isolation.md#revocation), on two real nodes under
//! the harness's NetworkPolicy enforcer (kube-router's firewall) with the operator as from a Pod.
//! Each round applies a Binding, then probes the master's RPC port from a Pod of the namespace
//! every 100 ms until it connects; then starts a Pod holding a store client open (putting and
//! reading every 200 ms, `kvcache_e2e::holder`), deletes the Binding, probes until a new
//! connection is refused, and reads the held client's rounds until it neither writes nor reads.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::holder::{self, Holder};
use kvcache_e2e::pods::{self, ip_of, name_of};
use kvcache_e2e::reach::{self, Reach};
use kvcache_e2e::status::phase;
use kvcache_e2e::{images, walkthrough};

const NS: &str = "gpustack-system";
const BACKEND: &str = "bench-isolated";
const TEAM: &str = "team-isolated";
/// The Binding's domain: the tenant the held client writes as.
const DOMAIN: &str = "team-isolated";
const WAIT: Duration = Duration::from_secs(180);

/// Runs `rounds` open-and-close rounds and prints the figures.
pub fn isolation(rounds: usize) -> anyhow::Result<()> {
    let rig = crate::operator::with_operator_enforced("bench-isolation", NS)?;
    let kc = rig.nodes.control_plane.kubeconfig.clone();
    let figures = block_on(async move {
        let client = client_from(&kc).await?;
        let (prober, target) = prepare(&client).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
        let master = format!("{BACKEND}-leader.{NS}.svc:50051");
        let (mut opened, mut closed, mut revoked) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            bind(&client).await?;
            opened.push(until(&api, &prober, &target, Reach::Connected, "open").await?);
            let name = format!("holder-{round}");
            let mut held = Holder::start(&api, &name, images::STORE.name, &master, DOMAIN).await?;
            held.serving(3, WAIT).await?;
            let deleted = holder::now();
            Api::<KVCachePoolBinding>::namespaced(client.clone(), TEAM)
                .delete(TEAM, &DeleteParams::default())
                .await?;
            closed.push(until(&api, &prober, &target, Reach::Refused, "closed").await?);
            let cut =
                held.cut(deleted, 5, WAIT)
                    .await?
                    .ok_or_else(|| kvcache_e2e::Error::Wait {
                        what: format!("{TEAM}'s open client refused writes and reads"),
                        reason: format!("it still wrote or read {WAIT:?} after the deletion"),
                    })?;
            revoked.push(cut.writes.max(cut.reads));
            // The next round's Binding is a new one: wait for this one's release.
            gone(&client).await?;
            api.delete(&name, &DeleteParams::default()).await?;
            println!(
                "round {}: opened after {:.2} s, closed after {:.2} s, the open client's writes refused after {:.2} s and its reads after {:.2} s (puts answered {:?})",
                round + 1,
                opened[round],
                closed[round],
                cut.writes,
                cut.reads,
                cut.refusals
            );
        }
        Ok::<_, kvcache_e2e::Error>((opened, closed, revoked))
    })?;
    drop(rig);
    let (opened, closed, revoked) = figures;
    println!("| figure | median | max | rounds |");
    println!("|---|---|---|---|");
    for (what, v) in [
        (
            "a Binding created to its namespace reaching the master",
            opened,
        ),
        ("a Binding deleted to its namespace cut off", closed),
        (
            "a Binding deleted to a client its namespace held open writing and reading nothing",
            revoked,
        ),
    ] {
        let n = v.len();
        let max = v.iter().copied().fold(0.0, f64::max);
        println!("| {what} | {:.2} s | {max:.2} s | {n} |", median(v));
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The backend, its pool, the namespace and its prober; the master's `IP:50051`.
async fn prepare(client: &kube::Client) -> Result<(String, String), kvcache_e2e::Error> {
    let pp = PatchParams::apply(walkthrough::MANAGER).force();
    let mut b = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
        "metadata": {"name": BACKEND},
        "spec": {
            "image": kvcache_api::settings::DEFAULT_BACKEND_IMAGE,
            "connection": {"managed": {"members": [{"medium": "DRAM", "capacityPerMember": "64Mi"}]}}
        }
    });
    walkthrough::fill_store_resources(&mut b, walkthrough::RIG_STORE_CPU);
    let b: KVCacheBackend = serde_json::from_value(b).map_err(invalid)?;
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    backends.patch(BACKEND, &pp, &Patch::Apply(&b)).await?;
    let pool: KVCachePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
        "metadata": {"name": BACKEND},
        "spec": {"backends": [BACKEND], "quota": {"total": "64Mi"}},
    }))
    .map_err(invalid)?;
    Api::<KVCachePool>::all(client.clone())
        .patch(BACKEND, &pp, &Patch::Apply(&pool))
        .await?;
    walkthrough::ensure_namespace(client, TEAM).await?;
    wait_object(&backends, BACKEND, "Ready", WAIT, |b| {
        phase(b) == Some(kvcache_api::backend::BackendPhase::Ready)
    })
    .await?;
    let store: Api<Pod> = Api::namespaced(client.clone(), NS);
    let leader = pods::wait_ready(
        &store,
        &walkthrough::backend_pods(BACKEND, "leader"),
        1,
        WAIT,
    )
    .await?;
    let target = format!("{}:50051", ip_of(&leader[0]).unwrap_or_default());
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "prober", "namespace": TEAM, "labels": {"app": "prober"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": images::STORE.name, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"]}]
        }
    }))
    .map_err(invalid)?;
    api.create(&PostParams::default(), &pod).await?;
    let ready = pods::wait_ready(&api, "app=prober", 1, WAIT).await?;
    Ok((name_of(&ready[0]).to_owned(), target))
}

fn invalid(e: serde_json::Error) -> kvcache_e2e::Error {
    kvcache_e2e::Error::Invalid {
        path: "the isolation benchmark's objects".into(),
        what: "object",
        reason: e.to_string(),
    }
}

async fn bind(client: &kube::Client) -> Result<(), kvcache_e2e::Error> {
    let binding: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": TEAM, "namespace": TEAM},
        "spec": {"poolRef": {"name": BACKEND}, "quota": {"ceiling": "32Mi"},
                 "domain": {"name": DOMAIN, "blockSize": 64, "dtype": "bfloat16"}},
    }))
    .map_err(invalid)?;
    Api::<KVCachePoolBinding>::namespaced(client.clone(), TEAM)
        .patch(
            TEAM,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await?;
    Ok(())
}

/// Waits until the Binding is gone (its release done).
async fn gone(client: &kube::Client) -> Result<(), kvcache_e2e::Error> {
    let api: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), TEAM);
    let started = Instant::now();
    while api.get_opt(TEAM).await?.is_some() {
        if started.elapsed() > WAIT {
            return Err(kvcache_e2e::Error::Wait {
                what: format!("the Binding {TEAM}/{TEAM} released and gone"),
                reason: "it is still there".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Probes every 100 ms until the prober's connection to `target` ends `want`; the seconds from
/// the call to the start of the first probe that saw it (a dropped probe waits 2 s for its
/// answer, which is not counted).
async fn until(
    api: &Api<Pod>,
    prober: &str,
    target: &str,
    want: Reach,
    what: &str,
) -> Result<f64, kvcache_e2e::Error> {
    let started = Instant::now();
    let targets = [target.to_owned()];
    loop {
        let probed = started.elapsed();
        let seen = reach::probe(api, prober, &targets).await?;
        // Closed is refused or dropped alike (kube-router rejects a denied connection).
        if seen.values().all(|r| r.open() == want.open()) {
            return Ok(probed.as_secs_f64());
        }
        if started.elapsed() > WAIT {
            return Err(kvcache_e2e::Error::Wait {
                what: format!("{TEAM} {what} ({target} {want:?})"),
                reason: format!("last probe: {seen:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
