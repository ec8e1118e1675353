//! The peer: Mooncake's own etcd-backed HA in the same master, without and with its metadata
//! operation log, on the same leader-loss rounds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use kvcache_e2e::paths;
use kvcache_e2e::process::free_port;
use kvcache_e2e::rollout::keys_local;
use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions};

use super::elector::Losses;
use super::figures::{SEGMENT, Sample, fmt, stats};

/// One etcd-HA round: to serving, to full capacity, and the keys written before the loss that
/// read back after it with their bytes (of how many).
struct EtcdSample {
    at: Sample,
    kept: (usize, usize),
}

/// The table of Mooncake's own etcd-backed HA without and with the metadata operation log
/// (`plain`, `warm`: kill -9 and SIGTERM rounds each) beside the elector's rounds `ours`.
pub(super) fn print_etcd_ha(ours: &Losses, plain: &EtcdRounds, warm: &EtcdRounds, runs: usize) {
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
pub(super) struct EtcdRounds {
    kill: Vec<EtcdSample>,
    term: Vec<EtcdSample>,
}

/// Leader loss under Mooncake's own HA, with the metadata operation log when `oplog`: kill -9
/// and SIGTERM rounds, to a standby serving, to full capacity on it, and how many of the keys
/// written just before the loss read back with their bytes after it.
pub(super) fn etcd_ha(runs: usize, oplog: bool) -> anyhow::Result<EtcdRounds> {
    let dir = paths::scratch(if oplog {
        "bench-etcd-oplog"
    } else {
        "bench-etcd-ha"
    })?;
    let (etcd, client) = kvcache_e2e::cluster::start_etcd(&paths::k8s_bin()?, &dir)?;
    let entry = format!("etcd://127.0.0.1:{client}");
    let (mut masters, slots) = start_masters(&dir, client, oplog)?;
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
    let mut round = |hard: bool| {
        written += 1;
        etcd_round(&mut masters, &slots, &entry, written, hard)
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

/// A master's folder and options, to start it again.
type Slot = (PathBuf, MasterOptions);

/// The three masters of the etcd-backed HA, electing through the etcd at `127.0.0.1:client`
/// (with the metadata operation log when `oplog`), each in its own folder under `dir`; and each
/// slot's folder and options, to start it again.
fn start_masters(
    dir: &Path,
    client: u16,
    oplog: bool,
) -> anyhow::Result<(Vec<Option<Master>>, Vec<Slot>)> {
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
    Ok((masters, slots))
}

/// One etcd-HA round: [`WARM_KEYS`] keys written (their names from `round`), the serving
/// master lost (kill -9 when `hard`, else SIGTERM), the time to a standby serving and to full
/// capacity on it, the keys read back; the lost master started again as a standby.
fn etcd_round(
    masters: &mut [Option<Master>],
    slots: &[Slot],
    entry: &str,
    round: usize,
    hard: bool,
) -> anyhow::Result<EtcdSample> {
    let leader = wait_serving(masters, None, Duration::from_secs(60))?;
    masters[leader]
        .as_ref()
        .context("the serving master")?
        .wait_capacity(2 * SEGMENT, Duration::from_secs(60))?;
    let prefix = format!("round-{round}");
    let put = keys_local(entry, "put", &prefix, WARM_KEYS, WARM_KEY_BYTES)?;
    anyhow::ensure!(put.ok == WARM_KEYS, "writing the round's keys: {put:?}");
    let t = Instant::now();
    let mut lost = masters[leader].take().context("the serving master")?;
    if hard {
        lost.proc.kill();
    } else {
        lost.proc.stop(Duration::from_secs(30));
    }
    let next = wait_serving(masters, Some(leader), Duration::from_secs(60))?;
    let serving = t.elapsed();
    masters[next]
        .as_ref()
        .context("the new serving master")?
        .wait_capacity(2 * SEGMENT, Duration::from_secs(60))?;
    let full = t.elapsed();
    let read = keys_local(entry, "get", &prefix, WARM_KEYS, WARM_KEY_BYTES)?;
    anyhow::ensure!(read.wrong == 0, "a key read back other bytes: {read:?}");
    drop(lost);
    let (d, o) = &slots[leader];
    masters[leader] = Some(Master::start(d, o.clone())?);
    Ok(EtcdSample {
        at: Sample { serving, full },
        kept: (read.ok, WARM_KEYS),
    })
}
