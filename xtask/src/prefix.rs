//! `cargo xtask bench prefix`: what a prompt's blocks in the store are worth to the real vLLM.
//! On two engine-sized nodes with the operator, per model (the tiny one and the prefill-heavy
//! bench model of `images/vllm/models`), three ModelDeployments of one replica each: a writer
//! and a reader attached to team-a's Binding, and the same engine with no `kvCache`. For each
//! prompt length, fresh prompts (token ids never sent before) are timed as a one-token
//! completion (the time to the first token) and as a completion of 32 tokens:
//! - `none`: the engine without the shared cache;
//! - `cold`: the reader, the store holding nothing of the prompt (a lookup that misses, then
//!   the prefill and the save);
//! - `hit`: the reader after the writer wrote the prompt (its blocks loaded from the store).
//!
//! Times are measured inside the engine's Pod (no exec or API server in them), medians over the
//! prompts. These are CPU figures of small models: the ratios are the point.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kvcache_api::ModelDeployment;
use kvcache_e2e::cluster::{self, block_on, client_from};
use kvcache_e2e::engine::{self, BENCH_MODEL, TINY_MODEL};
use kvcache_e2e::nodes::{ENGINE_NODE_ALLOCATABLE_MEMORY, NodeCluster};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::{images, paths, pods, walkthrough};

use crate::setup;

const NS: &str = "gpustack-system";
const TEAM: &str = "team-a";
const BACKEND: &str = "mooncake-dram";
const WAIT: Duration = Duration::from_secs(900);

/// The three deployments of one model: (name, attached).
const ENGINES: [(&str, bool); 3] = [("writer", true), ("reader", true), ("plain", false)];

/// One prompt length's medians, seconds.
struct Row {
    model: &'static str,
    tokens: usize,
    ttft: [f64; 3],
    total: [f64; 3],
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn prefix(lengths: &[usize], prompts: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        lengths.iter().all(|l| (32..=960).contains(l)),
        "prompt lengths must lie in 32..=960 tokens (the engines run with a 1024-token context)"
    );
    setup::all()?;
    let dir = paths::scratch("bench-prefix")?;
    let nodes =
        NodeCluster::start_sized(&dir, 2, images::WITH_VLLM, ENGINE_NODE_ALLOCATABLE_MEMORY)?;
    let kc = nodes.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        cluster::install_crds(&client, &cluster::crds_dir()).await?;
        walkthrough::ensure_namespace(&client, NS).await?;
        let mut objects = engine::walkthrough_store(1)?;
        objects.push(engine::binding(TEAM, "shared-dram", None));
        objects.push(engine::instance_type());
        let objects: Vec<DynamicObject> = objects
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()
            .map_err(|e| kvcache_e2e::Error::Invalid {
                path: "the prefix benchmark's objects".into(),
                what: "object",
                reason: e.to_string(),
            })?;
        walkthrough::apply(&client, &objects).await
    })?;
    let _operator = Operator::builder(&nodes.nodes.kubeconfig, NS)
        .on_nodes(&nodes.nodes)
        .start(&dir)?;
    let mut rows = Vec::new();
    for model in [TINY_MODEL, BENCH_MODEL] {
        let kc = nodes.control_plane.kubeconfig.clone();
        let lengths = lengths.to_vec();
        let measured = block_on(async move {
            let client = client_from(&kc).await?;
            measure(&client, model, &lengths, prompts).await
        });
        match measured {
            Ok(r) => rows.extend(r),
            // What the models before this one measured is still a result.
            Err(e) => {
                print_rows(&rows);
                return Err(anyhow::Error::from(e).context(format!("measuring {model}")));
            }
        }
    }
    print_rows(&rows);
    Ok(())
}

/// The measured rows as the README's table.
fn print_rows(rows: &[Row]) {
    println!();
    println!(
        "| model | prompt tokens | TTFT none | TTFT cold | TTFT hit | none/hit | cold/none | 32 tokens none | 32 tokens hit | none/hit |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let [n, c, h] = r.ttft;
        let [tn, _, th] = r.total;
        println!(
            "| {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} | {:.2} | {:.0} ms | {:.0} ms | {:.2} |",
            r.model,
            r.tokens,
            n * 1e3,
            c * 1e3,
            h * 1e3,
            n / h,
            c / n,
            tn * 1e3,
            th * 1e3,
            tn / th
        );
    }
}

/// Runs the three deployments of `model`, times every length, removes them.
async fn measure(
    client: &kube::Client,
    model: &'static str,
    lengths: &[usize],
    prompts: usize,
) -> Result<Vec<Row>, kvcache_e2e::Error> {
    let models: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM);
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
    let mut pod = std::collections::BTreeMap::new();
    for (name, attached) in ENGINES {
        let md = engine::model_deployment(TEAM, name, model, attached.then_some(TEAM), 1);
        models
            .patch(
                name,
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(&md),
            )
            .await?;
    }
    for (name, _) in ENGINES {
        let ready =
            pods::wait_ready(&api, &walkthrough::role_pods(name, "server"), 1, WAIT).await?;
        pod.insert(name, pods::name_of(&ready[0]).to_owned());
    }
    println!("{model}: writer, reader and plain engines Ready");
    let time = |who: &'static str, prompt: Vec<u32>, max_tokens: u32| {
        let api = api.clone();
        let p = pod[who].clone();
        async move { engine::complete(&api, &p, model, &prompt, max_tokens).await }
    };
    // One request each first: the first request of an engine pays for warming up.
    let mut seed = 10_000;
    for (name, _) in ENGINES {
        time(name, engine::prompt(seed, 64), 1).await?;
        seed += 1;
    }
    let mut rows = Vec::new();
    for &tokens in lengths {
        let (mut ttft, mut total) = ([vec![], vec![], vec![]], [vec![], vec![], vec![]]);
        for _ in 0..prompts {
            for (i, max_tokens) in [(0usize, 1u32), (1, 32)] {
                let series = if i == 0 { &mut ttft } else { &mut total };
                seed += 1;
                series[0].push(
                    time("plain", engine::prompt(seed, tokens), max_tokens)
                        .await?
                        .seconds,
                );
                seed += 1;
                series[1].push(
                    time("reader", engine::prompt(seed, tokens), max_tokens)
                        .await?
                        .seconds,
                );
                seed += 1;
                let p = engine::prompt(seed, tokens);
                let keys = engine::master_keys(client, NS, BACKEND).await?;
                time("writer", p.clone(), 1).await?;
                engine::wait_keys_above(client, NS, BACKEND, keys, "the writer's blocks").await?;
                series[2].push(time("reader", p, max_tokens).await?.seconds);
            }
        }
        let row = Row {
            model,
            tokens,
            ttft: ttft.map(median),
            total: total.map(median),
        };
        println!(
            "{model} {tokens} tokens: TTFT none {:.0} ms, cold {:.0} ms, hit {:.0} ms",
            row.ttft[0] * 1e3,
            row.ttft[1] * 1e3,
            row.ttft[2] * 1e3
        );
        rows.push(row);
    }
    for (name, _) in ENGINES {
        walkthrough::remove_model(client, TEAM, name, WAIT).await?;
    }
    Ok(rows)
}
