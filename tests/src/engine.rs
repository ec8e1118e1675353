//! The real vLLM engine (`images::VLLM`) on the nodes: the ModelDeployment the tests and the
//! demo apply, prompts sent to one replica, and the engine's own counters read back.
//!
//! Prompts are token ids (the engines run with `--skip-tokenizer-init`, the model directory has
//! no tokenizer). vLLM keeps a local prefix cache too: a replica that saw a prompt answers it
//! from its own memory and never asks the store, so a test that wants to see the store asks a
//! replica that has not seen the prompt, or resets that replica's local cache first
//! ([`reset_local_cache`], served with `VLLM_SERVER_DEV_MODE=1`).

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kvcache_api::model::EngineName;
use kvcache_render::observe::shared_cache::{EngineCounters, parse_engine_metrics};

use crate::{Error, Result, pods};

/// The model directory in the image the tests serve (2 layers, hidden size 256). Engines that
/// should share blocks must name the same path: its last segment is part of the store's keys.
pub const TINY_MODEL: &str = "/models/tiny-llama";
/// A model sized so that prefill costs what it does relative to a fetch (16 layers, hidden
/// size 1024): the prefix benchmark's second model.
pub const BENCH_MODEL: &str = "/models/llama-bench";
/// The KV block size, in tokens, of the engines and of their Bindings' domains (vLLM on CPU
/// refuses 16).
pub const BLOCK_SIZE: u32 = 32;
/// The name of the InstanceType the engine roles run on: no accelerator, 4Gi and half a core
/// per replica.
pub const INSTANCE_TYPE: &str = "cpu-engine";
/// The engine's port in its Pod.
pub const PORT: u16 = 8000;

/// The flags every engine replica runs with: dummy weights (no hub), no tokenizer, the model
/// in the domain's dtype [`KV_DTYPE`], a short context, eager mode (no compilation at start),
/// the domain's block size.
pub fn engine_args() -> Vec<String> {
    [
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--dtype",
        KV_DTYPE,
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--block-size",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain(std::iter::once(BLOCK_SIZE.to_string()))
    .collect()
}

/// The walkthrough's backend and pool (`mooncake-dram`, `shared-dram`) at demo size (256Mi per
/// member), the store image pinned, with `leader_replicas` leader replicas.
pub fn walkthrough_store(leader_replicas: i32) -> Result<Vec<serde_json::Value>> {
    let read = |file: &str| -> Result<serde_json::Value> {
        let path = crate::walkthrough::examples("walkthrough").join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(crate::io(format!("reading {}", path.display())))?;
        serde_yaml::from_str(&text).map_err(|e| Error::Invalid {
            path: path.display().to_string(),
            what: "manifest",
            reason: e.to_string(),
        })
    };
    let mut backend = read("01-backend.yaml")?;
    backend["spec"]["image"] = kvcache_api::settings::DEFAULT_BACKEND_IMAGE.into();
    let managed = &mut backend["spec"]["connection"]["managed"];
    managed["members"][0]["capacityPerMember"] =
        crate::walkthrough::DEMO_CAPACITY_PER_MEMBER.into();
    managed["leader"]["replicas"] = leader_replicas.into();
    crate::walkthrough::rig_store_resources(&mut backend, crate::walkthrough::ENGINE_RIG_STORE_CPU);
    Ok(vec![backend, read("02-pool.yaml")?])
}

/// The InstanceType the engine roles name.
pub fn instance_type() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1",
        "kind": "InstanceType",
        "metadata": {"name": INSTANCE_TYPE},
        "spec": {
            "nodeSelector": {"kvcache": "true"},
            "resources": {"cpu": "500m", "memory": "4Gi"}
        }
    })
}

/// The KV cache dtype of the engines' domains, handed to them as `--kv-cache-dtype` (the
/// admission refuses `auto` on a new Binding), and the dtype the engines compute in: vLLM
/// 0.32.0 on CPU sizes its KV cache by `--kv-cache-dtype` but stores blocks in the model's
/// dtype, so a float32 model with a bfloat16 cache wrote past the cache from block 1,024 on
/// (a segfault in `reshape_and_cache`, read from a core dump; `benches/README.md`, "Why the writer
/// crashed at 2,048 tokens busy").
pub const KV_DTYPE: &str = "bfloat16";

/// A Binding for `namespace` on `pool` with the domain `domain` (`None`: the default tenant),
/// the engines' block size and [`KV_DTYPE`].
pub fn binding(namespace: &str, pool: &str, domain: Option<&str>) -> serde_json::Value {
    let mut d = serde_json::json!({"blockSize": BLOCK_SIZE, "dtype": KV_DTYPE});
    if let Some(name) = domain {
        d["name"] = name.into();
    }
    serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1",
        "kind": "KVCachePoolBinding",
        "metadata": {"name": namespace, "namespace": namespace},
        "spec": {"poolRef": {"name": pool}, "quota": {"ceiling": "8Gi"}, "domain": d}
    })
}

/// A ModelDeployment of the real vLLM serving `model` with `replicas`, attached through the
/// Binding `binding` of its namespace. The replicas serve `/reset_prefix_cache`
/// (`VLLM_SERVER_DEV_MODE`).
/// `binding: None`: the same engine with no shared cache.
pub fn model_deployment(
    namespace: &str,
    name: &str,
    model: &str,
    binding: Option<&str>,
    replicas: i32,
) -> serde_json::Value {
    let mut md = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": model},
            "engine": {"name": "vLLM", "version": crate::images::VLLM_VERSION},
            "roles": [{
                "name": "server",
                "replicas": replicas,
                "instanceType": INSTANCE_TYPE,
                "extraArgs": engine_args(),
                "env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]
            }]
        }
    });
    if let Some(b) = binding {
        md["spec"]["kvCache"] = serde_json::json!({"poolRef": {"name": b}});
    }
    md
}

/// `n` token ids that differ for each `seed` (and share nothing with another seed's).
pub fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            (seed
                .wrapping_mul(7919)
                .wrapping_add(i.wrapping_mul(104_729)))
                % 31_000
                + 100
        })
        .collect()
}

/// One completion: the generated token ids and how long the request took, measured inside the
/// engine's Pod (no exec or API server in the figure).
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// Seconds from sending the request to the whole answer.
    pub seconds: f64,
}

/// Sends `prompt` to the engine in `pod` (inside the Pod, on its own port) asking for
/// `max_tokens` greedy tokens. An engine error is an error.
pub async fn complete(
    api: &Api<Pod>,
    pod: &str,
    model: &str,
    prompt: &[u32],
    max_tokens: u32,
) -> Result<Completion> {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": true
    })
    .to_string();
    let out = post(api, pod, "v1/completions", &body).await?;
    let unreadable = |why: String| Error::Engine {
        pod: pod.to_owned(),
        message: format!("an unreadable completion ({why}): {out}"),
    };
    let timed: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| unreadable(e.to_string()))?;
    let answer: serde_json::Value = timed["body"]
        .as_str()
        .ok_or_else(|| unreadable("no body".into()))
        .and_then(|b| serde_json::from_str(b).map_err(|e| unreadable(e.to_string())))?;
    let tokens = answer["choices"][0]["token_ids"]
        .as_array()
        .ok_or_else(|| unreadable("no choices[0].token_ids".into()))?
        .iter()
        .filter_map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect();
    Ok(Completion {
        tokens,
        seconds: timed["seconds"].as_f64().unwrap_or_default(),
    })
}

/// Empties the local prefix cache of the engine in `pod`, so that its next request asks the
/// store for every block.
pub async fn reset_local_cache(api: &Api<Pod>, pod: &str) -> Result<()> {
    post(api, pod, "reset_prefix_cache", "").await.map(drop)
}

/// A POST of `body` (JSON) to the engine's `path` from inside its Pod; `{"seconds", "body"}`
/// of the answer as JSON.
async fn post(api: &Api<Pod>, pod: &str, path: &str, body: &str) -> Result<String> {
    let url = format!("http://127.0.0.1:{PORT}/{path}");
    let out = pods::exec(api, pod, None, &["python3", "-c", POST, &url, body]).await?;
    if out.success {
        return Ok(out.stdout);
    }
    // What the engine said of it, kept with the failure (a scratch folder goes with its cluster).
    let log = match pods::logs(api, pod, None).await {
        Ok(log) => pods::last_lines(&log, ENGINE_LOG_LINES).join("\n"),
        Err(e) => format!("(unreadable: {e})"),
    };
    Err(Error::Http {
        url: format!("{pod}: {url}"),
        message: format!(
            "{}\nthe engine's last {ENGINE_LOG_LINES} log lines:\n{log}",
            out.stderr.trim()
        ),
    })
}

/// How much of an engine's log a failed request carries.
const ENGINE_LOG_LINES: usize = 40;

/// POSTs `argv[2]` to `argv[1]`; prints `{"seconds", "body"}`, or on an HTTP error status
/// writes the status and the engine's answer (vLLM says why there) and exits 3.
const POST: &str = "import json, sys, time, urllib.error, urllib.request
req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={'Content-Type': 'application/json'}, method='POST')
t = time.perf_counter()
try:
    body = urllib.request.urlopen(req, timeout=300).read().decode()
except urllib.error.HTTPError as e:
    sys.stderr.write('HTTP %d: %s' % (e.code, e.read().decode(errors='replace')))
    sys.exit(3)
print(json.dumps({'seconds': time.perf_counter() - t, 'body': body}))
";

/// The engine's shared-cache counters, from its `/metrics` (through the API server's Pod
/// proxy), parsed as the operator parses them.
pub async fn counters(client: &kube::Client, namespace: &str, pod: &str) -> Result<EngineCounters> {
    let url = format!("{namespace}/{pod}:{PORT}/metrics");
    let text = pods::proxy_get(client, namespace, pod, PORT, "metrics").await?;
    parse_engine_metrics(EngineName::Vllm, &url, &text).map_err(|e| Error::Engine {
        pod: format!("{namespace}/{pod}"),
        message: e.to_string(),
    })
}

/// The master's own key count (`master_key_count`), read from inside a member Pod of
/// `backend` (in `namespace`, the store's) through the leader Service.
pub async fn master_keys(client: &kube::Client, namespace: &str, backend: &str) -> Result<f64> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let leaders = api
        .list(
            &kube::api::ListParams::default()
                .labels(&crate::walkthrough::backend_pods(backend, "leader")),
        )
        .await?;
    let leader = leaders
        .items
        .iter()
        .find(|p| pods::is_ready(p))
        .ok_or_else(|| Error::Wait {
            what: format!("a Ready leader Pod of {backend}"),
            reason: "none is Ready".into(),
        })?;
    // Inside the serving leader: its admin port answers the operator alone across the network
    // (the backend's NetworkPolicy), and its own loopback.
    let admin = "127.0.0.1:9003";
    let text =
        pods::master_page_in(&api, pods::name_of(leader), "master", admin, "metrics").await?;
    crate::store::metric_value(&text, "master_key_count").ok_or_else(|| Error::Http {
        url: format!("http://{admin}/metrics"),
        message: "no master_key_count".into(),
    })
}

/// Waits (a minute at most) until the master of `backend` holds more than `than` keys; `what`
/// says whose keys.
pub async fn wait_keys_above(
    client: &kube::Client,
    namespace: &str,
    backend: &str,
    than: f64,
    what: &str,
) -> Result<f64> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let last = master_keys(client, namespace, backend).await;
        if let Ok(n) = &last
            && *n > than
        {
            return Ok(*n);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Wait {
                what: format!("the master of {backend} holding more than {than} keys: {what}"),
                reason: format!("last read: {last:?}"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// What one engine's own prefills price a computed token at, microseconds: the slope of the
/// least-squares line through its readings (each what it finished over a stretch, taken as its
/// requests' mean: tokens a prefill, time a prefill, weighed by its requests), so that the
/// fixed cost of a step is the line's intercept and not in the price. `None` without two
/// sizes of prefill. The check the demo and `real_engine::prefill_saved` hold the operator's
/// price to.
pub fn own_price_micros(
    readings: &[kvcache_render::observe::shared_cache::Prefills],
) -> Option<f64> {
    let points: Vec<(f64, f64, f64)> = readings
        .iter()
        .filter(|p| p.requests > 0)
        .map(|p| {
            let n = p.requests as f64;
            (n, p.computed_tokens as f64 / n, p.micros as f64 / n)
        })
        .collect();
    let weight: f64 = points.iter().map(|(n, _, _)| n).sum();
    let mean =
        |f: fn(&(f64, f64, f64)) -> f64| points.iter().map(|p| p.0 * f(p)).sum::<f64>() / weight;
    let (c, t) = (mean(|p| p.1), mean(|p| p.2));
    let spread: f64 = points.iter().map(|(n, x, _)| n * (x - c) * (x - c)).sum();
    let together: f64 = points.iter().map(|(n, x, y)| n * (x - c) * (y - t)).sum();
    (spread >= 1.0).then(|| together / spread)
}

/// Whether `figure` is within `share` of `reference` (of its size).
pub fn agrees(figure: f64, reference: f64, share: f64) -> bool {
    (figure - reference).abs() <= share * reference.abs()
}

#[cfg(test)]
mod tests {
    use kvcache_render::observe::shared_cache::Prefills;

    use super::*;

    #[test]
    fn an_engines_own_price_is_the_slope_between_two_sizes_of_prefill() {
        // 180 ms a step and 2.2 ms a token: 200 tokens in 620 ms, two of 4,000 in 17.96 s.
        let short = Prefills {
            requests: 1,
            computed_tokens: 200,
            micros: 620_000,
        };
        let long = Prefills {
            requests: 2,
            computed_tokens: 8000,
            micros: 17_960_000,
        };
        let p = own_price_micros(&[short, long]).expect("two sizes");
        assert!((p - 2200.0).abs() < 1e-6, "{p}");
        assert_eq!(own_price_micros(&[short, short]), None);
        assert_eq!(own_price_micros(&[Prefills::default(), long]), None);
        // Three sizes off the line by +10, -20 and +10 ms: the least-squares slope.
        let at = |c: u64, ms: u64| Prefills {
            requests: 1,
            computed_tokens: c,
            micros: ms * 1000,
        };
        let p = own_price_micros(&[at(1000, 1110), at(2000, 2080), at(3000, 3110)])
            .expect("three sizes");
        assert!((p - 1000.0).abs() < 1e-6, "{p}");
        assert!(agrees(1.29, 1.0, 0.3) && !agrees(1.31, 1.0, 0.3) && agrees(-1.2, -1.0, 0.3));
    }
}
