//! The monitoring against a real Prometheus (`kvcache_e2e::prometheus`): it scrapes the
//! operator (which re-exports the masters' series: `kvcache_operator_store_*`) and an engine on
//! the nodes, never a master's port, evaluates `deploy/monitoring/alerts.yaml`, and every panel
//! of `deploy/monitoring/dashboard.json` answers with data.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kvcache_e2e::prometheus::{Prometheus, Sample, Target};
use kvcache_e2e::{Error, engine, paths, pods};

use crate::{NAMESPACE, cluster, operator};

/// How long Prometheus gets to show what it scrapes (a few scrapes and evaluations).
const SHOWN: Duration = Duration::from_secs(180);

fn labels(namespace: &str, pod: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("namespace".to_owned(), namespace.to_owned()),
        ("pod".to_owned(), pod.to_owned()),
    ])
}

fn pod_ip(p: &Pod) -> Result<String, Error> {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or_else(|| Error::Wait {
            what: format!("{}'s address", pods::name_of(p)),
            reason: "no podIP in its status".into(),
        })
}

/// The shipped rule file with `alert`'s `for` set to 0s, so that a test sees it fire within
/// one evaluation: its expression, labels and annotations are the shipped ones.
fn rules_firing_at_once(alert: &str, dir: &std::path::Path) -> Result<PathBuf, Error> {
    let shipped = paths::workspace_root()
        .join("deploy")
        .join("monitoring")
        .join("alerts.yaml");
    let invalid = |reason: String| Error::Invalid {
        path: shipped.display().to_string(),
        what: "rule file",
        reason,
    };
    let text = std::fs::read_to_string(&shipped).map_err(|e| invalid(e.to_string()))?;
    let mut rules: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let mut found = false;
    for group in rules["groups"].as_sequence_mut().into_iter().flatten() {
        for rule in group["rules"].as_sequence_mut().into_iter().flatten() {
            if rule["alert"].as_str() == Some(alert) {
                rule["for"] = "0s".into();
                found = true;
            }
        }
    }
    if !found {
        return Err(invalid(format!("no alert {alert}")));
    }
    let file = dir.join("alerts.yaml");
    let text = serde_yaml::to_string(&rules).map_err(|e| invalid(e.to_string()))?;
    std::fs::write(&file, text).map_err(|e| invalid(e.to_string()))?;
    Ok(file)
}

/// Starts Prometheus on the operator's node, scraping the operator (as its ServiceMonitor
/// does) and `engines`, with the shipped rules and `KVCacheTenantAtGrant` firing without its
/// wait.
pub async fn start(engines: &[&Pod]) -> Result<Prometheus, Error> {
    let (host, port) = {
        let op = operator().lock().unwrap_or_else(|p| p.into_inner());
        (op.host.clone(), op.metrics_port)
    };
    let mut targets = vec![Target {
        job: "operator",
        address: format!("{host}:{port}"),
        path: "/metrics",
        labels: labels(NAMESPACE, "kvcache-operator"),
        honor_labels: true,
    }];
    // No master: the store panels and rules read the operator's re-exports.
    for p in engines {
        targets.push(Target {
            job: "engine",
            address: format!("{}:{}", pod_ip(p)?, engine::PORT),
            path: "/metrics",
            labels: labels(
                p.metadata.namespace.as_deref().unwrap_or_default(),
                pods::name_of(p),
            ),
            honor_labels: false,
        });
    }
    let dir = paths::scratch("real-engine-prometheus")?;
    let rules = rules_firing_at_once("KVCacheTenantAtGrant", &dir)?;
    let node = cluster().nodes.nodes.first().ok_or_else(|| Error::Wait {
        what: "a node for Prometheus".into(),
        reason: "the cluster has none".into(),
    })?;
    Prometheus::start(&dir, node, &targets, &[rules])
}

/// Polls `expr` until its answer passes `ok`; fails naming what it waited for and the
/// targets' health.
pub async fn wait_query(
    prom: &Prometheus,
    expr: &str,
    what: &str,
    ok: impl Fn(&[Sample]) -> bool,
) -> Result<Vec<Sample>, Error> {
    let deadline = Instant::now() + SHOWN;
    loop {
        let samples = prom.query(expr)?;
        if ok(&samples) {
            return Ok(samples);
        }
        if Instant::now() > deadline {
            return Err(Error::Wait {
                what: format!("Prometheus: {what} ({expr})"),
                reason: format!(
                    "last answer {samples:?}; targets {:?}; its log: {}",
                    prom.targets()?,
                    prom.log_tail(10)
                ),
            });
        }
        tokio::time::sleep(kvcache_e2e::prometheus::INTERVAL).await;
    }
}

/// Every dashboard panel's query answers with at least one sample; each target is up.
pub async fn every_panel_has_data(prom: &Prometheus) -> Result<(), Error> {
    let deadline = Instant::now() + SHOWN;
    loop {
        let targets = prom.targets()?;
        let mut empty = Vec::new();
        for (panel, expr) in kvcache_render::install::monitoring::expressions()
            .into_iter()
            .filter(|(w, _)| w.starts_with("panel "))
        {
            if prom.query(&expr)?.is_empty() {
                empty.push(format!("{panel}: {expr}"));
            }
        }
        let down: Vec<_> = targets.iter().filter(|t| t.2 != "up").collect();
        if empty.is_empty() && down.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Wait {
                what: "every dashboard panel's query answering with data, every target up".into(),
                reason: format!("no data: {empty:#?}; targets not up: {down:?}"),
            });
        }
        tokio::time::sleep(kvcache_e2e::prometheus::INTERVAL).await;
    }
}
