//! Reads of the store's serving leader: its Ready Pods, its master's `/metrics` and key count,
//! read inside the Pods.

use std::time::Duration;

use anyhow::Context;

use super::kubectl::{Demo, NS};

/// The leader Pods of the walkthrough's backend that are Ready (the one serving).
pub(super) fn ready_leaders(d: &Demo) -> anyhow::Result<Vec<String>> {
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

/// The new master's own key count, read inside its Pod: the admin port answers only the
/// operator across the network (the backend's NetworkPolicy), and the master's own loopback.
pub(super) fn master_keys(d: &Demo) -> anyhow::Result<String> {
    let text = leader_metrics(d, "mooncake-dram")?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("master_key_count"))
        .unwrap_or("master_key_count (absent)")
        .to_owned())
}

/// The master's key count as a number.
pub(super) fn key_count(d: &Demo) -> anyhow::Result<f64> {
    let line = master_keys(d)?;
    line.split_whitespace()
        .last()
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("an unreadable master_key_count line: {line}"))
}

/// The serving master's `/metrics` of `backend`, read inside its Pod at `127.0.0.1:9003`: the
/// leader Pods in turn (with standbys, only the serving one's master answers).
pub(super) fn leader_metrics(d: &Demo, backend: &str) -> anyhow::Result<String> {
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
