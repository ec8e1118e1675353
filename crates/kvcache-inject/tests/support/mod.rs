//! Shared fixtures.
#![allow(dead_code)]

use k8s_openapi::api::core::v1::{Container, EnvVar};
use kvcache_api::backend::Protocol;
use kvcache_api::model::{EngineName, RoleKind};
use kvcache_inject::engines::{self, EngineRow};
use kvcache_inject::{Ledger, Request, Source};

pub const ENDPOINT: &str = "mooncake-dram-leader.gpustack-system.svc:50051";

pub fn container(command: &[&str], args: &[&str]) -> Container {
    Container {
        name: "engine".into(),
        image: Some("vllm/vllm-openai:v0.29.0".into()),
        command: (!command.is_empty()).then(|| command.iter().map(|s| (*s).to_owned()).collect()),
        args: (!args.is_empty()).then(|| args.iter().map(|s| (*s).to_owned()).collect()),
        ..Default::default()
    }
}

pub fn with_env(mut c: Container, pairs: &[(&str, &str)]) -> Container {
    c.env = Some(
        pairs
            .iter()
            .map(|(k, v)| EnvVar {
                name: (*k).into(),
                value: Some((*v).into()),
                value_from: None,
            })
            .collect(),
    );
    c
}

pub fn vllm() -> &'static EngineRow {
    engines::row(EngineName::Vllm, None).expect("row")
}

pub fn ascend() -> &'static EngineRow {
    engines::row(EngineName::Vllm, Some("ascend")).expect("row")
}

pub fn sglang() -> &'static EngineRow {
    engines::row(EngineName::Sglang, None).expect("row")
}

/// The walkthrough: Binding team-a, domain default, bfloat16, a ledger, one TCP group, the
/// default store image's line, vLLM 0.29.0.
pub fn walkthrough<'a>(row: &'a EngineRow, c: &'a Container) -> Request<'a> {
    let (store, version) = match row.name {
        "SGLang" => ("0.3.12.post1", "0.5.18"),
        "vLLM-Ascend" => ("0.3.11.post1", "0.23.0"),
        _ => ("0.3.13.post1", "0.29.0"),
    };
    Request {
        source: Source::Webhook,
        engine: row,
        role: RoleKind::Server,
        binding: "team-a",
        domain: "default",
        ledger: Ledger::Enforced,
        dtype: "bfloat16",
        dtype_owned: true,
        client_endpoint: Some(ENDPOINT),
        protocols: if row.name == "vLLM-Ascend" {
            &[Protocol::Cann]
        } else {
            &[Protocol::Auto]
        },
        store_version: Some(store),
        engine_version: Some(version),
        container: c,
        pod_volumes: &[],
        launch_args_forwarded: false,
    }
}
