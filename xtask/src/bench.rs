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
    Ok(())
}
