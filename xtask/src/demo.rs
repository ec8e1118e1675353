//! `cargo xtask demo`: the seed walkthrough for real on this machine. A control plane with two
//! real nodes (the images built locally and loaded), the operator installed from
//! `deploy/operator.yaml`, then `examples/walkthrough` applied in creation order at demo size
//! (`capacityPerMember: 256Mi` on 2 nodes, roles of 250m / 384Mi), showing at each step what a
//! user sees with the `kubectl` built from the same Kubernetes module; then the HA step. A
//! progress line per step with its duration, a summary, and the cluster torn down unless
//! `--keep`.

mod disk;
mod engine;
mod ha;
mod kubectl;
mod leader;
mod manifests;
mod model;
mod operator;
mod store;

use std::path::Path;
use std::time::Instant;

use crate::setup;

use disk::the_disk_tier;
use ha::high_availability;
use kubectl::Demo;
use manifests::{disk_manifest, manifests};
use model::the_model;
use operator::{install, kept_leading, operator_leadership};
use store::{the_pool_and_binding, the_store};

pub fn demo(keep: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    setup::all()?;
    let dir = kvcache_e2e::paths::scratch("demo")?;
    let files = manifests(&dir.join("walkthrough"))?;
    let mut demo = Demo {
        kubeconfig: setup::cache_dir().join("run/cluster/kubeconfig"),
        steps: Vec::new(),
    };
    let disk = disk_manifest(&dir)?;
    let result = run(&mut demo, &files, &disk);
    println!();
    println!("Summary ({:.0}s in all):", started.elapsed().as_secs_f64());
    for (title, took) in &demo.steps {
        println!("  {:>6.1}s  {title}", took.as_secs_f64());
    }
    match (&result, keep) {
        (Ok(()), true) | (Err(_), true) => {
            println!();
            println!("The cluster keeps running:");
            println!("  export KUBECONFIG={}", demo.kubeconfig.display());
            println!("  export PATH={}:$PATH", setup::k8s_bin_dir().display());
            println!("  cargo xtask cluster down   # to stop it");
        }
        _ => {
            crate::cluster::down()?;
        }
    }
    result
}

/// The walkthrough step by step, each step timed.
fn run(demo: &mut Demo, files: &Path, disk: &Path) -> anyhow::Result<()> {
    demo.step(
        "cluster: a control plane and 2 real nodes, the images loaded",
        // NetworkPolicy enforced: the store the demo shows is the isolated one.
        |_| crate::cluster::up(2, true, true),
    )?;
    demo.step("install: kubectl apply -f deploy/operator.yaml", install)?;
    let installed = operator_leadership(demo)?;
    demo.step(
        "1. the store: KVCacheBackend mooncake-dram (2 members of 256Mi)",
        |d| the_store(d, files),
    )?;
    demo.step("2. the pool and the Binding for team-a", |d| {
        the_pool_and_binding(d, files)
    })?;
    demo.step(
        "3. the model: ModelDeployment qwen-chat (2 real vLLM replicas sharing blocks through the store)",
        |d| the_model(d, files),
    )?;
    demo.step(
        "4. high availability: leader.replicas 3, then the leader Pod deleted",
        high_availability,
    )?;
    demo.step("5. the disk tier: a group with a thin segment and a local-disk tier (examples/disk-heavy), its pool and Binding, filled", |d| the_disk_tier(d, disk))?;
    demo.step(
        "6. the operator kept its Lease while the engines prefilled",
        |d| kept_leading(d, &installed),
    )?;
    Ok(())
}
