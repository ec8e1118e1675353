//! The operator: installed from `deploy/operator.yaml`, and its leadership read at the install
//! and checked at the end.

use std::time::Duration;

use anyhow::{Context, bail};

use super::kubectl::{Demo, NS, OPERATOR_PODS};

/// The operator from `deploy/operator.yaml`, its rollout and its two Pods.
pub(super) fn install(d: &mut Demo) -> anyhow::Result<()> {
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

/// The operator's leadership: who holds its Lease, how often the Lease changed hands, and how
/// often the operator's containers restarted.
#[derive(Debug)]
pub(super) struct OperatorLeadership {
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
pub(super) fn operator_leadership(d: &Demo) -> anyhow::Result<OperatorLeadership> {
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
pub(super) fn kept_leading(d: &mut Demo, installed: &OperatorLeadership) -> anyhow::Result<()> {
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
