//! A real Prometheus (built by `cargo xtask setup` from the module proxy) that scrapes the
//! operator and the engines on the harness's nodes, evaluates the rules of
//! `deploy/monitoring/alerts.yaml`, and answers the tests' queries over its HTTP API. The
//! stores' series come from the operator, which re-exports each master's
//! (`kvcache_operator_store_*`): like a Prometheus in the cluster, it needs no way to a master's
//! admin port (docs/isolation.md).
//!
//! It runs in a node's network namespace: it reaches Pods at their own addresses, as a
//! Prometheus in the cluster does. Its targets are a static scrape configuration with the labels
//! the installation's ServiceMonitor and a Pod scrape give (`namespace`, `pod`; the operator's
//! own labels honoured, as the ServiceMonitor says).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::nodes::NodeInfo;
use crate::process::{Proc, free_port, wait_for};
use crate::{Error, Result, paths};

/// How often it scrapes and evaluates its rules.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// One scrape target: its job, `host:port`, and the labels it is given.
#[derive(Clone, Debug)]
pub struct Target {
    /// The job (`operator`, `engine`).
    pub job: &'static str,
    /// `host:port`.
    pub address: String,
    /// Where its metrics are served (`/metrics`).
    pub path: &'static str,
    /// The labels a Kubernetes scrape would give it (`namespace`, `pod`).
    pub labels: BTreeMap<String, String>,
    /// Whether the scraped series keep their own labels over the target's.
    pub honor_labels: bool,
}

/// A running Prometheus. Dropping it stops the process.
pub struct Prometheus {
    proc: Proc,
    /// `http://host:port`.
    url: String,
}

/// The configuration file: every target in its own static group, the rule files named.
fn config(targets: &[Target], rules: &[PathBuf]) -> serde_json::Value {
    let interval = format!("{}s", INTERVAL.as_secs());
    let scrapes: Vec<serde_json::Value> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({
                "job_name": format!("{}-{i}", t.job),
                "metrics_path": t.path,
                "honor_labels": t.honor_labels,
                // What a target without a Content-Type header is read as.
                "fallback_scrape_protocol": "PrometheusText0.0.4",
                "static_configs": [{
                    "targets": [t.address],
                    "labels": t.labels.iter().map(|(k, v)| (k.clone(), v.clone()))
                        .chain([("job".to_owned(), t.job.to_owned())])
                        .collect::<BTreeMap<_, _>>(),
                }],
            })
        })
        .collect();
    serde_json::json!({
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": rules,
        "scrape_configs": scrapes,
    })
}

impl Prometheus {
    /// Starts Prometheus in `node`'s network namespace with `targets` and the rule files
    /// `rules`, its data and log under `dir`, and waits until it is ready.
    pub fn start(
        dir: &Path,
        node: &NodeInfo,
        targets: &[Target],
        rules: &[PathBuf],
    ) -> Result<Prometheus> {
        let bin = paths::prometheus_dir().join("prometheus");
        if !bin.exists() {
            return Err(Error::Missing {
                what: "prometheus".into(),
                path: bin,
            });
        }
        let file = dir.join("prometheus.yml");
        let text = serde_yaml::to_string(&config(targets, rules)).map_err(|e| Error::Invalid {
            path: file.display().to_string(),
            what: "Prometheus configuration",
            reason: e.to_string(),
        })?;
        std::fs::write(&file, text).map_err(crate::io(format!("writing {}", file.display())))?;
        let port = free_port()?;
        let listen = format!("{}:{port}", node.ip);
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/var/run/netns/{}", node.name))
            .arg(&bin)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .arg("--log.level=warn");
        let mut proc = Proc::spawn("prometheus", cmd, &dir.join("prometheus.log"))?;
        crate::process::reaper(&[proc.pid()])?;
        let url = format!("http://{listen}");
        let ready = format!("{url}/-/ready");
        wait_for(&mut proc, Duration::from_secs(60), || {
            crate::store::http_get(&ready).is_ok()
        })?;
        Ok(Prometheus { proc, url })
    }

    /// The result of the instant query `expr` now: its samples (`metric` labels and `value`).
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        let url = format!("{}/api/v1/query", self.url);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            // A refused query's answer says why (`errorType`, `error`).
            .http_status_as_error(false)
            .build()
            .into();
        let http = |message: String| Error::Http {
            url: format!("{url}?query={expr}"),
            message,
        };
        let body = agent
            .get(&url)
            .query("query", expr)
            .call()
            .map_err(|e| http(e.to_string()))?
            .body_mut()
            .read_to_string()
            .map_err(|e| http(e.to_string()))?;
        let answer: Answer =
            serde_json::from_str(&body).map_err(|e| http(format!("{e}: {body}")))?;
        match (answer.status.as_str(), answer.data) {
            ("success", Some(data)) => Ok(data.result),
            _ => Err(http(format!(
                "{}: {}",
                answer.error_type.unwrap_or_default(),
                answer.error.unwrap_or(body)
            ))),
        }
    }

    /// Each target's last scrape: `(job, address, health, last error)`.
    pub fn targets(&self) -> Result<Vec<(String, String, String, String)>> {
        let url = format!("{}/api/v1/targets", self.url);
        let body = crate::store::http_get(&url)?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| Error::Http {
            url: url.clone(),
            message: e.to_string(),
        })?;
        let text = |t: &serde_json::Value, k: &str| t[k].as_str().unwrap_or_default().to_owned();
        Ok(v["data"]["activeTargets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["labels"]["job"].as_str().unwrap_or_default().to_owned(),
                    text(t, "scrapeUrl"),
                    text(t, "health"),
                    text(t, "lastError"),
                )
            })
            .collect())
    }

    /// Its log's last lines, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }
}

/// One sample of an instant query's answer.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Sample {
    /// Its labels.
    pub metric: BTreeMap<String, String>,
    /// `[time, "value"]`.
    pub value: (f64, String),
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    data: Option<Data>,
    error_type: Option<String>,
    error: Option<String>,
}

#[derive(serde::Deserialize)]
struct Data {
    result: Vec<Sample>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_target_is_its_own_job_with_its_labels_and_the_rules_named() {
        let t = Target {
            job: "operator",
            address: "10.0.0.2:8080".into(),
            path: "/metrics",
            labels: BTreeMap::from([("namespace".to_owned(), "gpustack-system".to_owned())]),
            honor_labels: true,
        };
        let c = config(&[t], &[PathBuf::from("/r/alerts.yaml")]);
        assert_eq!(c["rule_files"][0], "/r/alerts.yaml");
        let s = &c["scrape_configs"][0];
        assert_eq!(s["job_name"], "operator-0");
        assert_eq!(s["honor_labels"], true);
        assert_eq!(s["static_configs"][0]["targets"][0], "10.0.0.2:8080");
        assert_eq!(s["static_configs"][0]["labels"]["job"], "operator");
        assert_eq!(
            s["static_configs"][0]["labels"]["namespace"],
            "gpustack-system"
        );
    }
}
