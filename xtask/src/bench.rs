//! `cargo xtask bench failover`: how long the store is without a serving leader, and without its
//! full capacity, after the leader is lost; measured on loopback against the real API server and
//! real store processes, several runs, median and spread.

use std::time::{Duration, Instant};

use anyhow::Context;
use kvcache_e2e::cluster::{ControlPlane, Options, block_on, client_from};
use kvcache_e2e::failover::{LeaseTiming, Rig};
use kvcache_e2e::paths;

use crate::setup;

const SEGMENT: u64 = 64 << 20;

struct Sample {
    serving: Duration,
    full: Duration,
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let median = v[v.len() / 2];
    (median, v[0], v[v.len() - 1])
}

fn fmt(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

fn one(rig: &mut Rig, hard: bool) -> anyhow::Result<Sample> {
    let leader = rig.wait_leader(None, Duration::from_secs(60))?;
    rig.wait_capacity(leader, 2 * SEGMENT, Duration::from_secs(60))?;
    let t = Instant::now();
    rig.stop_leader(leader, hard);
    let next = rig.wait_leader(Some(leader), Duration::from_secs(60))?;
    let serving = t.elapsed();
    rig.wait_capacity(next, 2 * SEGMENT, Duration::from_secs(60))?;
    let full = t.elapsed();
    // Bring the lost slot back as a standby for the next round.
    let identity = format!("leader-{leader}-again-{}", t.elapsed().as_millis());
    rig.leaders[leader] = Some(rig.start_leader(&identity, None)?);
    Ok(Sample { serving, full })
}

pub fn failover(runs: usize) -> anyhow::Result<()> {
    setup::all()?;
    let dir = paths::scratch("bench-cluster")?;
    let cp = ControlPlane::start(
        &dir,
        &Options {
            controllers: false,
            reaper: true,
            advertise: None,
        },
    )?;
    let kubeconfig = cp.kubeconfig.clone();
    let kc = kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let ns = k8s_openapi::api::core::v1::Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some("bench".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&Default::default(), &ns).await?;
        Ok(())
    })?;
    let timing = LeaseTiming::default();
    let mut rig = Rig::start(&kubeconfig, "bench", "bench-leader", 3, 2, SEGMENT, timing)
        .context("starting three electors and two members")?;
    let mut kill = Vec::new();
    let mut term = Vec::new();
    for round in 0..runs {
        kill.push(one(&mut rig, true)?);
        term.push(one(&mut rig, false)?);
        println!(
            "round {}/{runs}: kill -9 serving {} full {}; SIGTERM serving {} full {}",
            round + 1,
            fmt(kill[round].serving),
            fmt(kill[round].full),
            fmt(term[round].serving),
            fmt(term[round].full)
        );
    }
    println!();
    println!(
        "Lease: duration {}, renew deadline {}, retry period {}; {} leader electors, 2 members of {} MiB, {runs} runs",
        fmt(timing.duration),
        fmt(timing.renew_deadline),
        fmt(timing.retry_period),
        3,
        SEGMENT >> 20
    );
    println!(
        "| leader loss | to serving: median (min–max) | to full capacity: median (min–max) | reference operator |"
    );
    println!("|---|---|---|---|");
    for (name, samples, reference) in [
        ("kill -9", &kill, "~16 s failover"),
        ("SIGTERM", &term, "~30 s single-leader restart"),
    ] {
        let (sm, slo, shi) = stats(samples.iter().map(|s| s.serving).collect());
        let (fm, flo, fhi) = stats(samples.iter().map(|s| s.full).collect());
        println!(
            "| {name} | {} ({}–{}) | {} ({}–{}) | {reference} |",
            fmt(sm),
            fmt(slo),
            fmt(shi),
            fmt(fm),
            fmt(flo),
            fmt(fhi)
        );
    }
    drop(rig);
    drop(cp);

    // The peer on the same rig: Mooncake's own etcd-backed HA (three masters electing through
    // etcd, members dialling `etcd://`), the same two members, the same rounds.
    let (etcd_kill, etcd_term) = etcd_ha(runs)?;
    println!();
    println!(
        "Mooncake's own HA (--enable_ha=true --ha_backend_type=etcd), 3 masters, 2 members of {} MiB, {runs} runs, beside the elector:",
        SEGMENT >> 20
    );
    println!(
        "| leader loss | elector: to serving (median) | etcd HA: to serving median (min–max) | etcd HA: to full capacity median (min–max) | etcd HA / elector (serving) |"
    );
    println!("|---|---|---|---|---|");
    for (name, ours, theirs) in [
        ("kill -9", &kill, &etcd_kill),
        ("SIGTERM", &term, &etcd_term),
    ] {
        let (om, _, _) = stats(ours.iter().map(|s| s.serving).collect());
        let (sm, slo, shi) = stats(theirs.iter().map(|s| s.serving).collect());
        let (fm, flo, fhi) = stats(theirs.iter().map(|s| s.full).collect());
        println!(
            "| {name} | {} | {} ({}–{}) | {} ({}–{}) | {:.1}x |",
            fmt(om),
            fmt(sm),
            fmt(slo),
            fmt(shi),
            fmt(fm),
            fmt(flo),
            fmt(fhi),
            sm.as_secs_f64() / om.as_secs_f64().max(f64::EPSILON)
        );
    }
    Ok(())
}

/// What a master of the etcd-backed HA says of itself (`/ha_status`): `serving`, `standby`,
/// `leader_warmup`.
fn ha_status(m: &kvcache_e2e::store::Master) -> String {
    kvcache_e2e::store::http_get(&format!("{}/ha_status", m.admin_url()))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Waits until a master other than `not` says `serving`; its index.
fn wait_serving(
    masters: &[Option<kvcache_e2e::store::Master>],
    not: Option<usize>,
    within: Duration,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(i) = masters.iter().enumerate().position(|(i, m)| {
            Some(i) != not && m.as_ref().is_some_and(|m| ha_status(m) == "serving")
        }) {
            return Ok(i);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no etcd-HA master said `serving` within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Leader loss under Mooncake's own HA: kill -9 and SIGTERM rounds, to a standby serving and to
/// full capacity on it.
fn etcd_ha(runs: usize) -> anyhow::Result<(Vec<Sample>, Vec<Sample>)> {
    use kvcache_e2e::process::free_port;
    use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions};
    let dir = paths::scratch("bench-etcd-ha")?;
    let (etcd, client) = kvcache_e2e::cluster::start_etcd(&paths::k8s_bin()?, &dir)?;
    let options = || -> anyhow::Result<MasterOptions> {
        Ok(MasterOptions {
            client_ttl: Some(3),
            extra_args: vec![
                "--enable_ha=true".into(),
                "--ha_backend_type=etcd".into(),
                format!("--etcd_endpoints=127.0.0.1:{client}"),
            ],
            ports: Some((free_port()?, free_port()?)),
        })
    };
    let mut masters: Vec<Option<Master>> = Vec::new();
    let mut slots = Vec::new();
    for i in 0..3 {
        let d = dir.join(format!("master-{i}"));
        std::fs::create_dir_all(&d)?;
        let o = options()?;
        masters.push(Some(Master::start(&d, o.clone())?));
        slots.push((d, o));
    }
    let members: Vec<Member> = (0..2)
        .map(|i| {
            let d = dir.join(format!("member-{i}"));
            std::fs::create_dir_all(&d)?;
            Ok(Member::start(
                &d,
                &MemberOptions::new(format!("etcd://127.0.0.1:{client}"), SEGMENT),
            )?)
        })
        .collect::<anyhow::Result<_>>()?;
    let mut round = |hard: bool| -> anyhow::Result<Sample> {
        let leader = wait_serving(&masters, None, Duration::from_secs(60))?;
        masters[leader]
            .as_ref()
            .context("the serving master")?
            .wait_capacity(2 * SEGMENT, Duration::from_secs(60))?;
        let t = Instant::now();
        let mut lost = masters[leader].take().context("the serving master")?;
        if hard {
            lost.proc.kill();
        } else {
            lost.proc.stop(Duration::from_secs(30));
        }
        let next = wait_serving(&masters, Some(leader), Duration::from_secs(60))?;
        let serving = t.elapsed();
        masters[next]
            .as_ref()
            .context("the new serving master")?
            .wait_capacity(2 * SEGMENT, Duration::from_secs(60))?;
        let full = t.elapsed();
        drop(lost);
        let (d, o) = &slots[leader];
        masters[leader] = Some(Master::start(d, o.clone())?);
        Ok(Sample { serving, full })
    };
    let mut kill = Vec::new();
    let mut term = Vec::new();
    for r in 0..runs {
        kill.push(round(true)?);
        term.push(round(false)?);
        println!(
            "etcd HA round {}/{runs}: kill -9 serving {} full {}; SIGTERM serving {} full {}",
            r + 1,
            fmt(kill[r].serving),
            fmt(kill[r].full),
            fmt(term[r].serving),
            fmt(term[r].full)
        );
    }
    drop(members);
    drop(masters);
    drop(etcd);
    Ok((kill, term))
}

/// `cargo xtask bench capacity`: on two real nodes with the operator (as from a Pod), a
/// demo-size backend (2 members of 256 MiB); each round deletes one member Pod, its DaemonSet
/// starts another, and the time is taken from the moment the master's own `/metrics` (read
/// directly from the leader Pod every 10 ms) first shows the full capacity again to the moment
/// the backend's `status.capacity` (on a watch) shows it.
pub fn capacity(runs: usize) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
    use kvcache_api::KVCacheBackend;
    use kvcache_e2e::nodes::NodeCluster;
    use kvcache_e2e::operator::Operator;
    use kvcache_e2e::{cluster, images, pods, store, walkthrough};

    const FULL: u64 = 512 << 20;
    const NS: &str = "gpustack-system";
    const NAME: &str = "bench-capacity";
    setup::all()?;
    let dir = paths::scratch("bench-capacity")?;
    let nodes = NodeCluster::start(&dir, 2, images::NODE_DEFAULT)?;
    let kc = nodes.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        cluster::install_crds(&client, &cluster::crds_dir()).await?;
        walkthrough::ensure_namespace(&client, NS).await
    })?;
    let _operator = Operator::builder(&nodes.nodes.kubeconfig, NS)
        .on_nodes(&nodes.nodes)
        .start(&dir)?;
    let kc = nodes.control_plane.kubeconfig.clone();
    let samples = block_on(async move {
        let client = client_from(&kc).await?;
        let backend: KVCacheBackend = serde_yaml::from_str(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {NAME}}}\nspec:\n  type: Mooncake\n  connection:\n    managed:\n      leader: {{}}\n      members:\n        - nodeSelector: {{kubernetes.io/os: linux}}\n          medium: DRAM\n          capacityPerMember: 256Mi\n"
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
        let full = |b: &KVCacheBackend| {
            b.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| kvcache_api::quantity::parse_bytes(&c.total.0).ok())
                == Some(FULL)
        };
        let store_pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let mut samples = Vec::new();
        for round in 0..runs {
            cluster::wait_object(
                &backends,
                NAME,
                "full capacity",
                Duration::from_secs(120),
                full,
            )
            .await?;
            let leader = pods::wait_ready(
                &store_pods,
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
                kvcache_render::backend::ADMIN_PORT
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
                &backends,
                NAME,
                "capacity below full",
                Duration::from_secs(120),
                |b| !full(b),
            )
            .await?;
            cluster::wait_object(
                &backends,
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
            let lag = status_full.saturating_duration_since(store_full);
            println!(
                "round {}/{runs}: status.capacity {} after the master",
                round + 1,
                fmt(lag)
            );
            samples.push(lag);
        }
        Ok(samples)
    })?;
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
    drop(nodes);
    Ok(())
}
