//! `cargo xtask demo`: the seed walkthrough for real on this machine. A control plane with two
//! real nodes (the images built locally and loaded), the operator installed from
//! `deploy/operator.yaml`, then `examples/walkthrough` applied in creation order at demo size
//! (`capacityPerMember: 256Mi` on 2 nodes, roles of 250m / 384Mi), showing at each step what a
//! user sees with the `kubectl` built from the same Kubernetes module; then the HA step. A
//! progress line per step with its duration, a summary, and the cluster torn down unless
//! `--keep`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use kvcache_api::model::conditions::CACHE_ATTACHED;
use kvcache_api::pool::binding_conditions::QUOTA_GRANTED;

use crate::setup;

const NS: &str = "gpustack-system";
/// The operator's Pods, by label.
const OPERATOR_PODS: &str = "app.kubernetes.io/name=kvcache-operator";

struct Demo {
    kubeconfig: PathBuf,
    steps: Vec<(String, Duration)>,
}

impl Demo {
    fn kubectl(&self) -> Command {
        let mut c = Command::new(setup::k8s_bin_dir().join("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// Runs kubectl, echoing the command and its output as a user would see them.
    fn show(&self, args: &[&str]) -> anyhow::Result<String> {
        println!("$ kubectl {}", args.join(" "));
        let out = self
            .kubectl()
            .args(args)
            .output()
            .context("running kubectl")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(text)
    }

    /// Runs kubectl quietly (waits); fails with what it printed.
    fn quiet(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Polls `kubectl get ... -o jsonpath=...` until `ok` holds; fails naming what it waited for.
    fn wait(
        &self,
        what: &str,
        args: &[&str],
        within: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + within;
        let mut last = String::new();
        loop {
            if let Ok(out) = self.quiet(args) {
                if ok(out.trim()) {
                    return Ok(out);
                }
                last = out;
            }
            if Instant::now() > deadline {
                bail!(
                    "waited {within:?} for {what} (kubectl {}); last answer: {last:?}",
                    args.join(" ")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until the condition `kind` of `object` (`kind/name`, in `namespace`) is True.
    fn wait_condition(
        &self,
        namespace: &str,
        object: &str,
        kind: &str,
        why: &str,
        within: Duration,
    ) -> anyhow::Result<String> {
        let path = format!("jsonpath={{.status.conditions[?(@.type==\"{kind}\")].status}}");
        self.wait(
            &format!("{kind}=True on {object} ({why})"),
            &["-n", namespace, "get", object, "-o", &path],
            within,
            |s| s == "True",
        )
    }

    fn step(
        &mut self,
        title: &str,
        f: impl FnOnce(&mut Demo) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        println!();
        println!("==> {title}");
        let t = Instant::now();
        f(self)?;
        let took = t.elapsed();
        println!("--- {title}: {:.1}s", took.as_secs_f64());
        self.steps.push((title.to_owned(), took));
        Ok(())
    }
}

/// The leader Pods of the walkthrough's backend that are Ready (the one serving).
fn ready_leaders(d: &Demo) -> anyhow::Result<Vec<String>> {
    let text = d.quiet(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=mooncake-dram,app.kubernetes.io/component=leader",
        "-o",
        "json",
    ])?;
    let list: serde_json::Value = serde_json::from_str(&text)?;
    Ok(list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .filter(|p| {
                    p["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                })
                .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// The uid the store image runs as (what a tier folder must be writable by).
const STORE_UID: u32 = 65532;

/// The disk-heavy example at demo size: the image pinned to the local store build, a 32Mi
/// segment (two buckets) in front of a 1Gi tier per member, a 500 ms object lease and a 1 s
/// offload heartbeat so that the fill is seen within seconds.
fn disk_manifest(dir: &Path) -> anyhow::Result<PathBuf> {
    let from = crate::crds::root().join("examples/disk-heavy");
    let out = kvcache_e2e::walkthrough::demo_manifests(&from, &dir.join("disk-heavy"), |v| {
        if v["kind"] == "KVCacheBackend" {
            v["spec"]["image"] = kvcache_api::settings::DEFAULT_BACKEND_IMAGE.into();
            kvcache_e2e::walkthrough::demo_tier(v, "/var/lib/kvcache");
        }
        true
    })?;
    // A pool and a Binding for team-a on it: the master admits writes of a tenant its ledger
    // holds (a put of an unregistered tenant answers -1701), and the Binding registers
    // `default`.
    let file = out.join("01-backend.yaml");
    let mut text = std::fs::read_to_string(&file)?;
    text.push_str(
        "---\napiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: shared-disk\nspec:\n  backends: [mooncake-disk]\n  quota:\n    total: 2Gi\n---\napiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata:\n  name: team-a-disk\n  namespace: team-a\nspec:\n  poolRef:\n    name: shared-disk\n  quota:\n    ceiling: 1Gi\n  domain:\n    blockSize: 64\n    dtype: bfloat16\n",
    );
    std::fs::write(&file, text)?;
    Ok(file)
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

/// The walkthrough's manifests at demo size, one file per step, its model served by the real
/// vLLM: the tiny model directory in the engine image (dummy weights, no tokenizer, computing
/// in the domain's bfloat16), vLLM 0.32.0 (the image's version, on the store's client line),
/// 500m and 4Gi per replica, and the domain's block size spelled for it (vLLM on CPU refuses
/// 16-token blocks: `blockSize: 32`; the walkthrough's `dtype: bfloat16` stays).
fn manifests(out: &Path) -> anyhow::Result<PathBuf> {
    use kvcache_e2e::engine;
    let from = crate::crds::root().join("examples/walkthrough");
    Ok(kvcache_e2e::walkthrough::demo_manifests(&from, out, |v| {
        match v["kind"].as_str() {
            Some("KVCacheBackend") => {
                let cpu = kvcache_e2e::walkthrough::ENGINE_RIG_STORE_CPU;
                kvcache_e2e::walkthrough::rig_store_resources(v, cpu);
            }
            Some("InstanceType") => {
                v["spec"]["resources"] = serde_json::json!({"cpu": "500m", "memory": "4Gi"});
            }
            Some("KVCachePoolBinding") => {
                v["spec"]["domain"]["blockSize"] = engine::BLOCK_SIZE.into();
            }
            Some("ModelDeployment") => {
                v["spec"]["model"]["name"] = DEMO_MODEL.into();
                v["spec"]["engine"]["version"] = kvcache_e2e::images::VLLM_VERSION.into();
                let mut args = engine::engine_args();
                if let Some(i) = args.iter().position(|a| a == "--max-model-len") {
                    args[i + 1] = DEMO_CONTEXT.to_string();
                }
                if let Some(roles) = v["spec"]["roles"].as_array_mut() {
                    for r in roles {
                        r["extraArgs"] = args.clone().into();
                    }
                }
            }
            _ => {}
        }
        true
    })?)
}

/// The model the demo's engines serve: the prefill-heavy bench model (16 layers, hidden size
/// 1024, dummy weights), on which computing a long prompt costs what a load from the store
/// saves; on the tiny model a prefill is as cheap as the load.
const DEMO_MODEL: &str = kvcache_e2e::engine::BENCH_MODEL;
/// The engines' context: the bench model's 4,096 positions, room for the timed shared prompt.
const DEMO_CONTEXT: usize = 4096;
/// The shared prompt the demo times, in tokens (125 blocks of 32): long enough that computing
/// it costs several times what loading its 62.5 MiB of blocks does, with the model computing
/// in bfloat16 (about 3.6x faster than float32 on this project's CPU).
const TIMED_PROMPT: usize = 4000;

/// The engine Pods of qwen-chat, by name.
fn engine_pods(d: &Demo) -> anyhow::Result<Vec<String>> {
    let text = d.quiet(&[
        "-n",
        "team-a",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=qwen-chat",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    let mut pods: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    pods.sort();
    Ok(pods)
}

/// Sends a 200-token prompt (token ids of `seed`) to the engine in `pod`, showing the command
/// and the engine's usage answer.
fn ask(d: &Demo, pod: &str, seed: u32) -> anyhow::Result<()> {
    let prompt = serde_json::to_string(&kvcache_e2e::engine::prompt(seed, 200))?;
    let script = format!(
        "import json, urllib.request; body = json.dumps({{'model': '{model}', 'prompt': {prompt}, 'max_tokens': 4}}).encode(); r = urllib.request.Request('http://127.0.0.1:8000/v1/completions', data=body, headers={{'Content-Type': 'application/json'}}); print(json.load(urllib.request.urlopen(r, timeout=300))['usage'])",
        model = DEMO_MODEL
    );
    println!(
        "$ kubectl -n team-a exec {pod} -- python3 -c '<POST /v1/completions, 200 prompt tokens (seed {seed}), 4 new>'"
    );
    let out = d.quiet(&["-n", "team-a", "exec", pod, "--", "python3", "-c", &script])?;
    print!("{out}");
    Ok(())
}

/// Sends a `tokens`-token prompt (token ids of `seed`) for one new token to the engine in
/// `pod` and returns the seconds to its answer, timed inside the Pod.
fn time_to_first_token(d: &Demo, pod: &str, seed: u32, tokens: usize) -> anyhow::Result<f64> {
    let prompt = serde_json::to_string(&kvcache_e2e::engine::prompt(seed, tokens))?;
    let script = format!(
        "import json, time, urllib.request; body = json.dumps({{'model': '{DEMO_MODEL}', 'prompt': {prompt}, 'max_tokens': 1}}).encode(); r = urllib.request.Request('http://127.0.0.1:8000/v1/completions', data=body, headers={{'Content-Type': 'application/json'}}); t = time.perf_counter(); urllib.request.urlopen(r, timeout=600).read(); print(time.perf_counter() - t)"
    );
    println!(
        "$ kubectl -n team-a exec {pod} -- python3 -c '<POST /v1/completions, {tokens} prompt tokens (seed {seed}), 1 new, timed>'"
    );
    let out = d.quiet(&["-n", "team-a", "exec", pod, "--", "python3", "-c", &script])?;
    out.trim()
        .parse::<f64>()
        .with_context(|| format!("{pod} answered no time: {out}"))
}

/// The master's key count as a number.
fn key_count(d: &Demo) -> anyhow::Result<f64> {
    let line = master_keys(d)?;
    line.split_whitespace()
        .last()
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("an unreadable master_key_count line: {line}"))
}

/// The win a user came for: replica A computes a long prompt, replica B takes it from the
/// store; both timed to the first token, B's hit checked against its own counters.
fn the_win(d: &Demo, a: &str, b: &str) -> anyhow::Result<()> {
    let seed = 7;
    let keys = key_count(d)?;
    println!("replica A computes a {TIMED_PROMPT}-token prompt:");
    let computed = time_to_first_token(d, a, seed, TIMED_PROMPT)?;
    let blocks = (TIMED_PROMPT / kvcache_e2e::engine::BLOCK_SIZE as usize) as f64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while key_count(d)? < keys + blocks {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the master never held replica A's {blocks} blocks of the timed prompt (it holds {})",
            key_count(d)?
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let before = counters(d, b)?;
    println!("replica B gets the same prompt from the store:");
    let loaded = time_to_first_token(d, b, seed, TIMED_PROMPT)?;
    let after = counters(d, b)?;
    let from_store = after.tokens_from_store - before.tokens_from_store;
    println!(
        "time to first token: replica A computing {TIMED_PROMPT} tokens {:.0} ms, replica B with {from_store} of them from the store {:.0} ms: {:.1}x sooner",
        computed * 1e3,
        loaded * 1e3,
        computed / loaded
    );
    anyhow::ensure!(
        from_store > 0,
        "replica B took nothing of the timed prompt from the store: {before:?} then {after:?}"
    );
    Ok(())
}

/// The engine's `/metrics`, read inside its Pod.
fn engine_metrics(d: &Demo, pod: &str) -> anyhow::Result<String> {
    let script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics', timeout=10).read().decode())";
    d.quiet(&["-n", "team-a", "exec", pod, "--", "python3", "-c", script])
}

/// The engine's own counters, parsed as the operator parses them, shown nowhere.
fn own_counters(
    d: &Demo,
    pod: &str,
) -> anyhow::Result<kvcache_render::shared_cache::EngineCounters> {
    Ok(kvcache_render::shared_cache::parse_engine_metrics(
        kvcache_api::model::EngineName::Vllm,
        &format!("{pod}:8000/metrics"),
        &engine_metrics(d, pod)?,
    )?)
}

/// The engine's own shared-cache counters: shows its `vllm:external_prefix_cache_*` and
/// store-sourced prompt-token lines and returns them parsed.
fn counters(d: &Demo, pod: &str) -> anyhow::Result<kvcache_render::shared_cache::EngineCounters> {
    let text = engine_metrics(d, pod)?;
    println!(
        "$ kubectl -n team-a exec {pod} -- python3 -c '<GET /metrics>' | grep -E 'external_prefix_cache_(hits|queries)_total|source=\"external_kv_transfer\"'"
    );
    for l in text.lines().filter(|l| {
        !l.starts_with('#')
            && (l.starts_with("vllm:external_prefix_cache_hits_total")
                || l.starts_with("vllm:external_prefix_cache_queries_total")
                || l.contains("source=\"external_kv_transfer\""))
            && !l.contains("_created")
    }) {
        println!("{l}");
    }
    Ok(kvcache_render::shared_cache::parse_engine_metrics(
        kvcache_api::model::EngineName::Vllm,
        &format!("{pod}:8000/metrics"),
        &text,
    )?)
}

/// The new master's own key count, read inside its Pod: the admin port answers only the
/// operator across the network (the backend's NetworkPolicy), and the master's own loopback.
fn master_keys(d: &Demo) -> anyhow::Result<String> {
    let text = leader_metrics(d, "mooncake-dram")?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("master_key_count"))
        .unwrap_or("master_key_count (absent)")
        .to_owned())
}

/// The serving master's `/metrics` of `backend`, read inside its Pod at `127.0.0.1:9003`: the
/// leader Pods in turn (with standbys, only the serving one's master answers).
fn leader_metrics(d: &Demo, backend: &str) -> anyhow::Result<String> {
    let leaders = d.quiet(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        &format!("app.kubernetes.io/instance={backend},app.kubernetes.io/component=leader"),
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    // A read can meet a reset while the master serves a burst of transfers: a few tries.
    let mut last = None;
    for leader in leaders
        .split_whitespace()
        .flat_map(|l| std::iter::repeat_n(l, 3))
    {
        if last.is_some() {
            std::thread::sleep(Duration::from_secs(1));
        }
        match d.quiet(&[
            "-n",
            NS,
            "exec",
            leader,
            "-c",
            "master",
            "--",
            "python3",
            "-c",
            "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9003/metrics', timeout=5).read().decode())",
        ]) {
            Ok(text) => return Ok(text),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no leader Pod of {backend}")))
}

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

/// The operator's leadership: who holds its Lease, how often the Lease changed hands, and how
/// often the operator's containers restarted.
#[derive(Debug)]
struct OperatorLeadership {
    holder: String,
    transitions: i64,
    restarts: i64,
    /// How each restarted container last ended (`pod/container: reason, exit code, when`).
    ended: Vec<String>,
}

impl PartialEq for OperatorLeadership {
    fn eq(&self, other: &Self) -> bool {
        (&self.holder, self.transitions, self.restarts)
            == (&other.holder, other.transitions, other.restarts)
    }
}

/// Reads the operator's Lease (`kvcache-operator`, once a replica holds it) and its Pods.
fn operator_leadership(d: &Demo) -> anyhow::Result<OperatorLeadership> {
    let holder = |lease: &serde_json::Value| {
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let lease: serde_json::Value = serde_json::from_str(&d.wait(
        "a replica of the operator holding its Lease",
        &["-n", NS, "get", "lease", "kvcache-operator", "-o", "json"],
        Duration::from_secs(60),
        |text| {
            serde_json::from_str(text)
                .ok()
                .is_some_and(|l| !holder(&l).is_empty())
        },
    )?)
    .context("the operator's Lease as JSON")?;
    let pods: serde_json::Value = serde_json::from_str(&d.quiet(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        OPERATOR_PODS,
        "-o",
        "json",
    ])?)
    .context("the operator's Pods as JSON")?;
    let containers: Vec<(&str, &serde_json::Value)> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            let pod = p["metadata"]["name"].as_str().unwrap_or_default();
            p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |c| (pod, c))
        })
        .collect();
    let restarts = containers
        .iter()
        .filter_map(|(_, c)| c["restartCount"].as_i64())
        .sum();
    let ended = containers
        .iter()
        .filter(|(_, c)| c["lastState"]["terminated"].is_object())
        .map(|(pod, c)| {
            let t = &c["lastState"]["terminated"];
            format!(
                "{pod}/{}: {}, exit code {}, at {}",
                c["name"].as_str().unwrap_or_default(),
                t["reason"].as_str().unwrap_or("no reason"),
                t["exitCode"],
                t["finishedAt"].as_str().unwrap_or("?")
            )
        })
        .collect();
    Ok(OperatorLeadership {
        holder: holder(&lease),
        transitions: lease["spec"]["leaseTransitions"].as_i64().unwrap_or(0),
        restarts,
        ended,
    })
}

/// The engines prefilled on both nodes' cores through steps 3 to 5; the operator's leader
/// renewed its Lease throughout. It lost it here at a 50m CPU request (the reason it requests
/// 200m, `kvcache_render::install`) and again at 200m while it renewed 5 s before expiry (the
/// reason it renews every third of the Lease, `kvcache-operator/src/election.rs`).
fn kept_leading(d: &mut Demo, installed: &OperatorLeadership) -> anyhow::Result<()> {
    let now = operator_leadership(d)?;
    println!(
        "the operator's Lease: held by {} since the install (changed hands {} times since), its containers restarted {} times",
        now.holder,
        now.transitions - installed.transitions,
        now.restarts - installed.restarts
    );
    if &now != installed {
        bail!(
            "the operator's leadership moved while the engines ran: {installed:?} after the install, {now:?} now; restarted containers last ended: {:?} (see `kubectl -n {NS} logs <pod> --previous`)",
            now.ended
        );
    }
    Ok(())
}

/// A step's manifest, `name` in the walkthrough's folder, as kubectl takes it.
fn file(files: &Path, name: &str) -> String {
    files.join(name).display().to_string()
}

/// The operator from `deploy/operator.yaml`, its rollout and its two Pods.
fn install(d: &mut Demo) -> anyhow::Result<()> {
    let install = crate::crds::root().join("deploy/operator.yaml");
    d.show(&["apply", "-f", &install.display().to_string()])?;
    d.show(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deployment/kvcache-operator",
        "--timeout=300s",
    ])?;
    d.show(&["-n", NS, "get", "pods", "-l", OPERATOR_PODS, "-o", "wide"])?;
    Ok(())
}

/// The backend, Ready with the capacity both members registered.
fn the_store(d: &mut Demo, files: &Path) -> anyhow::Result<()> {
    d.show(&[
        "apply",
        "-f",
        &file(files, "00-namespace.yaml"),
        "-f",
        &file(files, "01-backend.yaml"),
    ])?;
    d.wait(
        "the backend Ready with what both members registered",
        &[
            "get",
            "kvcb",
            "mooncake-dram",
            "-o",
            "jsonpath={.status.phase} {.status.capacity.total}",
        ],
        Duration::from_secs(300),
        |s| s == "Ready 512Mi",
    )?;
    d.show(&["get", "kvcb"])?;
    d.show(&["-n", NS, "get", "pods", "-o", "wide"])?;
    Ok(())
}

/// The pool and team-a's Binding, until the master grants the domain.
fn the_pool_and_binding(d: &mut Demo, files: &Path) -> anyhow::Result<()> {
    d.show(&[
        "apply",
        "-f",
        &file(files, "02-pool.yaml"),
        "-f",
        &file(files, "03-binding.yaml"),
    ])?;
    d.wait_condition(
        "team-a",
        "kvcpb/team-a",
        QUOTA_GRANTED,
        "the master granted the domain",
        Duration::from_secs(180),
    )?;
    d.show(&["get", "kvcp"])?;
    d.show(&["-n", "team-a", "get", "kvcpb"])?;
    // The store now takes traffic from team-a (its Binding) and no other namespace.
    d.show(&["-n", NS, "get", "networkpolicy"])?;
    d.show(&[
        "-n",
        NS,
        "get",
        "networkpolicy",
        "mooncake-dram-leader",
        "-o",
        "jsonpath={.spec.ingress[0].from[*].namespaceSelector.matchExpressions[0].values}",
    ])?;
    // jsonpath prints no newline of its own.
    println!();
    Ok(())
}

/// The model on two real vLLM replicas: A writes a prompt's blocks, B finds them in the store,
/// `CacheAttached` and the hit ratio show it.
fn the_model(d: &mut Demo, files: &Path) -> anyhow::Result<()> {
    d.show(&[
        "apply",
        "-f",
        &file(files, "04-instancetype.yaml"),
        "-f",
        &file(files, "05-modeldeployment.yaml"),
    ])?;
    d.wait(
        "the deployment Ready (both vLLM Pods Ready; the first start unpacks the image)",
        &[
            "-n",
            "team-a",
            "get",
            "md",
            "qwen-chat",
            "-o",
            "jsonpath={.status.phase}",
        ],
        Duration::from_secs(600),
        |s| s == "Ready",
    )?;
    d.show(&["-n", "team-a", "get", "pods", "-o", "wide"])?;
    let pods = engine_pods(d)?;
    let [a, b] = pods.as_slice() else {
        bail!("qwen-chat runs {} engine Pods, not 2: {pods:?}", pods.len());
    };
    println!("replica A ({a}) computes the prompt and writes its KV blocks to the store:");
    let a_fresh = own_counters(d, a)?;
    ask(d, a, 1)?;
    let a_short = own_counters(d, a)?;
    d.wait_condition(
        "team-a",
        "md/qwen-chat",
        CACHE_ATTACHED,
        "the store charged the domain for replica A's blocks",
        Duration::from_secs(120),
    )?;
    println!("replica B ({b}) gets the same prompt and finds replica A's blocks in the store:");
    ask(d, b, 1)?;
    let c = counters(d, b)?;
    println!(
        "replica B took {} of its {} prompt tokens from the store",
        c.tokens_from_store, c.queried_tokens
    );
    anyhow::ensure!(
        c.hit_tokens > 0,
        "replica B found nothing in the store: {c:?}"
    );
    the_win(d, a, b)?;
    // Replica A's own prefills (the 200-token prompt, then the timed one) and replica B's own
    // loads: what the operator's figure is checked against.
    let a_long = own_counters(d, a)?;
    let b_own = own_counters(d, b)?;
    // The operator keeps its Lease while the engines prefill on every core (at its old 50m
    // request its leader lost it here).
    d.show(&[
        "-n",
        NS,
        "get",
        "lease",
        "kvcache-operator",
        "-o",
        "jsonpath={.spec.holderIdentity} transitions={.spec.leaseTransitions}",
    ])?;
    println!();
    println!("the seeds' own check:");
    d.show(&[
        "-n",
        "team-a",
        "get",
        "md",
        "qwen-chat",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"CacheAttached\")]}",
    ])?;
    println!();
    d.wait(
        "the deployment's shared-cache hit ratio (the operator reads the engines every 15 s)",
        &[
            "-n",
            "team-a",
            "get",
            "md",
            "qwen-chat",
            "-o",
            "jsonpath={.status.sharedCache.hitTokens}",
        ],
        Duration::from_secs(120),
        |s| s.parse::<u64>().is_ok_and(|n| n > 0),
    )?;
    d.show(&["-n", "team-a", "get", "md"])?;
    d.show(&[
        "-n",
        "team-a",
        "get",
        "md",
        "qwen-chat",
        "-o",
        "jsonpath={.status.sharedCache}",
    ])?;
    println!();
    // The tenant's view: the Binding sums the namespace's deployments that use it, once the
    // operator read replica B after its last load.
    let loaded = b_own.tokens_from_store;
    d.wait(
        "team-a's Binding summing its deployments, with the prefill time the cache saved",
        &[
            "-n",
            "team-a",
            "get",
            "kvcachepoolbinding",
            "team-a",
            "-o",
            "jsonpath={.status.sharedCache.prefillSecondsSaved} {.status.sharedCache.tokensFromStore}",
        ],
        Duration::from_secs(120),
        |s| {
            let mut words = s.split_whitespace();
            words.next().is_some_and(|v| v.parse::<f64>().is_ok())
                && words
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|n| n >= loaded)
        },
    )?;
    d.show(&["-n", "team-a", "get", "kvcachepoolbinding"])?;
    let shown = d.show(&[
        "-n",
        "team-a",
        "get",
        "kvcachepoolbinding",
        "team-a",
        "-o",
        "jsonpath={.status.sharedCache}",
    ])?;
    println!();
    // What the reader was just shown, not a second read that could differ from it.
    let view: kvcache_api::model::SharedCacheStatus =
        serde_json::from_str(&shown).context("team-a's Binding's status.sharedCache")?;
    let saved: f64 = view
        .prefill_seconds_saved
        .as_deref()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no seconds saved in {view:?}"))?;
    println!(
        "the cache saved team-a {saved:.2} s{} of prefill in the last {} (hit ratio {}, {} tokens from the store)",
        view.prefill_seconds_saved_error
            .as_deref()
            .map(|e| format!(" (± {e} s)"))
            .unwrap_or_default(),
        view.window,
        view.hit_ratio.as_deref().unwrap_or("-"),
        view.tokens_from_store
    );
    let short = a_short.prefills.since(&a_fresh.prefills);
    let long = a_long.prefills.since(&a_short.prefills);
    let price = kvcache_e2e::engine::own_price_micros(&[short, long]).with_context(|| {
        format!("replica A's two prefills computed as many tokens: {short:?}, {long:?}")
    })?;
    let gross = price * loaded as f64 / 1e6;
    let load = b_own.operations.load_micros as f64 / 1e6;
    let own = gross - load;
    println!(
        "replica A's own prefills ({} tokens in {:.2} s, then {} in {:.2} s: {:.3} ms a token beyond a step's cost) price those {loaded} tokens at {gross:.2} s; less the {load:.2} s replica B's loads took: {own:.2} s, {:+.0} % from the operator's {saved:.2} s",
        short.computed_tokens,
        short.micros as f64 / 1e6,
        long.computed_tokens,
        long.micros as f64 / 1e6,
        price / 1e3,
        (saved - own) / own * 100.0
    );
    anyhow::ensure!(
        kvcache_e2e::engine::agrees(saved, own, PRICE_AGREEMENT),
        "the operator's {saved} s saved is more than {:.0} % from replica A's own {own:.2} s",
        PRICE_AGREEMENT * 100.0
    );
    Ok(())
}

/// How close the operator's seconds saved must come to replica A's own price of the same
/// tokens (docs/shared-cache-hits.md#its-error).
const PRICE_AGREEMENT: f64 = 0.30;

/// Standbys, then the serving leader deleted: a new one serves, the members remount, and the
/// new master starts empty (an earlier prompt is a miss).
fn high_availability(d: &mut Demo) -> anyhow::Result<()> {
    d.show(&[
        "patch",
        "kvcb",
        "mooncake-dram",
        "--type=merge",
        "-p",
        r#"{"spec":{"connection":{"managed":{"leader":{"replicas":3}}}}}"#,
    ])?;
    d.wait(
        "3 leader Pods running, 1 of them Ready (the one serving)",
        &[
            "-n",
            NS,
            "get",
            "deployment",
            "mooncake-dram-leader",
            "-o",
            "jsonpath={.status.replicas} {.status.readyReplicas}",
        ],
        Duration::from_secs(300),
        |s| s == "3 1",
    )?;
    d.show(&["-n", NS, "get", "deployment", "mooncake-dram-leader"])?;
    // A prompt only replica A has seen, its blocks in the store before the failover.
    let pods = engine_pods(d)?;
    let [a, b] = pods.as_slice() else {
        bail!("qwen-chat runs {} engine Pods, not 2: {pods:?}", pods.len());
    };
    println!("replica A ({a}) gets a second prompt, which replica B has never seen:");
    ask(d, a, 2)?;
    println!("the master before the failover: {}", master_keys(d)?);
    let leaders = ready_leaders(d)?;
    let leader = leaders.first().cloned().unwrap_or_default();
    anyhow::ensure!(!leader.is_empty(), "no Ready leader Pod to delete");
    let t = Instant::now();
    d.show(&["-n", NS, "delete", "pod", &leader, "--wait=false"])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = ready_leaders(d)?;
        if now.iter().any(|p| *p != leader) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "waited 120s for another leader Pod to serve after deleting {leader}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let serving = Instant::now();
    println!(
        "a new leader serves {:.1}s after the delete",
        t.elapsed().as_secs_f64()
    );
    d.wait(
        "the members remounted on the new leader (CAPACITY back to 512Mi)",
        &[
            "get",
            "kvcb",
            "mooncake-dram",
            "-o",
            "jsonpath={.status.phase} {.status.capacity.total}",
        ],
        Duration::from_secs(120),
        |s| s == "Ready 512Mi",
    )?;
    println!(
        "full capacity again {:.1}s after the delete",
        t.elapsed().as_secs_f64()
    );
    println!("the new master started empty: {}", master_keys(d)?);
    let before = counters(d, b)?;
    println!("the same prompt to replica B: a cold cache, its store hits do not move:");
    ask(d, b, 2)?;
    let after = counters(d, b)?;
    anyhow::ensure!(
        after.hit_tokens == before.hit_tokens,
        "replica B found the prompt after the failover: {before:?} -> {after:?}"
    );
    println!(
        "replica B: {} more tokens looked up, {} found",
        after.queried_tokens - before.queried_tokens,
        after.hit_tokens - before.hit_tokens
    );
    writes_again(d, b, serving)?;
    d.show(&["get", "kvcb"])?;
    d.show(&["-n", NS, "get", "pods", "-o", "wide"])?;
    Ok(())
}

/// Replica B writes to the new master: fresh prompts until the master's key count is above
/// zero; prints how long after the new leader served that was seen.
fn writes_again(d: &Demo, b: &str, serving: Instant) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seed = 100u32;
    loop {
        let keys = master_keys(d)?;
        // An unreadable figure is an error, not zero keys.
        let count: f64 = keys
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("the master's key count is unreadable: {keys:?}"))?;
        if count > 0.0 {
            println!(
                "replica B writes to the new master: {keys}, seen {:.1}s after the new leader served",
                serving.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "waited 120s for replica B to write to the new master (its key count: {keys})"
        );
        ask(d, b, seed)?;
        seed += 1;
    }
}

/// The disk-heavy example at demo size, filled through a store client until the store's tier
/// figure moves (CAPACITY does not: it is capacity, not usage).
fn the_disk_tier(d: &mut Demo, disk: &Path) -> anyhow::Result<()> {
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
