//! The demo's engines: the model they serve, their Pods, prompts sent to them and their own
//! counters, read inside the Pods.

use anyhow::Context;

use super::kubectl::Demo;

/// The model the demo's engines serve: the prefill-heavy bench model (16 layers, hidden size
/// 1024, dummy weights), on which computing a long prompt costs what a load from the store
/// saves; on the tiny model a prefill is as cheap as the load.
pub(super) const DEMO_MODEL: &str = kvcache_e2e::engine::BENCH_MODEL;

/// The engines' context: the bench model's 4,096 positions, room for the timed shared prompt.
pub(super) const DEMO_CONTEXT: usize = 4096;

/// The engine Pods of qwen-chat, by name.
pub(super) fn engine_pods(d: &Demo) -> anyhow::Result<Vec<String>> {
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
pub(super) fn ask(d: &Demo, pod: &str, seed: u32) -> anyhow::Result<()> {
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
pub(super) fn time_to_first_token(
    d: &Demo,
    pod: &str,
    seed: u32,
    tokens: usize,
) -> anyhow::Result<f64> {
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

/// The engine's `/metrics`, read inside its Pod.
fn engine_metrics(d: &Demo, pod: &str) -> anyhow::Result<String> {
    let script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics', timeout=10).read().decode())";
    d.quiet(&["-n", "team-a", "exec", pod, "--", "python3", "-c", script])
}

/// The engine's own counters, parsed as the operator parses them, shown nowhere.
pub(super) fn own_counters(
    d: &Demo,
    pod: &str,
) -> anyhow::Result<kvcache_render::observe::shared_cache::EngineCounters> {
    Ok(kvcache_render::observe::shared_cache::parse_engine_metrics(
        kvcache_api::model::EngineName::Vllm,
        &format!("{pod}:8000/metrics"),
        &engine_metrics(d, pod)?,
    )?)
}

/// The engine's own shared-cache counters: shows its `vllm:external_prefix_cache_*` and
/// store-sourced prompt-token lines and returns them parsed.
pub(super) fn counters(
    d: &Demo,
    pod: &str,
) -> anyhow::Result<kvcache_render::observe::shared_cache::EngineCounters> {
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
    Ok(kvcache_render::observe::shared_cache::parse_engine_metrics(
        kvcache_api::model::EngineName::Vllm,
        &format!("{pod}:8000/metrics"),
        &text,
    )?)
}
