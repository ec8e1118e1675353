//! `cargo xtask cluster up|down|status|env` and `cargo xtask store up|down`: the local control
//! plane and a local store, left running for the demo and for trying things by hand.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use kvcache_e2e::cluster::{ControlPlane, Options, block_on, client_from, install_crds};
use kvcache_e2e::nodes::{NodeNetwork, Nodes};
use kvcache_e2e::process::{alive, stop_pids};
use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions};

use crate::crds::root;
use crate::setup::{self, cache_dir};

fn state_dir(what: &str) -> PathBuf {
    cache_dir().join("run").join(what)
}

fn read_pids(what: &str) -> Vec<u32> {
    std::fs::read_to_string(state_dir(what).join("pids"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn write_pids(dir: &std::path::Path, pids: &[u32]) -> std::io::Result<()> {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    std::fs::write(dir.join("pids"), list.join(" "))
}

fn running(what: &str) -> bool {
    let pids = read_pids(what);
    !pids.is_empty() && pids.iter().all(|p| alive(*p))
}

/// Starts the control plane and `nodes` nodes (sized for the real engine with `real_engine`),
/// enforcing NetworkPolicy on them with `enforce`.
pub fn up(nodes: usize, real_engine: bool, enforce: bool) -> anyhow::Result<()> {
    if running("cluster") {
        println!("the control plane is already running");
        return env();
    }
    // The harness finds the parts in the same default cache `setup` installs into.
    setup::all()?;
    let dir = state_dir("cluster");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let net = NodeNetwork::plan()?;
    let cp = ControlPlane::start(
        &dir,
        &Options {
            controllers: true,
            reaper: false,
            advertise: (nodes > 0).then(|| net.host_ip.clone()),
        },
    )?;
    let kubeconfig = cp.kubeconfig.clone();
    let crds = root().join("deploy/crds");
    let names = block_on(async move {
        let client = client_from(&kubeconfig).await?;
        install_crds(&client, &crds).await
    })?;
    let server = cp.server.clone();
    if nodes > 0 {
        let started = std::time::Instant::now();
        let mut n = if real_engine {
            Nodes::start_sized(
                &cp,
                &net,
                nodes,
                &dir,
                kvcache_e2e::images::WITH_VLLM,
                kvcache_e2e::nodes::ENGINE_NODE_ALLOCATABLE_MEMORY,
            )?
        } else {
            Nodes::start(&cp, &net, nodes, &dir)?
        };
        if enforce {
            n.enforce_network_policy()?;
        }
        let names: Vec<String> = n
            .nodes
            .iter()
            .map(|n| format!("{} ({})", n.name, n.ip))
            .collect();
        std::fs::write(dir.join("nodes-teardown"), n.teardown.display().to_string())?;
        let node_pids = n.detach();
        let list: Vec<String> = node_pids.iter().map(u32::to_string).collect();
        std::fs::write(dir.join("node-pids"), list.join(" "))?;
        println!(
            "{nodes} nodes Ready in {:.1?}: {}{}",
            started.elapsed(),
            names.join(", "),
            if enforce {
                "; NetworkPolicy enforced (kube-router's firewall)"
            } else {
                "; NetworkPolicy not enforced (--no-network-policy)"
            }
        );
    }
    let pids = cp.detach();
    write_pids(&dir, &pids)?;
    println!(
        "control plane up at {server} (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; pids {pids:?})"
    );
    println!("CRDs installed: {}", names.join(", "));
    println!("logs: {}", dir.display());
    env()
}

pub fn down() -> anyhow::Result<()> {
    let dir = state_dir("cluster");
    if let Ok(text) = std::fs::read_to_string(dir.join("node-pids")) {
        let pids: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        stop_pids(&pids, Duration::from_secs(5));
        let _ = std::fs::remove_file(dir.join("node-pids"));
    }
    if let Ok(script) = std::fs::read_to_string(dir.join("nodes-teardown")) {
        let status = std::process::Command::new("sh")
            .arg(script.trim())
            .status()?;
        let _ = std::fs::remove_file(dir.join("nodes-teardown"));
        println!("nodes removed (teardown {status})");
    }
    let pids = read_pids("cluster");
    if pids.is_empty() {
        println!("no control plane recorded");
        return Ok(());
    }
    // Controllers first, etcd last.
    let mut reversed = pids.clone();
    reversed.reverse();
    for pid in reversed {
        stop_pids(&[pid], Duration::from_secs(5));
    }
    let _ = std::fs::remove_file(state_dir("cluster").join("pids"));
    println!("control plane stopped (pids {pids:?})");
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    let pids = read_pids("cluster");
    if pids.is_empty() {
        bail!("no control plane: run `cargo xtask cluster up`");
    }
    let names = [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ];
    for (pid, name) in pids.iter().zip(names) {
        println!(
            "{name:<24} pid {pid:<8} {}",
            if alive(*pid) { "running" } else { "GONE" }
        );
    }
    let kubeconfig = state_dir("cluster").join("kubeconfig");
    let version = block_on(async move {
        let client = client_from(&kubeconfig).await?;
        Ok(client.apiserver_version().await?.git_version)
    });
    match version {
        Ok(v) => println!("API server answers: {v}"),
        Err(e) => bail!("the API server does not answer: {e}"),
    }
    let kubeconfig = state_dir("cluster").join("kubeconfig");
    let nodes = block_on(async move {
        let client = client_from(&kubeconfig).await?;
        let list = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
            .list(&Default::default())
            .await?;
        Ok(list
            .items
            .into_iter()
            .map(|n| {
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                    .map_or("Unknown".to_owned(), |c| c.status.clone());
                format!("{:<24} Ready={ready}", n.metadata.name.unwrap_or_default())
            })
            .collect::<Vec<_>>())
    })?;
    if nodes.is_empty() {
        println!("no nodes (cargo xtask cluster up --nodes N starts some)");
    }
    for n in nodes {
        println!("node {n}");
    }
    Ok(())
}

pub fn env() -> anyhow::Result<()> {
    let kubeconfig = state_dir("cluster").join("kubeconfig");
    if !kubeconfig.exists() {
        bail!("no control plane: run `cargo xtask cluster up`");
    }
    println!("export KUBECONFIG={}", kubeconfig.display());
    // kubectl is built by setup from the same Kubernetes module as the cluster.
    println!(
        "export PATH={}:$PATH",
        crate::setup::k8s_bin_dir().display()
    );
    Ok(())
}

pub fn store_up(members: usize, segment_mib: u64) -> anyhow::Result<()> {
    if running("store") {
        bail!("a store is already running: `cargo xtask store down` first");
    }
    setup::all()?;
    let dir = state_dir("store");
    std::fs::create_dir_all(&dir)?;
    let master = Master::start(&dir, MasterOptions::default())?;
    let address = master.address();
    let admin = master.admin_url();
    let mut pids = vec![];
    let opts = MemberOptions::new(address.clone(), segment_mib << 20);
    let mut started = Vec::new();
    for _ in 0..members {
        started.push(Member::start(&dir, &opts)?);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let want = members as u64 * (segment_mib << 20);
    while master.capacity_bytes().unwrap_or(0) < want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let capacity = master.capacity_bytes()?;
    pids.push(master.detach());
    pids.extend(started.into_iter().map(|m| m.proc.detach()));
    write_pids(&dir, &pids)?;
    println!(
        "store up: master {address} (admin {admin}), {members} members, capacity {capacity} bytes; logs in {}",
        dir.display()
    );
    Ok(())
}

pub fn store_down() -> anyhow::Result<()> {
    let pids = read_pids("store");
    stop_pids(&pids, Duration::from_secs(5));
    let _ = std::fs::remove_file(state_dir("store").join("pids"));
    println!("store stopped (pids {pids:?})");
    Ok(())
}
