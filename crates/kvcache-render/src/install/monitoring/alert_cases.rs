//! A unit test per alert rule, in promtool's format (`promtool test rules`): for each alert,
//! the series that should fire it, and at two times what Prometheus must make of them: nothing
//! while its `for` has not run out, then the alert with its labels and its annotations as the
//! reader gets them. `cargo xtask manifests` writes them to `deploy/monitoring/alerts-test.yaml`
//! beside the rules; `tests/tests/monitoring.rs` runs promtool over both.

use serde_json::{Value, json};

use super::alerts::{Alert, alerts};

/// What fires one alert.
struct Case {
    /// The alert's name.
    alert: &'static str,
    /// Input series (`name{labels}`) and their values in promtool's expanding notation, one
    /// sample a minute from time 0.
    series: &'static [(&'static str, &'static str)],
    /// An evaluation time at which it must not fire yet (its `for` has not run out).
    quiet_at: &'static str,
    /// An evaluation time at which it fires.
    fires_at: &'static str,
    /// The labels the fired alert carries besides `alertname` and `severity` (what the
    /// expression keeps of the series).
    labels: &'static [(&'static str, &'static str)],
}

const CASES: &[Case] = &[
    Case {
        alert: "KVCacheStoreLeaderStalled",
        // The operator's leader hands over at minute 11: one alert for the backend all along.
        series: &[
            (
                "kvcache_operator_store_master_ping_requests_total{backend=\"mooncake-dram\",pod=\"kvcache-operator-0\"}",
                "100+0x10 stale",
            ),
            (
                "kvcache_operator_store_master_put_start_requests_total{backend=\"mooncake-dram\",pod=\"kvcache-operator-0\"}",
                "7+0x10 stale",
            ),
            (
                "kvcache_operator_store_master_ping_requests_total{backend=\"mooncake-dram\",pod=\"kvcache-operator-1\"}",
                "_x11 100+0x30",
            ),
            (
                "kvcache_operator_store_master_put_start_requests_total{backend=\"mooncake-dram\",pod=\"kvcache-operator-1\"}",
                "_x11 7+0x30",
            ),
            // Another backend's master still counts pings.
            (
                "kvcache_operator_store_master_ping_requests_total{backend=\"mooncake-disk\",pod=\"kvcache-operator-0\"}",
                "0+60x40",
            ),
            (
                "kvcache_operator_store_master_put_start_requests_total{backend=\"mooncake-disk\",pod=\"kvcache-operator-0\"}",
                "0x40",
            ),
        ],
        quiet_at: "4m",
        fires_at: "20m",
        labels: &[("backend", "mooncake-dram")],
    },
    Case {
        alert: "KVCacheStoreMetricsAbsent",
        // Three backends reconciled: the operator reads two masters and holds a reading of one
        // only; the third is external with no Admin endpoint, so its master is never read (no
        // reads, no series) and it stays quiet.
        series: &[
            (
                "kvcache_operator_backend_degraded{backend=\"mooncake-dram\",pod=\"kvcache-operator-0\"}",
                "0x30",
            ),
            (
                "kvcache_operator_store_reads_total{backend=\"mooncake-dram\",result=\"ok\",pod=\"kvcache-operator-0\"}",
                "0+4x30",
            ),
            (
                "kvcache_operator_backend_store_series{backend=\"mooncake-dram\",pod=\"kvcache-operator-0\"}",
                "148x30",
            ),
            (
                "kvcache_operator_backend_degraded{backend=\"mooncake-disk\",pod=\"kvcache-operator-0\"}",
                "0x30",
            ),
            (
                "kvcache_operator_store_reads_total{backend=\"mooncake-disk\",result=\"error\",pod=\"kvcache-operator-0\"}",
                "0+4x30",
            ),
            (
                "kvcache_operator_backend_degraded{backend=\"external\",pod=\"kvcache-operator-0\"}",
                "0x30",
            ),
        ],
        quiet_at: "8m",
        fires_at: "15m",
        labels: &[("backend", "mooncake-disk")],
    },
    Case {
        alert: "KVCacheCapacityZeroWithMembersReady",
        series: &[
            (
                "kvcache_operator_backend_capacity_bytes{backend=\"mooncake-dram\"}",
                "0x30",
            ),
            (
                "kvcache_operator_backend_members{backend=\"mooncake-dram\",state=\"ready\"}",
                "2x30",
            ),
        ],
        quiet_at: "3m",
        fires_at: "10m",
        labels: &[("backend", "mooncake-dram")],
    },
    Case {
        alert: "KVCacheBackendDegraded",
        series: &[(
            "kvcache_operator_backend_degraded{backend=\"mooncake-dram\"}",
            "1x30",
        )],
        quiet_at: "8m",
        fires_at: "15m",
        labels: &[("backend", "mooncake-dram")],
    },
    Case {
        alert: "KVCacheUnknownSegment",
        // A rogue segment confirmed at minute 6; another backend has none.
        series: &[
            (
                "kvcache_operator_backend_unknown_segments{backend=\"mooncake-dram\",pod=\"kvcache-operator-0\"}",
                "0x5 1x20",
            ),
            (
                "kvcache_operator_backend_unknown_segments{backend=\"mooncake-disk\",pod=\"kvcache-operator-0\"}",
                "0x25",
            ),
        ],
        quiet_at: "6m",
        fires_at: "10m",
        labels: &[("backend", "mooncake-dram")],
    },
    Case {
        alert: "KVCacheTenantRejectsRising",
        series: &[(
            "kvcache_operator_store_master_put_start_failures_total{backend=\"mooncake-dram\",pod=\"kvcache-operator-0\"}",
            "0+12x40",
        )],
        quiet_at: "8m",
        fires_at: "20m",
        labels: &[("backend", "mooncake-dram")],
    },
    Case {
        alert: "KVCacheTenantAtGrant",
        series: &[(
            "kvcache_operator_binding_quota_pressure{namespace=\"team-a\",binding=\"team-a\",domain=\"qwen\"}",
            "0x5 1x40",
        )],
        quiet_at: "15m",
        fires_at: "25m",
        labels: &[
            ("namespace", "team-a"),
            ("binding", "team-a"),
            ("domain", "qwen"),
        ],
    },
    Case {
        alert: "KVCacheLoadsFallingBack",
        series: &[
            (
                "kvcache_operator_model_shared_cache_failed_loads{namespace=\"team-a\",deployment=\"qwen-chat\"}",
                "5x30",
            ),
            (
                "kvcache_operator_model_shared_cache_loads{namespace=\"team-a\",deployment=\"qwen-chat\"}",
                "20x30",
            ),
        ],
        quiet_at: "8m",
        fires_at: "15m",
        labels: &[("namespace", "team-a"), ("deployment", "qwen-chat")],
    },
    Case {
        alert: "KVCacheOperatorReconcileErrors",
        series: &[(
            "kvcache_operator_reconciles_total{controller=\"backend\",result=\"error\"}",
            "0+3x40",
        )],
        quiet_at: "10m",
        fires_at: "30m",
        labels: &[("controller", "backend"), ("result", "error")],
    },
    Case {
        alert: "KVCacheOperatorWebhookCertificateExpiring",
        // Expires three days after the test's time 0.
        series: &[(
            "kvcache_operator_webhook_certificate_expiry_timestamp_seconds{pod=\"kvcache-operator-0\"}",
            "259200x100",
        )],
        quiet_at: "30m",
        fires_at: "70m",
        labels: &[("pod", "kvcache-operator-0")],
    },
    Case {
        alert: "KVCacheOperatorNoLeader",
        series: &[
            (
                "kvcache_operator_leader{pod=\"kvcache-operator-0\"}",
                "0x20",
            ),
            (
                "kvcache_operator_leader{pod=\"kvcache-operator-1\"}",
                "0x20",
            ),
        ],
        quiet_at: "3m",
        fires_at: "10m",
        labels: &[],
    },
];

/// `text` with each `{{ $labels.NAME }}` replaced by that label's value, as Prometheus's
/// template expands an annotation (these annotations use no other template).
fn expanded(text: &str, labels: &[(&str, &str)]) -> String {
    let mut out = text.to_owned();
    for (name, value) in labels {
        out = out.replace(&format!("{{{{ $labels.{name} }}}}"), value);
    }
    out
}

/// The promtool test of one alert.
fn test_of(alert: &Alert, case: &Case) -> Value {
    let mut labels: serde_json::Map<String, Value> = case
        .labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    labels.insert("severity".into(), alert.severity.into());
    json!({
        "name": alert.name,
        "interval": "1m",
        "input_series": case.series.iter().map(|(series, values)| json!({"series": series, "values": values})).collect::<Vec<_>>(),
        "alert_rule_test": [
            {"eval_time": case.quiet_at, "alertname": alert.name, "exp_alerts": []},
            {"eval_time": case.fires_at, "alertname": alert.name, "exp_alerts": [{
                "exp_labels": labels,
                "exp_annotations": {
                    "summary": alert.summary,
                    "description": expanded(alert.description, case.labels),
                },
            }]},
        ],
    })
}

/// The promtool test file for `rules` (the rule file's name beside it): one test per alert,
/// in the rules' order. An alert without a case is an error naming it.
pub(crate) fn promtool_tests(rules: &str) -> Result<Value, crate::error::Error> {
    let mut tests = Vec::new();
    for alert in alerts() {
        let case = CASES
            .iter()
            .find(|c| c.alert == alert.name)
            .ok_or_else(|| crate::error::Error::Yaml {
                object: format!("the promtool test of alert {}", alert.name),
                message: "no case in crates/kvcache-render/src/install/monitoring/alert_cases.rs"
                    .into(),
            })?;
        tests.push(test_of(&alert, case));
    }
    Ok(json!({
        "rule_files": [rules],
        "evaluation_interval": "1m",
        "tests": tests,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alert_has_one_case_and_every_case_an_alert() {
        let names: Vec<&str> = alerts().iter().map(|a| a.name).collect();
        for a in &names {
            assert_eq!(
                CASES.iter().filter(|c| c.alert == *a).count(),
                1,
                "alert {a}"
            );
        }
        for c in CASES {
            assert!(names.contains(&c.alert), "case {} names no alert", c.alert);
        }
        let file = promtool_tests("alerts.yaml").expect("a test file");
        assert_eq!(file["tests"].as_array().map(Vec::len), Some(names.len()));
    }

    #[test]
    fn annotations_are_expanded_with_the_alerts_labels() {
        assert_eq!(
            expanded(
                "{{ $labels.namespace }}/{{ $labels.binding }} in {{ $labels.namespace }}",
                &[("namespace", "team-a"), ("binding", "b")]
            ),
            "team-a/b in team-a"
        );
    }
}
