//! The Helm chart in `deploy/helm/kvcache-operator` against the generated `deploy/operator.yaml`:
//! `helm template` (Helm built from the Go module proxy by `cargo xtask setup`) with the default
//! values gives the same objects, and each value changes what it says.

use std::path::PathBuf;

use kvcache_e2e::paths;

fn helm() -> PathBuf {
    let bin = paths::cache_dir().join("helm/v3.22.0/helm");
    assert!(
        bin.exists(),
        "{} not found: run `cargo xtask setup` (or `cargo xtask test`), which builds it",
        bin.display()
    );
    bin
}

/// `helm template` of the chart with `set` values; the objects, keyed by kind and name.
fn template(set: &[&str]) -> Vec<((String, String), serde_json::Value)> {
    template_with(set, &[])
}

/// As [`template`], with `set_json` values too (`--set-json`, for lists).
fn template_with(set: &[&str], set_json: &[&str]) -> Vec<((String, String), serde_json::Value)> {
    let chart = paths::workspace_root().join("deploy/helm/kvcache-operator");
    let mut cmd = std::process::Command::new(helm());
    cmd.args(["template", "kvcache-operator"])
        .arg(&chart)
        .arg("--include-crds");
    for s in set {
        cmd.args(["--set", s]);
    }
    for s in set_json {
        cmd.args(["--set-json", s]);
    }
    let out = cmd.output().expect("helm runs");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    objects(&String::from_utf8_lossy(&out.stdout))
}

fn objects(text: &str) -> Vec<((String, String), serde_json::Value)> {
    let mut out: Vec<_> = serde_yaml::Deserializer::from_str(text)
        .filter_map(|d| {
            let v: serde_json::Value = serde::Deserialize::deserialize(d).expect("YAML");
            (!v.is_null()).then_some(v)
        })
        .map(|v| {
            let key = (
                v["kind"].as_str().unwrap_or_default().to_owned(),
                v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            (key, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn installation() -> Vec<((String, String), serde_json::Value)> {
    let text = std::fs::read_to_string(paths::workspace_root().join("deploy/operator.yaml"))
        .expect("deploy/operator.yaml");
    objects(&text)
}

fn find<'a>(
    objs: &'a [((String, String), serde_json::Value)],
    kind: &str,
) -> Option<&'a serde_json::Value> {
    objs.iter().find(|(k, _)| k.0 == kind).map(|(_, v)| v)
}

#[test]
fn the_chart_with_its_default_values_is_the_installation() {
    let chart = template(&[]);
    let install = installation();
    let keys = |o: &[((String, String), serde_json::Value)]| {
        o.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
    };
    assert_eq!(keys(&chart), keys(&install));
    for ((key, a), (_, b)) in chart.iter().zip(install.iter()) {
        assert_eq!(
            a, b,
            "{key:?} differs between the chart and deploy/operator.yaml"
        );
    }
}

#[test]
fn each_value_changes_what_it_names() {
    let chart = template(&[
        "image=registry.example/kvcache-operator:9",
        "replicas=3",
        "namespace=kv-system",
        "webhook.enabled=false",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "resources.limits.memory=512Mi",
        "isolationProbe=false",
        "unknownSegments=report",
    ]);
    let d = find(&chart, "Deployment").expect("a Deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["namespace"], "kv-system");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example/kvcache-operator:9");
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        !args.iter().any(|a| a.starts_with("--webhook-addr")),
        "{args:?}"
    );
    // The two settings of docs/isolation.md, each a flag only when it departs from the
    // default.
    assert!(
        args.contains(&"--isolation-probe=false") && args.contains(&"--unknown-segments=report"),
        "{args:?}"
    );
    assert!(find(&chart, "ValidatingWebhookConfiguration").is_none());
    assert!(find(&chart, "MutatingWebhookConfiguration").is_none());
    let monitor = find(&chart, "ServiceMonitor").expect("a ServiceMonitor");
    assert_eq!(monitor["metadata"]["namespace"], "kv-system");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
    // The alert rules, as deploy/monitoring/ ships them, their own templates intact.
    let rule = find(&chart, "PrometheusRule").expect("a PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "kv-system");
    let shipped: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(
            kvcache_e2e::paths::workspace_root().join("deploy/monitoring/prometheusrule.yaml"),
        )
        .expect("deploy/monitoring/prometheusrule.yaml"),
    )
    .expect("YAML");
    assert_eq!(rule["spec"], shipped["spec"]);
    assert!(
        rule["spec"].to_string().contains("{{ $labels.namespace }}"),
        "the alerts' label templates survive Helm"
    );
    // The RBAC follows the namespace.
    let binding = find(&chart, "ClusterRoleBinding").expect("a ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["namespace"], "kv-system");
}

#[test]
fn the_network_values_give_the_policy_the_installation_renders_for_the_same_settings() {
    use kvcache_render::install::{Access, operator_with_access};
    use kvcache_render::plan::resolve::{DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE};
    for (control_plane, metrics_from) in [
        (vec![], vec![]),
        (vec!["10.0.0.0/28", "fd00::/64"], vec!["ops"]),
        (vec!["10.0.0.0/28"], vec![]),
        (vec![], vec!["monitoring", "ops"]),
    ] {
        let values = [
            format!("controlPlaneCIDRs={}", serde_json::json!(control_plane)),
            format!("metricsFrom={}", serde_json::json!(metrics_from)),
        ];
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let chart = template_with(&[], &values);
        let access = Access {
            control_plane: control_plane.iter().map(|s| (*s).to_owned()).collect(),
            metrics_from: metrics_from.iter().map(|s| (*s).to_owned()).collect(),
        };
        let rendered = operator_with_access(DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE, &access)
            .expect("renders")
            .into_iter()
            .find(|d| d["kind"].as_str() == Some("NetworkPolicy"))
            .expect("a NetworkPolicy");
        let rendered = serde_json::to_value(rendered).expect("JSON");
        assert_eq!(find(&chart, "NetworkPolicy"), Some(&rendered), "{values:?}");
    }
}
