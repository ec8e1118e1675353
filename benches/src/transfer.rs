//! `cargo xtask bench transfer`: how fast the store moves bytes between the two nodes, idle and
//! while both engines serve prompts, beside raw TCP between the same two Pods, in one run.
//!
//! On two engine-sized nodes with the operator: the walkthrough's store at the rig's sizes
//! (`walkthrough::ENGINE_RIG_STORE_CPU`), team-a's Binding, a ModelDeployment of two real vLLM
//! replicas attached to it, and two probe Pods of the store image, one pinned to each node.
//! - raw: a Python socket from the probe on node 0 to the probe on node 1 (256 MiB); each
//!   probe requests an engine's CPU (the store's client runs inside the engine's process);
//! - store: the store's own client in the probe on node 0 (no segment of its own, the master
//!   through its Service), put then get of each object size, for each transport setting of
//!   [`VARIANTS`] (the client's environment: pool, lanes, chunk size);
//! - idle: the engines up and quiet; loaded: both engines answering a loop of 480-token prompts
//!   (two streams each), as a busy inference node.
//!
//! Every setting runs [`ROUNDS`] times per condition in a rotated order; medians are printed.
//! Then what the transfers cost in CPU: per object size, one idle pass of
//! [`cpu::CPU_PASS_BYTES`] with the rendered setting, the CPU seconds of the members, the leader
//! and the client read from their Pods' cgroups around it (less those of an empty pass), per GB
//! moved: what a member's CPU request buys in transfer rate.
//!
//! Every failed put or get is counted and printed: a store error is not a fast transfer.

mod cpu;
mod passes;
mod settings;
mod tables;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::engine::{self, TINY_MODEL};
use kvcache_e2e::pods::{self, ip_of, name_of};
use kvcache_e2e::{images, walkthrough};

use crate::engine_rig::{self, BACKEND, NS, TEAM};

use cpu::{cpu_cost, print_cpu};
use passes::{raw_pass, store_pass};
use settings::{ROUNDS, SIZES, VARIANTS};
use tables::{Results, print_table};

const MODEL: &str = "served";

const WAIT: Duration = Duration::from_secs(900);

/// Each probe's CPU request: an engine's (the store's client runs inside the engine's process,
/// with its share). At 100m the probes themselves starved under load: raw TCP fell to 0.07 of
/// its idle rate, and every store figure with it.
const PROBE_CPU: &str = "500m";

/// Each member's segment: every pass's objects fit without eviction.
const SEGMENT: &str = "2Gi";

/// `leader_cpu`: the leader's CPU request in place of the rig's (`--leader-cpu`), through the
/// backend's `leader.resources`.
pub fn transfer(leader_cpu: Option<String>) -> anyhow::Result<()> {
    let rig = engine_rig::up("bench-transfer", |backend| {
        if let Some(groups) = backend["spec"]["connection"]["managed"]["members"].as_array_mut() {
            for g in groups {
                g["capacityPerMember"] = SEGMENT.into();
            }
        }
        if let Some(cpu) = leader_cpu {
            engine_rig::set_leader_cpu(backend, cpu);
        }
    })?;
    let node_names: Vec<String> = rig
        .nodes
        .nodes
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    let kc = rig.nodes.control_plane.kubeconfig.clone();
    let logs = rig.dir.join("logs");
    let kept = logs.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let measured = measure(&client, &node_names).await;
        // The master's and the members' account of every failed pass, kept past the teardown.
        engine_rig::keep_logs(&client, &kept).await;
        measured
    })?;
    println!("store and engine logs: {}", logs.display());
    Ok(())
}

/// A probe Pod of the store image pinned to `node`, sleeping until exec'd into.
fn probe(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "probe",
                "image": images::STORE.name,
                "imagePullPolicy": "Never",
                "command": ["sleep", "infinity"],
                "resources": {"requests": {"cpu": PROBE_CPU, "memory": "512Mi"}}
            }]
        }
    }))
    .expect("a Pod")
}

/// Runs the ModelDeployment and the probes, then every pass idle and under load.
async fn measure(client: &kube::Client, node_names: &[String]) -> Result<(), kvcache_e2e::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
    let [a, b] = ["probe-0", "probe-1"];
    let engines = start(client, &api, [a, b], node_names).await?;
    let ip_a = ip_of(&api.get(a).await?).unwrap_or_default().to_owned();
    let ip_b = ip_of(&api.get(b).await?).unwrap_or_default().to_owned();
    let master = format!(
        "{}:{}",
        kvcache_render::objects::backend::leader_name(BACKEND) + "." + NS + ".svc",
        kvcache_render::objects::backend::RPC_PORT
    );
    println!("engines {engines:?} Ready; probes on {node_names:?}; master {master}");

    let mut results: Results = BTreeMap::new();
    let mut raw = BTreeMap::new();
    let mut cpu = Vec::new();
    for condition in ["idle", "loaded"] {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let load = if condition == "loaded" {
            busy_engines(&api, &engines, &stop, &served).await
        } else {
            Vec::new()
        };
        let mut raws = passes(
            &api,
            (a, b),
            (&ip_a, &ip_b),
            &master,
            condition,
            &mut results,
        )
        .await?;
        if condition == "idle" {
            cpu = cpu_cost(client, (&api, a), &ip_a, &master).await?;
        }
        raws.sort_by(f64::total_cmp);
        raw.insert(condition, raws[raws.len() / 2]);
        stop.store(true, Ordering::Relaxed);
        for task in load {
            let _ = task.await;
        }
        if condition == "loaded" {
            println!(
                "loaded: the engines answered {} prompts meanwhile",
                served.load(Ordering::Relaxed)
            );
        }
    }
    print_table(&results, &raw);
    print_cpu(&cpu);
    walkthrough::remove_model(client, TEAM, MODEL, WAIT).await?;
    Ok(())
}

/// The probes, one pinned to each of `node_names`, and the ModelDeployment, until all run and
/// the store is Ready; the engine Pods' names.
async fn start(
    client: &kube::Client,
    api: &Api<Pod>,
    probes: [&str; 2],
    node_names: &[String],
) -> Result<Vec<String>, kvcache_e2e::Error> {
    for (name, node) in probes.iter().zip(node_names) {
        api.create(&PostParams::default(), &probe(name, node))
            .await?;
    }
    let md = engine::model_deployment(TEAM, MODEL, TINY_MODEL, Some(TEAM), 2);
    Api::<kvcache_api::ModelDeployment>::namespaced(client.clone(), TEAM)
        .patch(
            MODEL,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&md),
        )
        .await?;
    let engines = pods::wait_ready(api, &walkthrough::role_pods(MODEL, "server"), 2, WAIT).await?;
    let engines: Vec<String> = engines.iter().map(|p| name_of(p).to_owned()).collect();
    for name in probes {
        pods::wait_pod(api, name, "the probe Running", WAIT, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await?;
    }
    engine_rig::wait_store_ready(client).await?;
    Ok(engines)
}

/// Two streams of 480-token prompts to each engine until `stop`, the answers counted in
/// `served`; returns once the engines have been busy for 10 s.
async fn busy_engines(
    api: &Api<Pod>,
    engines: &[String],
    stop: &Arc<AtomicBool>,
    served: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut load = Vec::new();
    for (i, pod) in engines.iter().enumerate() {
        for stream in 0..2u32 {
            let (api, pod, stop, served) = (api.clone(), pod.clone(), stop.clone(), served.clone());
            let mut seed = 100_000 * (1 + i as u32) + 10_000 * stream;
            load.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    seed += 1;
                    let p = engine::prompt(seed, 480);
                    if engine::complete(&api, &pod, TINY_MODEL, &p, 16)
                        .await
                        .is_ok()
                    {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    // The engines busy before the first pass.
    tokio::time::sleep(Duration::from_secs(10)).await;
    load
}

/// [`ROUNDS`] rounds under `condition`: raw TCP from the probe `a` to the probe `b`, then the
/// store's client in `a` with every setting of [`VARIANTS`] in a rotated order, each pass's
/// rows added to `results`; the raw rates.
async fn passes(
    api: &Api<Pod>,
    (a, b): (&str, &str),
    (ip_a, ip_b): (&str, &str),
    master: &str,
    condition: &'static str,
    results: &mut Results,
) -> Result<Vec<f64>, kvcache_e2e::Error> {
    let mut raws = Vec::new();
    for round in 0..ROUNDS {
        let r = raw_pass(api, (a, b), ip_b).await?;
        println!("{condition} round {round}: raw TCP {r:.0} MB/s");
        raws.push(r);
        for k in 0..VARIANTS.len() {
            let i = (k + round) % VARIANTS.len();
            let variant = VARIANTS[i].name;
            let tag = format!("{condition}-{round}-{i}");
            let env = VARIANTS[i].env();
            let rows = store_pass(api, a, ip_a, master, &tag, &env, &SIZES).await?;
            for row in &rows {
                println!(
                    "{condition} round {round} {variant}: {} x {} KiB: put {:.1} MB/s, get {:.1} MB/s, failed {}/{} ({} gone)",
                    row.count,
                    row.size >> 10,
                    row.rate(row.put_s),
                    row.rate(row.get_s),
                    row.put_failed,
                    row.get_failed,
                    row.get_gone
                );
            }
            results.entry((condition, variant)).or_default().push(rows);
        }
    }
    Ok(raws)
}
