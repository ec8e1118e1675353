//! Step 5: the disk tier, a group with a thin segment and a local-disk tier on each node, filled
//! through a store client.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use kvcache_api::pool::binding_conditions::QUOTA_GRANTED;

use crate::setup;

use super::kubectl::{Demo, NS};
use super::leader::leader_metrics;

/// The uid the store image runs as (what a tier folder must be writable by).
const STORE_UID: u32 = 65532;

/// The disk-heavy example at demo size, filled through a store client until the store's tier
/// figure moves (CAPACITY does not: it is capacity, not usage).
pub(super) fn the_disk_tier(d: &mut Demo, disk: &Path) -> anyhow::Result<()> {
    let nodes = tier_folders()?;
    d.show(&["apply", "-f", &disk.display().to_string()])?;
    d.wait(
        "the disk backend Ready with its two 32Mi segments and two 1Gi tiers",
        &[
            "get",
            "kvcb",
            "mooncake-disk",
            "-o",
            "jsonpath={.status.phase} {.status.capacity.memory} {.status.capacity.disk}",
        ],
        Duration::from_secs(300),
        |s| s == "Ready 64Mi 2Gi",
    )?;
    println!(
        "CAPACITY is capacity, not usage: the two segments (64Mi) plus the two tiers' declared 1Gi:"
    );
    d.show(&["get", "kvcb"])?;
    d.wait_condition(
        "team-a",
        "kvcpb/team-a-disk",
        QUOTA_GRANTED,
        "the disk pool's tenant registered",
        Duration::from_secs(180),
    )?;
    d.show(&["-n", "team-a", "get", "kvcpb"])?;
    fill_the_tier(d)?;
    let buckets: usize = nodes
        .iter()
        .map(|h| count_buckets(&h.join("var/lib/kvcache")))
        .sum();
    println!("bucket files under /var/lib/kvcache on the nodes: {buckets}");
    println!(
        "CAPACITY has not moved (capacity, not usage); how full the tier is shows only in the store's own figure:"
    );
    d.show(&["get", "kvcb", "mooncake-disk"])?;
    Ok(())
}

/// The tier folder on each node, owned by the store image's user (what the docs ask:
/// `install -d -o 65532 -g 0 -m 0750 /var/lib/kvcache`); returns the nodes' roots.
fn tier_folders() -> anyhow::Result<Vec<PathBuf>> {
    let nodes = node_roots()?;
    for host in &nodes {
        let tier = host.join("var/lib/kvcache");
        std::fs::create_dir_all(&tier)?;
        std::os::unix::fs::chown(&tier, Some(STORE_UID), Some(0))?;
        std::fs::set_permissions(&tier, std::os::unix::fs::PermissionsExt::from_mode(0o750))?;
    }
    println!("on each node: install -d -o {STORE_UID} -g 0 -m 0750 /var/lib/kvcache");
    Ok(nodes)
}

/// Each node's own root on the host (its private `/var/lib/kvcache` lives under it).
fn node_roots() -> anyhow::Result<Vec<PathBuf>> {
    let dir = setup::cache_dir().join("run/cluster");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let host = e?.path().join("host");
        if host.is_dir() {
            out.push(host);
        }
    }
    anyhow::ensure!(!out.is_empty(), "no node folders under {}", dir.display());
    Ok(out)
}

/// `.bucket` files under `dir`, at any depth.
fn count_buckets(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() {
                        count_buckets(&p)
                    } else {
                        usize::from(p.extension().is_some_and(|x| x == "bucket"))
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Two rounds of 56 x 1 MiB through a store client in a member Pod, until the store's tier
/// figure (`master_allocated_file_size_bytes`) moves; shows the store's figures after.
fn fill_the_tier(d: &Demo) -> anyhow::Result<()> {
    // Inside the leader's Pod: across the network its admin port answers the operator alone.
    let tier_figure = |d: &Demo| -> anyhow::Result<f64> {
        let text = leader_metrics(d, "mooncake-disk")?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("master_allocated_file_size_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0))
    };
    let before = tier_figure(d)?;
    // More than the 64Mi of segments, so the master evicts to the tier and members write
    // buckets.
    let member = d.quiet(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=mooncake-disk,app.kubernetes.io/component=member-0",
        "-o",
        "jsonpath={.items[0].metadata.name} {.items[0].status.podIP}",
    ])?;
    let mut parts = member.split_whitespace();
    let (pod, ip) = (
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or_default().to_owned(),
    );
    let master = format!("mooncake-disk-leader.{NS}.svc:50051");
    println!("writing 2 x 56 MiB through a store client in {pod}:");
    d.show(&[
        "-n",
        NS,
        "exec",
        &pod,
        "--",
        "python3",
        "-c",
        kvcache_e2e::pods::PUT_MANY,
        &master,
        &ip,
        "2",
        "56",
        "1048576",
    ])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut after = before;
    while after <= before {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the tier figure master_allocated_file_size_bytes stayed at {before} for 120 s"
        );
        std::thread::sleep(Duration::from_millis(500));
        after = tier_figure(d)?;
    }
    println!(
        "the tier figure (master_allocated_file_size_bytes) went from {before} to {after} bytes"
    );
    let text = leader_metrics(d, "mooncake-disk")?;
    for l in text.lines().filter(|l| {
        l.starts_with("master_allocated_file_size_bytes")
            || l.starts_with("master_total_file_capacity_bytes")
            || l.starts_with("master_total_capacity_bytes")
    }) {
        println!("  {l}");
    }
    Ok(())
}
