//! `cargo xtask test`: every test in the workspace, unit and end-to-end, with their parts installed.

use std::process::Command;

use anyhow::bail;

use crate::setup;

/// The variables the end-to-end harness reads to find the installed parts.
pub const ENV_K8S_BIN: &str = "KVCACHE_K8S_BIN";
pub const ENV_MOONCAKE_VENV: &str = "KVCACHE_MOONCAKE_VENV";

pub fn run(extra: &[String]) -> anyhow::Result<()> {
    let installed = setup::all()?;
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["test", "--workspace"])
        .args(extra)
        .env(ENV_K8S_BIN, &installed.k8s_bin)
        .env(ENV_MOONCAKE_VENV, &installed.mooncake_venv)
        .status()?;
    if !status.success() {
        bail!("cargo test failed ({status})");
    }
    Ok(())
}
