//! What the transfers cost in CPU: the store's Pods and the client's, read from their cgroups
//! around a pass.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kvcache_e2e::pods::name_of;

use crate::engine_rig::{self, BACKEND, NS};

use super::passes::store_pass;
use super::settings::{RENDERED, SIZES, Variant};

/// Bytes each CPU pass puts, then gets back, per object size (idle, the rendered setting):
/// enough that the transfers, not the client's start, make the CPU time.
pub(super) const CPU_PASS_BYTES: usize = 256 << 20;

/// What one object size costs in CPU: seconds spent by the store's members, its leader and the
/// client, over the bytes moved (put, then get back).
pub(super) struct CpuRow {
    size: usize,
    count: usize,
    /// Put and get, seconds.
    put_s: f64,
    get_s: f64,
    /// CPU seconds: members (all of them), the leader, the client's Pod.
    members: f64,
    leader: f64,
    client: f64,
}

/// The CPU seconds every store Pod of the backend and the client's Pod have used so far:
/// (members, leader, client).
async fn cpu_now(
    client: &kube::Client,
    (api, probe): (&Api<Pod>, &str),
) -> Result<(f64, f64, f64), kvcache_e2e::Error> {
    let store: Api<Pod> = Api::namespaced(client.clone(), NS);
    let leader = kvcache_render::objects::backend::leader_name(BACKEND);
    let (mut members, mut leaders) = (0.0, 0.0);
    let listed = store
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("app.kubernetes.io/instance={BACKEND}")),
        )
        .await?;
    for p in &listed.items {
        if name_of(p).contains("-etcd") {
            continue;
        }
        let used = engine_rig::pod_cpu_seconds(p)?;
        if name_of(p).starts_with(&leader) {
            leaders += used;
        } else {
            members += used;
        }
    }
    let probe = engine_rig::pod_cpu_seconds(&api.get(probe).await?)?;
    Ok((members, leaders, probe))
}

/// Per object size, a pass of [`CPU_PASS_BYTES`] with the rendered setting (one `put` and one
/// `get` per object), idle, the CPU read from the Pods' cgroups before and after; an empty pass
/// first (the client's start, its mount on the master, the store's background work over as
/// long) is taken off each.
pub(super) async fn cpu_cost(
    client: &kube::Client,
    (api, probe): (&Api<Pod>, &str),
    ip: &str,
    master: &str,
) -> Result<Vec<CpuRow>, kvcache_e2e::Error> {
    let rendered = &Variant::rendered(RENDERED, &[]).env();
    let pass = |tag: String, plan: Vec<(usize, usize)>| async move {
        let before = cpu_now(client, (api, probe)).await?;
        let rows = store_pass(api, probe, ip, master, &tag, rendered, &plan).await?;
        let after = cpu_now(client, (api, probe)).await?;
        let used = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        Ok::<_, kvcache_e2e::Error>((rows, used))
    };
    let (_, empty) = pass("cpu-empty".into(), vec![(64 << 10, 0)]).await?;
    println!(
        "cpu: an empty pass used members {:.2} s, leader {:.2} s, client {:.2} s",
        empty.0, empty.1, empty.2
    );
    let mut out = Vec::new();
    for (size, _) in SIZES {
        let count = CPU_PASS_BYTES / size;
        let (rows, used) = pass(format!("cpu-{size}"), vec![(size, count)]).await?;
        let Some(row) = rows.first() else { continue };
        if row.put_failed + row.get_failed > 0 {
            println!(
                "cpu: {count} x {} KiB: {} puts and {} gets failed; left out",
                size >> 10,
                row.put_failed,
                row.get_failed
            );
            continue;
        }
        let cpu = CpuRow {
            size,
            count,
            put_s: row.put_s,
            get_s: row.get_s,
            members: (used.0 - empty.0).max(0.0),
            leader: (used.1 - empty.1).max(0.0),
            client: (used.2 - empty.2).max(0.0),
        };
        println!(
            "cpu: {count} x {} KiB in {:.2} s: members {:.2} s, leader {:.2} s, client {:.2} s",
            size >> 10,
            cpu.put_s + cpu.get_s,
            cpu.members,
            cpu.leader,
            cpu.client
        );
        out.push(cpu);
    }
    Ok(out)
}

/// The CPU table of benches/README.md ("transfer"): CPU seconds per GB moved, and the cores a
/// member needs at 1 GB/s.
pub(super) fn print_cpu(rows: &[CpuRow]) {
    println!();
    println!(
        "| object | moved (put + get) | put | get | members, CPU s per GB | leader, CPU s per GB | client, CPU s per GB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let gb = 2.0 * (r.size * r.count) as f64 / 1e9;
        let mb = (r.size * r.count) as f64 / 1e6;
        println!(
            "| {} x {} KiB | {:.0} MB | {:.0} MB/s | {:.0} MB/s | {:.2} | {:.3} | {:.2} |",
            r.count,
            r.size >> 10,
            2.0 * mb,
            mb / r.put_s,
            mb / r.get_s,
            r.members / gb,
            r.leader / gb,
            r.client / gb
        );
    }
}
