//! The examples at demo size, written to the demo's scratch folder.

use std::path::{Path, PathBuf};

use super::engine::{DEMO_CONTEXT, DEMO_MODEL};

/// The walkthrough's manifests at demo size, one file per step, its model served by the real
/// vLLM: the tiny model directory in the engine image (dummy weights, no tokenizer, computing
/// in the domain's bfloat16), vLLM 0.32.0 (the image's version, on the store's client line),
/// 500m and 4Gi per replica, and the domain's block size spelled for it (vLLM on CPU refuses
/// 16-token blocks: `blockSize: 32`; the walkthrough's `dtype: bfloat16` stays).
pub(super) fn manifests(out: &Path) -> anyhow::Result<PathBuf> {
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

/// The disk-heavy example at demo size: the image pinned to the local store build, a 32Mi
/// segment (two buckets) in front of a 1Gi tier per member, a 500 ms object lease and a 1 s
/// offload heartbeat so that the fill is seen within seconds.
pub(super) fn disk_manifest(dir: &Path) -> anyhow::Result<PathBuf> {
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
