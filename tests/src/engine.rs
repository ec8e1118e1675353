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
use kvcache_render::shared_cache::{EngineCounters, parse_engine_metrics};

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

/// The flags every engine replica runs with: dummy weights (no hub), no tokenizer, float32
/// (CPU), a short context, eager mode (no compilation at start), the domain's block size.
pub fn engine_args() -> Vec<String> {
    [
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--dtype",
        "float32",
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

/// A Binding for `namespace` on `pool` with the domain `domain` (`None`: the default tenant),
/// the engines' block size and `auto` dtype (the model's own, float32).
pub fn binding(namespace: &str, pool: &str, domain: Option<&str>) -> serde_json::Value {
    let mut d = serde_json::json!({"blockSize": BLOCK_SIZE, "dtype": "auto"});
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
pub fn model_deployment(
    namespace: &str,
    name: &str,
    model: &str,
    binding: &str,
    replicas: i32,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": model},
            "engine": {"name": "vLLM", "version": crate::images::VLLM_VERSION},
            "kvCache": {"poolRef": {"name": binding}},
            "roles": [{
                "name": "server",
                "replicas": replicas,
                "instanceType": INSTANCE_TYPE,
                "extraArgs": engine_args(),
                "env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]
            }]
        }
    })
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

/// Sends `prompt` to the engine in `pod` (inside the Pod, on its own port) asking for a few
/// tokens; returns the generated token ids. An engine error is an error.
pub async fn complete(api: &Api<Pod>, pod: &str, model: &str, prompt: &[u32]) -> Result<Vec<u32>> {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "return_token_ids": true
    })
    .to_string();
    let out = post(api, pod, "v1/completions", &body).await?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| Error::Engine {
        pod: pod.to_owned(),
        message: format!("an unreadable completion ({e}): {out}"),
    })?;
    let tokens = v["choices"][0]["token_ids"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect()
        })
        .unwrap_or_default();
    Ok(tokens)
}

/// Empties the local prefix cache of the engine in `pod`, so that its next request asks the
/// store for every block.
pub async fn reset_local_cache(api: &Api<Pod>, pod: &str) -> Result<()> {
    post(api, pod, "reset_prefix_cache", "").await.map(drop)
}

/// A POST of `body` (JSON) to the engine's `path` from inside its Pod; the answer's body.
async fn post(api: &Api<Pod>, pod: &str, path: &str, body: &str) -> Result<String> {
    let url = format!("http://127.0.0.1:{PORT}/{path}");
    let out = pods::exec(
        api,
        pod,
        None,
        &[
            "python3",
            "-c",
            "import sys, urllib.request\nreq = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={'Content-Type': 'application/json'}, method='POST')\nprint(urllib.request.urlopen(req, timeout=300).read().decode())",
            &url,
            body,
        ],
    )
    .await?;
    if out.success {
        Ok(out.stdout)
    } else {
        Err(Error::Http {
            url: format!("{pod}: {url}"),
            message: out.stderr,
        })
    }
}

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
