//! What a platform team's Prometheus and Grafana get: the alert rules (as a plain rule file and
//! as a prometheus-operator `PrometheusRule`) and a Grafana dashboard, all built on the series the
//! operator exports (`kvcache_operator_*`), the masters' own among them: the operator re-exports
//! each backend's master series as `kvcache_operator_store_<name>{backend=…}`
//! ([`crate::observe::store_series`]), so Prometheus scrapes the operator alone and never the masters'
//! port, which is their admin API's too. Only the leading replica reads the stores, so the store
//! rules take `max by (backend)` over the replicas' scrapes. `cargo xtask manifests` writes them
//! to `deploy/monitoring/`.

use serde_json::{Value, json};

mod alert_cases;
mod alerts;

use alerts::alerts;

fn rule_groups() -> Value {
    let rules: Vec<Value> = alerts()
        .into_iter()
        .map(|a| {
            json!({
                "alert": a.name,
                "expr": a.expr,
                "for": a.for_,
                "labels": {"severity": a.severity},
                "annotations": {"summary": a.summary, "description": a.description},
            })
        })
        .collect();
    json!([{"name": "kvcache-operator", "rules": rules}])
}

/// The plain Prometheus rule file (`rule_files:`).
pub(crate) fn rule_file() -> Value {
    json!({"groups": rule_groups()})
}

/// The same rules as a prometheus-operator `PrometheusRule` in `namespace`.
pub(crate) fn prometheus_rule(namespace: &str) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "kvcache-operator",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "kvcache-operator", "app.kubernetes.io/component": "operator"},
        },
        "spec": {"groups": rule_groups()},
    })
}

/// Series the operator exports only for deployments whose engines count shared-cache hits (the
/// real vLLM; `tests/tests/real_engine/main.rs` checks them against its scrape, the installation test
/// the rest).
pub const ENGINE_SERIES: &[&str] = &[
    "kvcache_operator_model_shared_cache_hit_ratio",
    "kvcache_operator_model_tokens_from_store",
    "kvcache_operator_model_shared_cache_loads",
    "kvcache_operator_model_shared_cache_failed_loads",
    "kvcache_operator_binding_shared_cache_hit_ratio",
];

/// Series the operator exports once, beyond counting engines, a price a computed token takes
/// is settled (`PrefillPriced=True`; `tests/tests/real_engine/prefill_saved.rs` checks them).
pub const PRICED_SERIES: &[&str] = &["kvcache_operator_binding_prefill_seconds_saved"];

/// A dashboard panel: title, unit, the expressions and their legends.
struct Panel {
    title: &'static str,
    unit: &'static str,
    targets: &'static [(&'static str, &'static str)],
}

const PANELS: &[Panel] = &[
    Panel {
        title: "Capacity per backend (what members registered)",
        unit: "bytes",
        targets: &[("kvcache_operator_backend_capacity_bytes", "{{backend}}")],
    },
    Panel {
        title: "Members per backend",
        unit: "short",
        targets: &[("kvcache_operator_backend_members", "{{backend}} {{state}}")],
    },
    Panel {
        title: "Grant vs usage per tenant (Binding)",
        unit: "bytes",
        targets: &[
            (
                "kvcache_operator_binding_granted_bytes",
                "{{namespace}}/{{binding}} granted",
            ),
            (
                "kvcache_operator_binding_used_bytes",
                "{{namespace}}/{{binding}} used",
            ),
        ],
    },
    Panel {
        title: "Shared-cache hit ratio per deployment (engines' own counters)",
        unit: "percentunit",
        targets: &[(
            "kvcache_operator_model_shared_cache_hit_ratio",
            "{{namespace}}/{{deployment}} ({{domain}})",
        )],
    },
    Panel {
        title: "Prompt tokens loaded from the store per deployment",
        unit: "short",
        targets: &[(
            "kvcache_operator_model_tokens_from_store",
            "{{namespace}}/{{deployment}} ({{domain}})",
        )],
    },
    Panel {
        title: "Per tenant (Binding): hit ratio",
        unit: "percentunit",
        targets: &[(
            "kvcache_operator_binding_shared_cache_hit_ratio",
            "{{namespace}}/{{binding}}",
        )],
    },
    Panel {
        title: "Per tenant (Binding): prefill seconds the cache saved over the window",
        unit: "s",
        targets: &[(
            "kvcache_operator_binding_prefill_seconds_saved",
            "{{namespace}}/{{binding}}",
        )],
    },
    Panel {
        title: "Failed loads per deployment (each one a prefill paid after all)",
        unit: "short",
        targets: &[
            (
                "kvcache_operator_model_shared_cache_failed_loads",
                "{{namespace}}/{{deployment}} failed",
            ),
            (
                "kvcache_operator_model_shared_cache_loads",
                "{{namespace}}/{{deployment}} loads",
            ),
        ],
    },
    Panel {
        title: "Store: allocated vs total",
        unit: "bytes",
        targets: &[
            (
                "max by (backend) (kvcache_operator_store_master_allocated_bytes)",
                "{{backend}} allocated",
            ),
            (
                "max by (backend) (kvcache_operator_store_master_total_capacity_bytes)",
                "{{backend}} total",
            ),
        ],
    },
    Panel {
        title: "Store: tenants' charge",
        unit: "bytes",
        targets: &[(
            "max by (backend, tenant_id) (kvcache_operator_store_mooncake_tenant_quota_charged_bytes)",
            "{{backend}} {{tenant_id}}",
        )],
    },
    Panel {
        title: "Store: series the operator re-exports per backend",
        unit: "short",
        targets: &[(
            "max by (backend) (kvcache_operator_backend_store_series)",
            "{{backend}}",
        )],
    },
    Panel {
        title: "Reconcile errors",
        unit: "ops",
        // A controller with no failure shows 0 rather than no data (a failure's series only
        // exists once one happened).
        targets: &[(
            "sum by (controller, result) (rate(kvcache_operator_reconciles_total{result!=\"ok\"}[5m])) or on (controller) (sum by (controller) (rate(kvcache_operator_reconciles_total[5m])) * 0)",
            "{{controller}} {{result}}",
        )],
    },
    Panel {
        title: "Reconcile duration p99",
        unit: "s",
        targets: &[(
            "histogram_quantile(0.99, sum by (le, controller) (rate(kvcache_operator_reconcile_duration_seconds_bucket[5m])))",
            "{{controller}}",
        )],
    },
    Panel {
        title: "Webhook latency p50 / p99",
        unit: "s",
        targets: &[
            (
                "histogram_quantile(0.5, sum by (le, webhook) (rate(kvcache_operator_webhook_request_duration_seconds_bucket[5m])))",
                "{{webhook}} p50",
            ),
            (
                "histogram_quantile(0.99, sum by (le, webhook) (rate(kvcache_operator_webhook_request_duration_seconds_bucket[5m])))",
                "{{webhook}} p99",
            ),
        ],
    },
    Panel {
        title: "Store reads by result",
        unit: "ops",
        targets: &[(
            "sum by (backend, result) (rate(kvcache_operator_store_reads_total[5m]))",
            "{{backend}} {{result}}",
        )],
    },
];

/// The Grafana dashboard (schema 39; a `datasource` variable picks the Prometheus).
pub fn dashboard() -> Value {
    let panels: Vec<Value> = PANELS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let targets: Vec<Value> = p
                .targets
                .iter()
                .enumerate()
                .map(|(j, (expr, legend))| {
                    json!({
                        "refId": char::from(b'A' + j as u8).to_string(),
                        "expr": expr,
                        "legendFormat": legend,
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    })
                })
                .collect();
            json!({
                "id": i + 1,
                "type": "timeseries",
                "title": p.title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i / 2) * 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": targets,
            })
        })
        .collect();
    json!({
        "title": "KV cache (kvcache-operator)",
        "uid": "kvcache-operator",
        "schemaVersion": 39,
        "version": 1,
        "editable": true,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["kvcache", "mooncake"],
        "templating": {"list": [{
            "name": "datasource", "type": "datasource", "query": "prometheus",
            "label": "Prometheus", "current": {},
        }]},
        "panels": panels,
    })
}

/// The files of `deploy/monitoring/`, by name: `alerts.yaml` (a plain rule file), its promtool
/// unit tests `alerts-test.yaml`, `prometheusrule.yaml` (the same rules for the
/// prometheus-operator) and `dashboard.json`.
pub fn files(namespace: &str) -> Result<Vec<(&'static str, String)>, crate::error::Error> {
    let yaml = |what: &str, v: &Value| {
        serde_yaml::to_string(v).map_err(|e| crate::error::Error::Yaml {
            object: what.to_owned(),
            message: e.to_string(),
        })
    };
    let header =
        "# Generated by `cargo xtask manifests` from crates/kvcache-render; do not edit.\n";
    Ok(vec![
        (
            "alerts.yaml",
            format!("{header}{}", yaml("the alert rules", &rule_file())?),
        ),
        (
            "alerts-test.yaml",
            format!(
                "{header}{}",
                yaml(
                    "the alert rules' tests",
                    &alert_cases::promtool_tests("alerts.yaml")?
                )?
            ),
        ),
        (
            "prometheusrule.yaml",
            format!(
                "{header}{}",
                yaml("the PrometheusRule", &prometheus_rule(namespace))?
            ),
        ),
        (
            "dashboard.json",
            serde_json::to_string_pretty(&dashboard()).map_err(|e| crate::error::Error::Yaml {
                object: "the dashboard".into(),
                message: e.to_string(),
            })? + "\n",
        ),
    ])
}

/// Where the alerts' runbook table sits in `docs/troubleshooting.md`: between these markers.
pub const RUNBOOK_MARKERS: (&str, &str) = ("<!-- alerts:start -->\n", "<!-- alerts:end -->");

/// The runbook: one Markdown table row per alert (its name, severity and wait, what it means
/// and what to do), from the same rules `deploy/monitoring/` ships, so the two cannot drift.
/// `cargo xtask manifests` writes it into `docs/troubleshooting.md` between
/// [`RUNBOOK_MARKERS`].
pub(crate) fn runbook_table() -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(
        "| alert | severity, after | what it means | what to do |\n|---|---|---|---|\n",
    );
    for a in alerts() {
        out.push_str(&format!(
            "| `{}` | {}, {} | {} | {} |\n",
            a.name,
            a.severity,
            a.for_,
            cell(a.summary),
            cell(a.description)
        ));
    }
    out
}

/// `text` (a document holding [`RUNBOOK_MARKERS`]) with the runbook between them
/// `runbook_table` now; `None` when a marker is missing.
pub fn with_runbook(text: &str) -> Option<String> {
    let (start, end) = RUNBOOK_MARKERS;
    let (head, rest) = text.split_once(start)?;
    let (_, tail) = rest.split_once(end)?;
    Some(format!("{head}{start}{}{end}{tail}", runbook_table()))
}

/// Every PromQL expression of the rules and the dashboard, with where it is.
pub fn expressions() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = alerts()
        .into_iter()
        .map(|a| (format!("alert {}", a.name), a.expr.to_owned()))
        .collect();
    for p in PANELS {
        for (expr, _) in p.targets {
            out.push((format!("panel {:?}", p.title), (*expr).to_owned()));
        }
    }
    out
}

/// The series names an expression reads: every identifier of the operator's or the store's
/// families (`kvcache_operator_`, `master_`, `mooncake_`, `segment_` prefixes).
pub fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_braces = false;
    let mut in_quotes = false;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if in_quotes {
            in_quotes = c != '"';
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        // A word ends here: a series name unless it is a label name inside braces.
        if !in_braces
            && ["kvcache_operator_", "master_", "mooncake_", "segment_"]
                .iter()
                .any(|p| word.starts_with(p))
            && !out.contains(&word)
        {
            out.push(word.clone());
        }
        word.clear();
        match c {
            '"' => in_quotes = true,
            '{' => in_braces = true,
            '}' => in_braces = false,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_read_from_expressions_not_from_labels_or_strings() {
        assert_eq!(
            series_in(
                "sum by (backend) (rate(kvcache_operator_reconciles_total{result!=\"master_x\"}[5m])) > 0 and on (backend) master_allocated_bytes"
            ),
            vec![
                "kvcache_operator_reconciles_total",
                "master_allocated_bytes"
            ]
        );
    }

    #[test]
    fn nothing_reads_a_master_directly() {
        // Prometheus scrapes the operator alone: the store's series are its re-exports.
        for (where_, expr) in expressions() {
            for series in series_in(&expr) {
                assert!(
                    series.starts_with("kvcache_operator_"),
                    "{where_} reads {series}, which only a master's own port serves"
                );
            }
        }
    }

    #[test]
    fn every_alert_and_panel_reads_a_series_and_panels_have_unique_ids() {
        for (where_, expr) in expressions() {
            assert!(!series_in(&expr).is_empty(), "{where_}: {expr}");
        }
        let d = dashboard();
        let ids: Vec<u64> = d["panels"]
            .as_array()
            .expect("panels")
            .iter()
            .map(|p| p["id"].as_u64().expect("id"))
            .collect();
        let mut unique = ids.clone();
        unique.dedup();
        assert_eq!(ids, unique);
        for a in alerts() {
            assert!(matches!(a.severity, "warning" | "critical"), "{}", a.name);
            assert!(a.for_.ends_with('m'), "{}", a.name);
        }
    }
}
