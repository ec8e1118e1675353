//! `cargo xtask bench prefix`: what a prompt's blocks in the store are worth to the real vLLM,
//! on a quiet node and on a busy one. On two engine-sized nodes with the operator, per model
//! (by default the prefill-heavy bench model of `images/vllm/models`, 4,096 positions), three
//! ModelDeployments of one replica each: a writer and a reader attached to team-a's Binding,
//! and the same engine with no `kvCache`. For each prompt length, fresh prompts (token ids
//! never sent before) are timed as a one-token completion (the time to the first token):
//! - `none`: the engine without the shared cache (it computes the prompt);
//! - `cold`: the reader, the store holding nothing of the prompt (a lookup that misses, then
//!   the prefill and the save);
//! - `hit`: the reader after the writer wrote the prompt (its blocks loaded from the store).
//!
//! `busy`: the writer keeps answering other prompts meanwhile (two streams of 512-token
//! prompts), so every engine and the store share the cores with a prefill, as on an inference
//! node that serves. Per hit the reader's own counters are read: the prompt tokens it took from
//! the store (`vllm:prompt_tokens_by_source_total`) and its store loads (`load_get` of
//! `vllm:mooncake_store_operation_*`: time, bytes, failed keys). A hit whose load fell back to
//! recompute (vLLM's `kv_load_failure_policy: recompute` makes a failed load a prefill) is
//! counted as a fallback and left out of the hit median. Beside each row, the bound the
//! hardware sets: the bytes the hit moved at the store's measured get rate plus one decode
//! step, and the ratio that bound allows.
//!
//! Times are measured inside the engine's Pod (no exec or API server in them), medians over the
//! prompts. These are CPU figures of small models: the ratios are the point.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kvcache_api::ModelDeployment;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::engine::{self, BENCH_MODEL, TINY_MODEL};
use kvcache_e2e::{pods, walkthrough};

use crate::engine_rig::{self, BACKEND, NS, TEAM};

const WAIT: Duration = Duration::from_secs(900);

/// The three deployments of one model: (name, attached).
const ENGINES: [(&str, bool); 3] = [("writer", true), ("reader", true), ("plain", false)];

/// The reader's store load operation in vLLM's Mooncake store connector metrics.
const LOAD: &str = "load_get";

/// A model the benchmark can run, and the context its engines get.
#[derive(Clone, Copy)]
struct Model {
    path: &'static str,
    context: usize,
}

/// The models by the name `--models` takes.
fn model(name: &str) -> anyhow::Result<Model> {
    match name {
        "llama-bench" => Ok(Model {
            path: BENCH_MODEL,
            context: 4096,
        }),
        "tiny-llama" => Ok(Model {
            path: TINY_MODEL,
            context: 1024,
        }),
        other => anyhow::bail!("no model {other:?}: llama-bench or tiny-llama"),
    }
}

/// One prompt length's figures under one condition.
struct Row {
    model: &'static str,
    condition: &'static str,
    tokens: usize,
    /// Medians, seconds: none, cold, hit (valid hits only).
    ttft: [f64; 3],
    /// Hits that were whole loads, and those that fell back to computing.
    hits: usize,
    fallbacks: usize,
    /// Median bytes and seconds of the valid hits' store loads.
    load_bytes: f64,
    load_seconds: f64,
    /// One decode step of the plain engine, seconds.
    decode_step: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Each member's segment: the walkthrough's demo size (256Mi, 512 MiB in all) filled during a
/// run of four lengths quiet and busy (the timed prompts write about 360 MiB quiet, the busy
/// streams 8 MiB a prompt), and a store that evicts cannot tell a hit from an eviction: the
/// writer's timed prompt would never show as new keys. Two members of 1Gi held the run of
/// 2026-12-05 through its busy 1,024-token phase (it stopped at 2,048 for another cause).
const CAPACITY_PER_MEMBER: &str = "1Gi";

/// What `cargo xtask bench prefix` runs: its arguments, checked before anything is installed
/// or started.
pub struct Plan {
    lengths: Vec<usize>,
    prompts: usize,
    models: Vec<Model>,
    get_rate_mbs: f64,
    conditions: Vec<&'static str>,
    /// Environment added to the attached engines' containers (`--engine-env`), which wins over
    /// the injection's defaults (the store client's transport settings, say).
    engine_env: Vec<(String, String)>,
    /// Flags added to the store master's (`--leader-arg`, the backend's `leader.extraArgs`).
    leader_args: Vec<String>,
    /// The leader's CPU request (`--leader-cpu`) in place of the rig's.
    leader_cpu: Option<String>,
}

impl Plan {
    /// Checks `--lengths`, `--prompts`, `--models`, `--get-rate` and `--conditions`.
    pub fn new(
        lengths: &[usize],
        prompts: usize,
        models: &[String],
        get_rate_mbs: f64,
        conditions: &[String],
    ) -> anyhow::Result<Self> {
        let conditions: Vec<&'static str> = conditions
            .iter()
            .map(|c| match c.as_str() {
                "quiet" => Ok("quiet"),
                "busy" => Ok("busy"),
                other => Err(anyhow::anyhow!("no condition {other:?}: quiet or busy")),
            })
            .collect::<Result<_, _>>()?;
        let models: Vec<Model> = models.iter().map(|m| model(m)).collect::<Result<_, _>>()?;
        let longest = models.iter().map(|m| m.context).max().unwrap_or(0);
        anyhow::ensure!(
            lengths.iter().all(|l| (32..=longest - 32).contains(l)),
            "prompt lengths must lie in 32..={} tokens (the longest context run is {longest}; a length over a model's context is skipped for it)",
            longest - 32
        );
        Ok(Plan {
            lengths: lengths.to_vec(),
            prompts,
            models,
            get_rate_mbs,
            conditions,
            engine_env: Vec::new(),
            leader_args: Vec::new(),
            leader_cpu: None,
        })
    }

    /// Checks `--leader-cpu`: a CPU quantity the API takes.
    pub fn with_leader_cpu(mut self, cpu: Option<&str>) -> anyhow::Result<Self> {
        if let Some(c) = cpu {
            engine_rig::check_leader_cpu(c)?;
        }
        self.leader_cpu = cpu.map(str::to_owned);
        Ok(self)
    }

    /// Checks `--leader-arg`: each a master flag, `-name=value`.
    pub fn with_leader_args(mut self, args: &[String]) -> anyhow::Result<Self> {
        if let Some(bad) = args
            .iter()
            .find(|a| !a.starts_with('-') || !a.contains('='))
        {
            anyhow::bail!(
                "--leader-arg {bad:?}: give a master flag as -name=value, as -client_ttl=30"
            );
        }
        self.leader_args = args.to_vec();
        Ok(self)
    }

    /// Checks `--engine-env`: each `NAME=VALUE`, the name not empty.
    pub fn with_engine_env(mut self, pairs: &[String]) -> anyhow::Result<Self> {
        self.engine_env = pairs
            .iter()
            .map(|p| match p.split_once('=') {
                Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
                _ => Err(anyhow::anyhow!(
                    "--engine-env {p:?}: give NAME=VALUE, as MC_TCP_ENABLE_CONNECTION_POOL=0"
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(self)
    }
}

pub fn prefix(plan: Plan) -> anyhow::Result<()> {
    let Plan {
        lengths,
        prompts,
        models,
        get_rate_mbs,
        conditions,
        engine_env,
        leader_args,
        leader_cpu,
    } = plan;
    let rig = engine_rig::up("bench-prefix", |backend| {
        for g in backend["spec"]["connection"]["managed"]["members"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            g["capacityPerMember"] = CAPACITY_PER_MEMBER.into();
        }
        if let Some(cpu) = leader_cpu {
            engine_rig::set_leader_cpu(backend, cpu);
        }
        if !leader_args.is_empty() {
            backend["spec"]["connection"]["managed"]["leader"]["extraArgs"] = leader_args.into();
        }
    })?;
    let mut rows = Vec::new();
    for m in models {
        let kc = rig.nodes.control_plane.kubeconfig.clone();
        let conditions = conditions.clone();
        let engine_env = engine_env.clone();
        let lengths: Vec<usize> = lengths
            .iter()
            .copied()
            .filter(|l| *l <= m.context - 32)
            .collect();
        let logs = rig
            .dir
            .join(format!("engine-logs-{}", m.path.replace('/', "_")));
        let (measured_rows, measured) = block_on(async move {
            let client = client_from(&kc).await?;
            let mut got = Vec::new();
            let result = measure(
                &client,
                (&m, &engine_env, &logs),
                (&lengths, &conditions),
                prompts,
                &mut got,
            )
            .await;
            if result.is_err() {
                engine_rig::keep_logs(&client, &logs).await;
            }
            Ok((got, result))
        })?;
        rows.extend(measured_rows);
        match measured {
            Ok(()) => {}
            // What was measured before the failure is still a result.
            Err(e) => {
                print_rows(&rows, get_rate_mbs);
                return Err(anyhow::Error::from(e).context(format!(
                    "measuring {} (engine logs kept under {})",
                    m.path,
                    rig.dir.display()
                )));
            }
        }
    }
    print_rows(&rows, get_rate_mbs);
    println!("engine logs: {}", rig.dir.display());
    Ok(())
}

/// The measured rows as the table of benches/README.md ("prefix").
fn print_rows(rows: &[Row], rate: f64) {
    println!();
    println!(
        "| model | node | prompt tokens | TTFT none | TTFT cold | TTFT hit | none/hit | cold/none | hits (fallbacks) | loaded | load | bound: load at {rate:.0} MB/s + a decode step | none/bound |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let [n, c, h] = r.ttft;
        let bound = r.load_bytes / (rate * 1e6) + r.decode_step;
        println!(
            "| {} | {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} | {:.2} | {} ({}) | {:.1} MiB | {:.0} ms | {:.0} ms | {:.1} |",
            r.model.trim_start_matches("/models/"),
            r.condition,
            r.tokens,
            n * 1e3,
            c * 1e3,
            h * 1e3,
            n / h,
            c / n,
            r.hits,
            r.fallbacks,
            r.load_bytes / f64::from(1 << 20),
            r.load_seconds * 1e3,
            bound * 1e3,
            n / bound
        );
    }
}

/// The reader's counters that say what a request took from the store.
#[derive(Clone, Copy, Debug, Default)]
struct Reader {
    /// Prompt tokens computed or loaded, all sources.
    prompt_tokens: f64,
    /// Prompt tokens taken from the store.
    from_store: f64,
    /// The store loads' seconds, bytes, failed keys and failed calls.
    load_seconds: f64,
    load_bytes: f64,
    load_failed_keys: f64,
    load_errors: f64,
    /// vLLM's own split of a request's time, seconds: waiting to be scheduled (a request
    /// whose blocks load from the store waits there), then scheduled to its first token.
    queue_seconds: f64,
    prefill_seconds: f64,
}

/// The sum of the samples of `name` whose labels hold every `want` pair (0 without one).
fn sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    kvcache_e2e::store::metric_sum(text, name, want).unwrap_or(0.0)
}

async fn reader(client: &kube::Client, pod: &str) -> Result<Reader, kvcache_e2e::Error> {
    let text = pods::proxy_get(client, TEAM, pod, engine::PORT, "metrics").await?;
    let tokens = "vllm:prompt_tokens_by_source_total";
    let op = "vllm:mooncake_store_operation";
    Ok(Reader {
        prompt_tokens: sum(&text, tokens, &[]),
        from_store: sum(
            &text,
            tokens,
            &[("source", kvcache_render::observe::shared_cache::FROM_STORE)],
        ),
        load_seconds: sum(
            &text,
            &format!("{op}_time_seconds_sum"),
            &[("operation", LOAD)],
        ),
        load_bytes: sum(&text, &format!("{op}_bytes_total"), &[("operation", LOAD)]),
        load_failed_keys: sum(
            &text,
            &format!("{op}_failed_keys_total"),
            &[("operation", LOAD)],
        ),
        load_errors: sum(
            &text,
            &format!("{op}_total"),
            &[("operation", LOAD), ("status", "error")],
        ),
        queue_seconds: sum(&text, "vllm:request_queue_time_seconds_sum", &[]),
        prefill_seconds: sum(&text, "vllm:request_prefill_time_seconds_sum", &[]),
    })
}

/// The reader's counters once they count a request of `tokens` prompt tokens after `before`
/// (vLLM publishes them a step after the answer); a minute at most.
async fn reader_after(
    client: &kube::Client,
    pod: &str,
    before: Reader,
    tokens: usize,
) -> Result<Reader, kvcache_e2e::Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = reader(client, pod).await?;
        if now.prompt_tokens - before.prompt_tokens >= tokens as f64 {
            return Ok(now);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(kvcache_e2e::Error::Wait {
                what: format!("{pod}'s prompt token counters to count a {tokens}-token request"),
                reason: format!("before {before:?}, last {now:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the three deployments of `model`, times every length quiet and busy, removes them.
async fn measure(
    client: &kube::Client,
    (m, engine_env, logs): (&Model, &[(String, String)], &std::path::Path),
    (lengths, conditions): (&[usize], &[&'static str]),
    prompts: usize,
    rows: &mut Vec<Row>,
) -> Result<(), kvcache_e2e::Error> {
    let engines = deploy(client, m, engine_env).await?;
    // One request each first: the first request of an engine pays for warming up.
    let mut seed = 10_000;
    for (name, _) in ENGINES {
        engines.time(name, engine::prompt(seed, 64), 1).await?;
        seed += 1;
    }
    for &condition in conditions {
        let stop = Arc::new(AtomicBool::new(false));
        let load = if condition == "busy" {
            busy_writer(&engines, &stop)
        } else {
            Vec::new()
        };
        for &tokens in lengths {
            let row = one_length(client, &engines, (condition, tokens), prompts, &mut seed).await?;
            rows.push(row);
        }
        stop.store(true, Ordering::Relaxed);
        for task in load {
            let _ = task.await;
        }
    }
    // The engines' own account of every load and save, kept beside the figures.
    engine_rig::keep_logs(client, logs).await;
    for (name, _) in ENGINES {
        walkthrough::remove_model(client, TEAM, name, WAIT).await?;
    }
    Ok(())
}

/// The three deployments of one model, and the Pod each runs.
struct Engines {
    api: Api<Pod>,
    /// Each deployment's Pod, by the deployment's name.
    pod: BTreeMap<&'static str, String>,
    model: &'static str,
}

impl Engines {
    /// A completion of `max_tokens` new tokens of `prompt` by the engine `who`, timed.
    async fn time(
        &self,
        who: &'static str,
        prompt: Vec<u32>,
        max_tokens: u32,
    ) -> Result<engine::Completion, kvcache_e2e::Error> {
        engine::complete(&self.api, &self.pod[who], self.model, &prompt, max_tokens).await
    }
}

/// The three deployments of `m` (the attached ones with `engine_env` added), until each runs a
/// Ready Pod and the store is Ready.
async fn deploy(
    client: &kube::Client,
    m: &Model,
    engine_env: &[(String, String)],
) -> Result<Engines, kvcache_e2e::Error> {
    let model = m.path;
    let models: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM);
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
    let mut pod = BTreeMap::new();
    for (name, attached) in ENGINES {
        let mut md = engine::model_deployment(TEAM, name, model, attached.then_some(TEAM), 1);
        if let Some(args) = md["spec"]["roles"][0]["extraArgs"].as_array_mut()
            && let Some(i) = args.iter().position(|a| a == "--max-model-len")
        {
            args[i + 1] = m.context.to_string().into();
        }
        if attached && let Some(env) = md["spec"]["roles"][0]["env"].as_array_mut() {
            env.extend(
                engine_env
                    .iter()
                    .map(|(name, value)| serde_json::json!({"name": name, "value": value})),
            );
        }
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
    engine_rig::wait_store_ready(client).await?;
    println!("{model}: writer, reader and plain engines Ready");
    Ok(Engines { api, pod, model })
}

/// The busy node: two streams of 512-token prompts to the writer until `stop`.
fn busy_writer(engines: &Engines, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    let model = engines.model;
    let mut load = Vec::new();
    for stream in 0..2u32 {
        let (api, p, stop) = (
            engines.api.clone(),
            engines.pod["writer"].clone(),
            stop.clone(),
        );
        let mut s = 1_000_000 + 100_000 * stream;
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                s += 1;
                let prompt = engine::prompt(s, 512);
                let _ = engine::complete(&api, &p, model, &prompt, 1).await;
            }
        }));
    }
    load
}

/// `prompts` fresh prompts of `tokens` tokens timed three ways under `condition` (their token
/// ids from `seed` on), and one decode step of the plain engine: the row.
async fn one_length(
    client: &kube::Client,
    engines: &Engines,
    (condition, tokens): (&'static str, usize),
    prompts: usize,
    seed: &mut u32,
) -> Result<Row, kvcache_e2e::Error> {
    let model = engines.model;
    let (mut none, mut cold, mut hit) = (vec![], vec![], vec![]);
    let (mut bytes, mut secs, mut fallbacks) = (vec![], vec![], 0);
    for _ in 0..prompts {
        *seed += 1;
        none.push(
            engines
                .time("plain", engine::prompt(*seed, tokens), 1)
                .await?
                .seconds,
        );
        *seed += 1;
        cold.push(
            engines
                .time("reader", engine::prompt(*seed, tokens), 1)
                .await?
                .seconds,
        );
        *seed += 1;
        match timed_hit(client, engines, (condition, tokens), *seed).await? {
            Some((t, loaded_bytes, load_seconds)) => {
                hit.push(t);
                bytes.push(loaded_bytes);
                secs.push(load_seconds);
            }
            None => fallbacks += 1,
        }
    }
    // One decode step of the engine without the cache: 32 tokens against 1.
    *seed += 1;
    let p = engine::prompt(*seed, tokens);
    let one = engines.time("plain", p.clone(), 1).await?.seconds;
    let many = engines.time("plain", p, 32).await?.seconds;
    let row = Row {
        model,
        condition,
        tokens,
        hits: hit.len(),
        fallbacks,
        ttft: [median(none), median(cold), median(hit)],
        load_bytes: median(bytes),
        load_seconds: median(secs),
        decode_step: ((many - one) / 31.0).max(0.0),
    };
    println!(
        "{model} {condition} {tokens} tokens: TTFT none {:.0} ms, cold {:.0} ms, hit {:.0} ms ({} hits, {} fallbacks)",
        row.ttft[0] * 1e3,
        row.ttft[1] * 1e3,
        row.ttft[2] * 1e3,
        row.hits,
        row.fallbacks
    );
    Ok(row)
}

/// A hit: the writer computes a fresh prompt (token ids of `seed`), then the reader is timed on
/// it. With the reader's counters, the time, the load's bytes and its seconds; `None` when the
/// load fell back to computing.
async fn timed_hit(
    client: &kube::Client,
    engines: &Engines,
    (condition, tokens): (&'static str, usize),
    seed: u32,
) -> Result<Option<(f64, f64, f64)>, kvcache_e2e::Error> {
    let model = engines.model;
    let p = engine::prompt(seed, tokens);
    let keys = engine::master_keys(client, NS, BACKEND).await?;
    engines.time("writer", p.clone(), 1).await?;
    engine::wait_keys_above(client, NS, BACKEND, keys, "the writer's blocks").await?;
    let before = reader(client, &engines.pod["reader"]).await?;
    let t = engines.time("reader", p, 1).await?.seconds;
    let after = reader_after(client, &engines.pod["reader"], before, tokens).await?;
    let loaded = after.from_store - before.from_store;
    let whole = loaded
        >= (tokens - tokens % engine::BLOCK_SIZE as usize) as f64 - f64::from(engine::BLOCK_SIZE)
        && after.load_failed_keys == before.load_failed_keys
        && after.load_errors == before.load_errors;
    if whole {
        println!(
            "{model} {condition} {tokens}: a hit in {t:.2} s, its load {:.3} s for {:.1} MiB; vLLM's split: queued {:.3} s, scheduled to first token {:.3} s",
            after.load_seconds - before.load_seconds,
            (after.load_bytes - before.load_bytes) / f64::from(1 << 20),
            after.queue_seconds - before.queue_seconds,
            after.prefill_seconds - before.prefill_seconds
        );
        Ok(Some((
            t,
            after.load_bytes - before.load_bytes,
            after.load_seconds - before.load_seconds,
        )))
    } else {
        println!(
            "{model} {condition} {tokens}: a hit fell back ({loaded} tokens from the store, {} failed keys, {} failed loads, {t:.2} s)",
            after.load_failed_keys - before.load_failed_keys,
            after.load_errors - before.load_errors
        );
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_series_whose_labels_match() {
        let text = "# TYPE x counter\nvllm:mooncake_store_operation_bytes_total{engine=\"0\",operation=\"load_get\",status=\"ok\"} 100.0\nvllm:mooncake_store_operation_bytes_total{engine=\"0\",operation=\"load_get\",status=\"error\"} 5.0\nvllm:mooncake_store_operation_bytes_total{engine=\"0\",operation=\"save_put\",status=\"ok\"} 7.0\n";
        let name = "vllm:mooncake_store_operation_bytes_total";
        assert_eq!(sum(text, name, &[("operation", LOAD)]), 105.0);
        assert_eq!(
            sum(text, name, &[("operation", LOAD), ("status", "error")]),
            5.0
        );
        assert_eq!(sum(text, name, &[]), 112.0);
        assert_eq!(sum(text, "other", &[]), 0.0);
    }

    #[test]
    fn a_plan_refuses_what_it_cannot_run() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let models = strings(&["llama-bench"]);
        let quiet = strings(&["quiet"]);
        assert!(
            Plan::new(
                &[256, 4064],
                3,
                &models,
                300.0,
                &strings(&["quiet", "busy"])
            )
            .is_ok()
        );
        assert!(Plan::new(&[256], 3, &models, 300.0, &strings(&["loud"])).is_err());
        assert!(Plan::new(&[256], 3, &strings(&["gpt"]), 300.0, &quiet).is_err());
        assert!(Plan::new(&[16], 3, &models, 300.0, &quiet).is_err());
        assert!(Plan::new(&[4096], 3, &models, 300.0, &quiet).is_err());
        let plan = || Plan::new(&[256], 3, &models, 300.0, &quiet).expect("a plan");
        let env = plan()
            .with_engine_env(&strings(&["MC_TCP_ENABLE_CONNECTION_POOL=0", "EMPTY="]))
            .expect("two settings");
        assert_eq!(
            env.engine_env,
            [
                ("MC_TCP_ENABLE_CONNECTION_POOL".to_owned(), "0".to_owned()),
                ("EMPTY".to_owned(), String::new())
            ]
        );
        assert!(plan().with_engine_env(&strings(&["NOVALUE"])).is_err());
        assert!(plan().with_engine_env(&strings(&["=1"])).is_err());
        assert!(
            plan()
                .with_leader_args(&strings(&["-client_ttl=30"]))
                .is_ok()
        );
        assert!(
            plan()
                .with_leader_args(&strings(&["client_ttl=30"]))
                .is_err()
        );
        assert!(plan().with_leader_cpu(Some("500m")).is_ok());
        assert!(plan().with_leader_cpu(Some("half a core")).is_err());
    }
}
