//! `cargo xtask bench failover`: how long the store is without a serving leader, and without its
//! full capacity, after the leader is lost; measured on loopback against the real API server and
//! real store processes, several runs, median and spread. Beside it, engines reattaching: an
//! engine stand-in and Service-addressed members dialling a loopback Service stand-in, from the
//! new leader serving to the engine's first successful put and to the members mounted, including
//! a round where the old leader's address vanishes without closing its connections.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use kvcache_e2e::cluster::{ControlPlane, Options, block_on, client_from};
use kvcache_e2e::failover::{LeaseTiming, Rig};
use kvcache_e2e::paths;
use kvcache_e2e::process::{Proc, free_port};

const SEGMENT: u64 = 64 << 20;
/// The segment of the Service-addressed member with 1 s RPC timeouts (a size of its own, to tell
/// it apart in the master's capacity).
const FAST_SEGMENT: u64 = 32 << 20;

struct Sample {
    serving: Duration,
    full: Duration,
}

/// Where an engine reaches the store: a stand-in for the leader's Service, a loopback TCP
/// forwarder that sends each new connection to the current leader's master (as kube-proxy sends a
/// new connection to a Ready endpoint) and leaves open connections alone.
struct ServiceStandIn {
    port: u16,
    target: Arc<Mutex<String>>,
    /// When set, a connection whose master went away is not closed towards the client: the
    /// client's requests go unanswered, as when a leader Pod's address vanishes with its node
    /// (no FIN, no RST reaches the client).
    vanish: Arc<AtomicBool>,
}

impl ServiceStandIn {
    fn start(target: String) -> anyhow::Result<ServiceStandIn> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the Service stand-in")?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(Mutex::new(target));
        let vanish = Arc::new(AtomicBool::new(false));
        let (t, v) = (target.clone(), vanish.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let to = t.lock().map(|g| g.clone()).unwrap_or_default();
                let v = v.clone();
                std::thread::spawn(move || {
                    let Ok(upstream) = TcpStream::connect(&to) else {
                        return;
                    };
                    pipe(client, upstream, &v);
                });
            }
        });
        Ok(ServiceStandIn {
            port,
            target,
            vanish,
        })
    }

    /// The endpoint switch: new connections go to `to`.
    fn point_at(&self, to: String) {
        if let Ok(mut g) = self.target.lock() {
            *g = to;
        }
    }
}

/// Copies both ways until either side closes, then closes both; with `vanish` set when the
/// master's side ends, the client's side is held open and what it sends is dropped until it
/// gives up.
fn pipe(client: TcpStream, upstream: TcpStream, vanish: &Arc<AtomicBool>) {
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let v = vanish.clone();
    let back = std::thread::spawn(move || {
        let (mut from, mut to) = (u2, c2);
        let _ = std::io::copy(&mut from, &mut to);
        let _ = from.shutdown(Shutdown::Both);
        if !v.load(Ordering::Relaxed) {
            let _ = to.shutdown(Shutdown::Both);
        }
    });
    let (mut from, mut to) = (client, upstream);
    let _ = std::io::copy(&mut from, &mut to);
    if vanish.load(Ordering::Relaxed) {
        let _ = std::io::copy(&mut from, &mut std::io::sink());
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    let _ = back.join();
}

/// The engine stand-in (`images/engine/standin.py` as SGLang, the real Mooncake client) dialling
/// the Service stand-in.
struct Engine {
    _proc: Proc,
    port: u16,
}

impl Engine {
    fn start(
        dir: &std::path::Path,
        name: &str,
        master: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Engine> {
        let port = free_port()?;
        let standin = paths::workspace_root().join("images/engine");
        let mut cmd = std::process::Command::new(paths::mooncake_venv()?.join("bin/python"));
        cmd.current_dir(dir).args([
            "-c",
            &format!(
                "import sys; sys.path.insert(0, {:?}); import standin; standin.main('sglang', ['--hicache-storage-backend', 'mooncake', '--port', '{port}'])",
                standin.display().to_string()
            ),
        ]);
        kvcache_e2e::store::loopback_env(&mut cmd);
        cmd.env("MOONCAKE_MASTER", master)
            .env("STANDIN_BLOCK_BYTES", "4096")
            .envs(env.iter().copied());
        let log = dir.join(format!("{name}.log"));
        let proc = Proc::spawn(name, cmd, &log)?;
        let engine = Engine { _proc: proc, port };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !engine.put("boot-check") {
            anyhow::ensure!(
                Instant::now() < deadline,
                "waited 90s for the engine stand-in's first successful /put (log: {})",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(engine)
    }

    /// One 4 KiB put through the store; whether the store took it.
    fn put(&self, key: &str) -> bool {
        put_rc(self.port, key) == Some(0)
    }
}

/// The store's answer to one 4 KiB put through the engine stand-in on `port` (`None` when the
/// stand-in did not answer within 5 s).
fn put_rc(port: u16, key: &str) -> Option<i64> {
    kvcache_e2e::store::http_get(&format!("http://127.0.0.1:{port}/put?key={key}&size=4096"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["rc"].as_i64())
}

/// Mooncake's `RPC_FAIL`: the client did not reach a master.
const RPC_FAIL: i64 = -900;

/// What the engine saw after the leader was lost, each time from the loss.
struct Reattach {
    /// The first put a master answered (with anything but `RPC_FAIL`): the client reconnected.
    answered: Duration,
    /// The first put the store took.
    wrote: Duration,
    /// The member that dials the Service stand-in (`memberAddressing: Service`, the default)
    /// mounted on the new master.
    service_member: Duration,
}

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

pub(crate) fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let median = v[v.len() / 2];
    (median, v[0], v[v.len() - 1])
}

pub(crate) fn fmt(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// Polls the engine's `/put` every 200 ms from the leader's loss `t` until one succeeds.
fn engine_writes(port: u16, t: Instant, within: Duration) -> anyhow::Result<Reattach> {
    let mut n = 0u64;
    let mut answered = None;
    loop {
        n += 1;
        let rc = put_rc(port, &format!("reattach-{}-{n}", t.elapsed().as_millis()));
        if rc.is_some_and(|rc| rc != RPC_FAIL) && answered.is_none() {
            answered = Some(t.elapsed());
        }
        if rc == Some(0) {
            let wrote = t.elapsed();
            return Ok(Reattach {
                answered: answered.unwrap_or(wrote),
                wrote,
                service_member: Duration::ZERO,
            });
        }
        anyhow::ensure!(
            t.elapsed() < within,
            "waited {within:?} for the engine stand-in's first successful /put after the leader was lost (last answer {rc:?})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
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
struct Stage {
    engine_fast: Engine,
    /// The Service-addressed member with 1 s RPC timeouts, held for its `Drop` (which stops it).
    _fast_member: kvcache_e2e::store::Member,
    engine: Engine,
    /// The Service-addressed member with default timeouts, held for its `Drop`.
    _service_member: kvcache_e2e::store::Member,
    rig: Rig,
    service: ServiceStandIn,
}

impl Stage {
    /// Three leader electors and two Lease-addressed members in namespace `bench`, the Service
    /// stand-in pointed at the first leader, then the Service-addressed members and engines.
    fn start(kubeconfig: &std::path::Path, timing: LeaseTiming) -> anyhow::Result<Stage> {
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
struct Losses {
    kill: Vec<Sample>,
    term: Vec<Sample>,
    kill_reattach: Vec<Reattach>,
    term_reattach: Vec<Reattach>,
}

/// Creates the namespace `bench` on the control plane behind `kubeconfig`.
fn create_bench_namespace(kubeconfig: &std::path::Path) -> anyhow::Result<()> {
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
fn leader_loss_rounds(stage: &mut Stage, runs: usize) -> anyhow::Result<Losses> {
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
fn print_leader_loss(l: &Losses, timing: LeaseTiming, runs: usize) {
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
fn print_reattach(l: &Losses) {
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
fn vanish_rounds(stage: &mut Stage, runs: usize) -> anyhow::Result<Vec<Vanish>> {
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
fn print_vanish(vanish: &[Vanish]) {
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

/// One etcd-HA round: to serving, to full capacity, and the keys written before the loss that
/// read back after it with their bytes (of how many).
struct EtcdSample {
    at: Sample,
    kept: (usize, usize),
}

/// The table of Mooncake's own etcd-backed HA without and with the metadata operation log
/// (`plain`, `warm`: kill -9 and SIGTERM rounds each) beside the elector's rounds `ours`.
fn print_etcd_ha(ours: &Losses, plain: &EtcdRounds, warm: &EtcdRounds, runs: usize) {
    println!();
    println!(
        "Leader loss three ways, 2 members of {} MiB, {runs} runs each, {WARM_KEYS} keys of {} KiB written before each loss: the elector (Lease, cold), Mooncake's etcd HA (3 masters), and the same with --enable_oplog=true (warm):",
        SEGMENT >> 20,
        WARM_KEY_BYTES >> 10
    );
    println!(
        "| leader loss | mode | to serving median (min–max) | to full capacity median (min–max) | keys kept (all rounds) |"
    );
    println!("|---|---|---|---|---|");
    for (name, ours, plain, warm) in [
        ("kill -9", &ours.kill, &plain.kill, &warm.kill),
        ("SIGTERM", &ours.term, &plain.term, &warm.term),
    ] {
        let (om, olo, ohi) = stats(ours.iter().map(|s| s.serving).collect());
        let (fm, flo, fhi) = stats(ours.iter().map(|s| s.full).collect());
        println!(
            "| {name} | elector (Lease) | {} ({}–{}) | {} ({}–{}) | none (cold by design) |",
            fmt(om),
            fmt(olo),
            fmt(ohi),
            fmt(fm),
            fmt(flo),
            fmt(fhi)
        );
        for (mode, rounds) in [("etcd HA", plain), ("etcd HA + oplog (warm)", warm)] {
            let (sm, slo, shi) = stats(rounds.iter().map(|s| s.at.serving).collect());
            let (fm, flo, fhi) = stats(rounds.iter().map(|s| s.at.full).collect());
            let kept: usize = rounds.iter().map(|s| s.kept.0).sum();
            let of: usize = rounds.iter().map(|s| s.kept.1).sum();
            println!(
                "| {name} | {mode} | {} ({}–{}) | {} ({}–{}) | {kept} of {of} ({:.0}%) |",
                fmt(sm),
                fmt(slo),
                fmt(shi),
                fmt(fm),
                fmt(flo),
                fmt(fhi),
                100.0 * kept as f64 / of.max(1) as f64
            );
        }
    }
}

/// `cargo xtask bench failover`: leader loss (kill -9 and SIGTERM) under the elector on a bare
/// control plane, the engine's and the Service-addressed members' reattach, the old leader's
/// address vanishing, then Mooncake's own etcd-backed HA on the same rounds as a peer.
pub fn failover(runs: usize) -> anyhow::Result<()> {
    let dir = paths::scratch("bench-cluster")?;
    let cp = ControlPlane::start(
        &dir,
        &Options {
            controllers: false,
            reaper: true,
            advertise: None,
        },
    )?;
    create_bench_namespace(&cp.kubeconfig)?;
    let timing = LeaseTiming::default();
    let mut stage = Stage::start(&cp.kubeconfig, timing)?;
    let losses = leader_loss_rounds(&mut stage, runs)?;
    print_leader_loss(&losses, timing, runs);
    print_reattach(&losses);
    let vanish = vanish_rounds(&mut stage, runs)?;
    print_vanish(&vanish);
    println!("engine logs: {}", stage.rig.dir().display());
    drop(stage);
    drop(cp);

    // The peers on the same rig: Mooncake's own etcd-backed HA (three masters electing through
    // etcd, members dialling `etcd://`), the same two members, the same rounds; then the same
    // with the metadata operation log, what `electionBackend: Etcd` runs.
    let plain = etcd_ha(runs, false)?;
    let warm = etcd_ha(runs, true)?;
    print_etcd_ha(&losses, &plain, &warm, runs);
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

/// Keys written before each etcd-HA round's loss and read back after it.
const WARM_KEYS: usize = 20;
/// Their size.
const WARM_KEY_BYTES: usize = 512 << 10;

/// The kill -9 and SIGTERM rounds of one etcd-HA mode.
struct EtcdRounds {
    kill: Vec<EtcdSample>,
    term: Vec<EtcdSample>,
}

/// Leader loss under Mooncake's own HA, with the metadata operation log when `oplog`: kill -9
/// and SIGTERM rounds, to a standby serving, to full capacity on it, and how many of the keys
/// written just before the loss read back with their bytes after it.
fn etcd_ha(runs: usize, oplog: bool) -> anyhow::Result<EtcdRounds> {
    use kvcache_e2e::rollout::keys_local;
    use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions};
    let dir = paths::scratch(if oplog {
        "bench-etcd-oplog"
    } else {
        "bench-etcd-ha"
    })?;
    let (etcd, client) = kvcache_e2e::cluster::start_etcd(&paths::k8s_bin()?, &dir)?;
    let entry = format!("etcd://127.0.0.1:{client}");
    let options = || -> anyhow::Result<MasterOptions> {
        let mut extra_args = vec![
            "--enable_ha=true".into(),
            "--ha_backend_type=etcd".into(),
            format!("--etcd_endpoints=127.0.0.1:{client}"),
        ];
        if oplog {
            extra_args.push("--enable_oplog=true".into());
        }
        Ok(MasterOptions {
            client_ttl: Some(3),
            extra_args,
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
                &MemberOptions::new(entry.clone(), SEGMENT),
            )?)
        })
        .collect::<anyhow::Result<_>>()?;
    let mut written = 0;
    let mut round = |hard: bool| -> anyhow::Result<EtcdSample> {
        let leader = wait_serving(&masters, None, Duration::from_secs(60))?;
        masters[leader]
            .as_ref()
            .context("the serving master")?
            .wait_capacity(2 * SEGMENT, Duration::from_secs(60))?;
        written += 1;
        let prefix = format!("round-{written}");
        let put = keys_local(&entry, "put", &prefix, WARM_KEYS, WARM_KEY_BYTES)?;
        anyhow::ensure!(put.ok == WARM_KEYS, "writing the round's keys: {put:?}");
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
        let read = keys_local(&entry, "get", &prefix, WARM_KEYS, WARM_KEY_BYTES)?;
        anyhow::ensure!(read.wrong == 0, "a key read back other bytes: {read:?}");
        drop(lost);
        let (d, o) = &slots[leader];
        masters[leader] = Some(Master::start(d, o.clone())?);
        Ok(EtcdSample {
            at: Sample { serving, full },
            kept: (read.ok, WARM_KEYS),
        })
    };
    let mut kill = Vec::new();
    let mut term = Vec::new();
    for r in 0..runs {
        kill.push(round(true)?);
        term.push(round(false)?);
        println!(
            "etcd HA{} round {}/{runs}: kill -9 serving {} full {} kept {}/{WARM_KEYS}; SIGTERM serving {} full {} kept {}/{WARM_KEYS}",
            if oplog { " + oplog" } else { "" },
            r + 1,
            fmt(kill[r].at.serving),
            fmt(kill[r].at.full),
            kill[r].kept.0,
            fmt(term[r].at.serving),
            fmt(term[r].at.full),
            term[r].kept.0
        );
    }
    drop(members);
    drop(masters);
    drop(etcd);
    Ok(EtcdRounds { kill, term })
}
