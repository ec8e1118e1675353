//! `cargo xtask bench failover`: how long the store is without a serving leader, and without its
//! full capacity, after the leader is lost; measured on loopback against the real API server and
//! real store processes, several runs, median and spread. Beside it, engines reattaching: an
//! engine stand-in and Service-addressed members dialling a loopback Service stand-in, from the
//! new leader serving to the engine's first successful put and to the members mounted, including
//! a round where the old leader's address vanishes without closing its connections.

mod elector;
mod etcd;
mod figures;
mod stand_in;

use kvcache_e2e::cluster::{ControlPlane, Options};
use kvcache_e2e::failover::LeaseTiming;
use kvcache_e2e::paths;

use elector::{
    Stage, create_bench_namespace, leader_loss_rounds, print_leader_loss, print_reattach,
    print_vanish, vanish_rounds,
};
use etcd::{etcd_ha, print_etcd_ha};
pub(crate) use figures::{fmt, stats};

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
