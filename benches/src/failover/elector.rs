//! Leader loss under the elector (the Lease): kill -9 and SIGTERM rounds, the engine's and the
//! Service-addressed members' reattach, and the round where the old leader's address vanishes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::failover::{LeaseTiming, Rig};

use super::figures::{FAST_SEGMENT, SEGMENT, Sample, fmt, stats};
use super::stand_in::{Engine, Reattach, ServiceStandIn, engine_writes};

/// Waits until leader `i`'s master reports at least `want` capacity.
fn wait_capacity_at_least(rig: &Rig, i: usize, want: u64, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while rig.leaders[i]
        .as_ref()
        .and_then(kvcache_e2e::failover::LeaderSlot::capacity)
        .is_none_or(|c| c < want)
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "waited {within:?} for leader {i}'s master to report at least {want} bytes of capacity"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn one(
    rig: &mut Rig,
    hard: bool,
    service: &ServiceStandIn,
    engine: &Engine,
) -> anyhow::Result<(Sample, Reattach)> {
    let leader = rig.wait_leader(None, Duration::from_secs(60))?;
    wait_capacity_at_least(rig, leader, 3 * SEGMENT, Duration::from_secs(60))?;
    anyhow::ensure!(
        engine.put("before-failover"),
        "the engine stand-in could not write before the failover"
    );
    let t = Instant::now();
    rig.stop_leader(leader, hard);
    let port = engine.port;
    let poll = std::thread::spawn(move || engine_writes(port, t, Duration::from_secs(120)));
    let next = rig.wait_leader(Some(leader), Duration::from_secs(60))?;
    let serving = t.elapsed();
    // The endpoint switch, at the moment the new leader answers ready.
    if let Some(slot) = rig.leaders[next].as_ref() {
        service.point_at(slot.address());
    }
    let seen = poll
        .join()
        .map_err(|_| anyhow::anyhow!("the engine poller panicked"))??;
    wait_capacity_at_least(rig, next, 2 * SEGMENT, Duration::from_secs(60))?;
    let full = t.elapsed();
    wait_capacity_at_least(rig, next, 3 * SEGMENT, Duration::from_secs(120))?;
    let reattach = Reattach {
        answered: seen.answered.saturating_sub(serving),
        wrote: seen.wrote.saturating_sub(serving),
        service_member: t.elapsed().saturating_sub(serving),
    };
    // Bring the lost slot back as a standby for the next round.
    let identity = format!("leader-{leader}-again-{}", t.elapsed().as_millis());
    rig.leaders[leader] = Some(rig.start_leader(&identity, None)?);
    Ok((Sample { serving, full }, reattach))
}

/// kill -9 with the old leader's address vanishing (open connections get no FIN or RST): from
/// the new leader serving to each engine's first successful put, and to the Service-addressed
/// member mounted.
fn vanish_round(
    rig: &mut Rig,
    service: &ServiceStandIn,
    engines: &[&Engine],
) -> anyhow::Result<(Vec<Duration>, Duration, Duration)> {
    let leader = rig.wait_leader(None, Duration::from_secs(60))?;
    wait_capacity_at_least(
        rig,
        leader,
        3 * SEGMENT + FAST_SEGMENT,
        Duration::from_secs(60),
    )?;
    // An engine idle since the last failover holds a pooled connection to the old master: its
    // first put fails once (RPC_FAIL) and the next dials again.
    for e in engines {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !e.put("before-vanish") {
            anyhow::ensure!(
                Instant::now() < deadline,
                "waited 10s for an engine stand-in to write before the failover"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    service.vanish.store(true, Ordering::Relaxed);
    let t = Instant::now();
    rig.stop_leader(leader, true);
    let polls: Vec<_> = engines
        .iter()
        .map(|e| {
            let port = e.port;
            std::thread::spawn(move || engine_writes(port, t, Duration::from_secs(120)))
        })
        .collect();
    let next = rig.wait_leader(Some(leader), Duration::from_secs(60))?;
    let serving = t.elapsed();
    if let Some(slot) = rig.leaders[next].as_ref() {
        service.point_at(slot.address());
    }
    let mut wrote = Vec::new();
    for p in polls {
        let seen = p
            .join()
            .map_err(|_| anyhow::anyhow!("an engine poller panicked"))??;
        wrote.push(seen.wrote.saturating_sub(serving));
    }
    // The two Service-addressed members told apart by their sizes: the Lease members' 2 x 64 MiB,
    // the default one's 64 MiB, the 1 s-timeout one's 32 MiB.
    let (mut member, mut fast) = (None, None);
    while member.is_none() || fast.is_none() {
        let cap = rig.leaders[next]
            .as_ref()
            .and_then(kvcache_e2e::failover::LeaderSlot::capacity)
            .unwrap_or(0);
        if fast.is_none() && cap % SEGMENT == FAST_SEGMENT {
            fast = Some(t.elapsed().saturating_sub(serving));
        }
        if member.is_none() && cap - cap % SEGMENT >= 3 * SEGMENT {
            member = Some(t.elapsed().saturating_sub(serving));
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(180),
            "waited 180s for both Service-addressed members to mount on the new master (capacity {cap})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (member, fast) = (member.unwrap_or_default(), fast.unwrap_or_default());
    service.vanish.store(false, Ordering::Relaxed);
    let identity = format!("leader-{leader}-again-{}", t.elapsed().as_millis());
    rig.leaders[leader] = Some(rig.start_leader(&identity, None)?);
    Ok((wrote, member, fast))
}

/// The elector rig of `bench failover` and what dials its leader through the Service stand-in:
/// two Service-addressed members (default and 1 s RPC timeouts) and two engines (likewise).
/// Fields drop in declaration order: the engines and the extra members before the rig.
pub(super) struct Stage {
    engine_fast: Engine,
    /// The Service-addressed member with 1 s RPC timeouts, held for its `Drop` (which stops it).
    _fast_member: kvcache_e2e::store::Member,
    engine: Engine,
    /// The Service-addressed member with default timeouts, held for its `Drop`.
    _service_member: kvcache_e2e::store::Member,
    pub(super) rig: Rig,
    service: ServiceStandIn,
}

impl Stage {
    /// Three leader electors and two Lease-addressed members in namespace `bench`, the Service
    /// stand-in pointed at the first leader, then the Service-addressed members and engines.
    pub(super) fn start(
        kubeconfig: &std::path::Path,
        timing: LeaseTiming,
    ) -> anyhow::Result<Stage> {
        let rig = Rig::start(kubeconfig, "bench", "bench-leader", 3, 2, SEGMENT, timing)
            .context("starting three electors and two members")?;
        let first = rig.wait_leader(None, Duration::from_secs(60))?;
        rig.wait_capacity(first, 2 * SEGMENT, Duration::from_secs(60))?;
        let address = rig.leaders[first]
            .as_ref()
            .map(|s| s.address())
            .context("the first leader's slot is empty")?;
        let service = ServiceStandIn::start(address)?;
        let through_service = format!("127.0.0.1:{}", service.port);
        // A third member, dialling the Service stand-in as a `memberAddressing: Service` member does.
        let service_member = kvcache_e2e::store::Member::start(
            rig.dir(),
            &kvcache_e2e::store::MemberOptions::new(through_service.clone(), SEGMENT),
        )?;
        let mut fast_options =
            kvcache_e2e::store::MemberOptions::new(through_service.clone(), FAST_SEGMENT);
        fast_options.env = vec![
            ("MC_RPC_TIMEOUT_MS".into(), "1000".into()),
            ("MC_RPC_CONNECT_TIMEOUT_MS".into(), "1000".into()),
        ];
        let fast_member = kvcache_e2e::store::Member::start(rig.dir(), &fast_options)?;
        let engine = Engine::start(rig.dir(), "engine", &through_service, &[])?;
        // The same engine with the client's RPC timeouts (read by the 0.3.13.post1 client's master
        // pool; built-in 30 s each) set to 1 s.
        let engine_fast = Engine::start(
            rig.dir(),
            "engine-rpc-timeout-1s",
            &through_service,
            &[
                ("MC_RPC_TIMEOUT_MS", "1000"),
                ("MC_RPC_CONNECT_TIMEOUT_MS", "1000"),
            ],
        )?;
        Ok(Stage {
            engine_fast,
            _fast_member: fast_member,
            engine,
            _service_member: service_member,
            rig,
            service,
        })
    }
}

/// The leader-loss rounds of `bench failover`: each round a kill -9, then a SIGTERM.
pub(super) struct Losses {
    pub(super) kill: Vec<Sample>,
    pub(super) term: Vec<Sample>,
    kill_reattach: Vec<Reattach>,
    term_reattach: Vec<Reattach>,
}

/// Creates the namespace `bench` on the control plane behind `kubeconfig`.
pub(super) fn create_bench_namespace(kubeconfig: &std::path::Path) -> anyhow::Result<()> {
    let kc = kubeconfig.to_path_buf();
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
    Ok(())
}

/// `runs` rounds of a kill -9 then a SIGTERM of the leader, each printed as it ends.
pub(super) fn leader_loss_rounds(stage: &mut Stage, runs: usize) -> anyhow::Result<Losses> {
    let mut l = Losses {
        kill: Vec::new(),
        term: Vec::new(),
        kill_reattach: Vec::new(),
        term_reattach: Vec::new(),
    };
    for round in 0..runs {
        let (k, kr) = one(&mut stage.rig, true, &stage.service, &stage.engine)?;
        l.kill.push(k);
        l.kill_reattach.push(kr);
        let (s, sr) = one(&mut stage.rig, false, &stage.service, &stage.engine)?;
        l.term.push(s);
        l.term_reattach.push(sr);
        println!(
            "round {}/{runs}: kill -9 serving {} engine answered +{} writes +{} service member +{} full {}; SIGTERM serving {} engine answered +{} writes +{} service member +{} full {}",
            round + 1,
            fmt(l.kill[round].serving),
            fmt(l.kill_reattach[round].answered),
            fmt(l.kill_reattach[round].wrote),
            fmt(l.kill_reattach[round].service_member),
            fmt(l.kill[round].full),
            fmt(l.term[round].serving),
            fmt(l.term_reattach[round].answered),
            fmt(l.term_reattach[round].wrote),
            fmt(l.term_reattach[round].service_member),
            fmt(l.term[round].full)
        );
    }
    Ok(l)
}

/// The table of time to serving and to full capacity per kind of leader loss.
pub(super) fn print_leader_loss(l: &Losses, timing: LeaseTiming, runs: usize) {
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
        ("kill -9", &l.kill, "~16 s failover"),
        ("SIGTERM", &l.term, "~30 s single-leader restart"),
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
}

/// The table of the engine's reattach per kind of leader loss.
pub(super) fn print_reattach(l: &Losses) {
    println!();
    println!(
        "Engine reattach (the SGLang stand-in's real Mooncake client dialling a loopback Service stand-in, /put every 200 ms), from the new leader serving to the first successful put:"
    );
    println!(
        "| leader loss | new leader serving → a master answers the engine: median (min–max) | → engine writes: median (min–max) | → Service-addressed member mounted: median (min–max) |"
    );
    println!("|---|---|---|---|");
    for (name, samples) in [("kill -9", &l.kill_reattach), ("SIGTERM", &l.term_reattach)] {
        let (am, alo, ahi) = stats(samples.iter().map(|r| r.answered).collect());
        let (wm, wlo, whi) = stats(samples.iter().map(|r| r.wrote).collect());
        let (sm, slo, shi) = stats(samples.iter().map(|r| r.service_member).collect());
        println!(
            "| {name} | {} ({}–{}) | {} ({}–{}) | {} ({}–{}) |",
            fmt(am),
            fmt(alo),
            fmt(ahi),
            fmt(wm),
            fmt(wlo),
            fmt(whi),
            fmt(sm),
            fmt(slo),
            fmt(shi)
        );
    }
}

/// One [`vanish_round`]: each engine's time to write (default, then 1 s RPC timeouts), the
/// default and the 1 s-timeout Service-addressed member's time to mount.
type Vanish = (Vec<Duration>, Duration, Duration);

/// `runs` [`vanish_round`]s with both engines, each printed as it ends.
pub(super) fn vanish_rounds(stage: &mut Stage, runs: usize) -> anyhow::Result<Vec<Vanish>> {
    let mut vanish = Vec::new();
    for round in 0..runs {
        let (wrote, member, fast) = vanish_round(
            &mut stage.rig,
            &stage.service,
            &[&stage.engine, &stage.engine_fast],
        )?;
        println!(
            "vanish round {}/{runs}: engine writes +{} (default RPC timeouts), +{} (MC_RPC_TIMEOUT_MS=1000, MC_RPC_CONNECT_TIMEOUT_MS=1000); Service-addressed member mounted +{} (default), +{} (1 s timeouts)",
            round + 1,
            fmt(wrote[0]),
            fmt(wrote[1]),
            fmt(member),
            fmt(fast)
        );
        vanish.push((wrote, member, fast));
    }
    Ok(vanish)
}

/// The one-row table of the vanish rounds.
pub(super) fn print_vanish(vanish: &[Vanish]) {
    println!(
        "| kill -9, old leader's address vanishes | new leader serving → engine writes, default RPC timeouts | → engine writes, MC_RPC_TIMEOUT_MS=MC_RPC_CONNECT_TIMEOUT_MS=1000 | → Service-addressed member mounted, default timeouts | → Service-addressed member mounted, 1 s timeouts |"
    );
    println!("|---|---|---|---|---|");
    let (dm, dlo, dhi) = stats(vanish.iter().map(|v| v.0[0]).collect());
    let (fm, flo, fhi) = stats(vanish.iter().map(|v| v.0[1]).collect());
    let (mm, mlo, mhi) = stats(vanish.iter().map(|v| v.1).collect());
    let (qm, qlo, qhi) = stats(vanish.iter().map(|v| v.2).collect());
    println!(
        "| median (min–max) | {} ({}–{}) | {} ({}–{}) | {} ({}–{}) | {} ({}–{}) |",
        fmt(dm),
        fmt(dlo),
        fmt(dhi),
        fmt(fm),
        fmt(flo),
        fmt(fhi),
        fmt(mm),
        fmt(mlo),
        fmt(mhi),
        fmt(qm),
        fmt(qlo),
        fmt(qhi)
    );
}
