//! The alert rules under the real promtool (Prometheus v0.316.0, built by `cargo xtask setup`
//! from `xtask/go/prometheus`): `deploy/monitoring/alerts.yaml` and the PrometheusRule's groups
//! pass `promtool check rules`, and every alert passes its unit test
//! (`deploy/monitoring/alerts-test.yaml`, from `kvcache_render::install::monitoring`): quiet before its
//! `for` runs out, then firing with its labels and its annotations expanded.

use std::path::PathBuf;
use std::process::Command;

use kvcache_e2e::paths;

fn promtool() -> Command {
    let bin = paths::prometheus_dir().join("promtool");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask setup` (or `cargo xtask test`), which builds it",
        bin.display()
    );
    Command::new(bin)
}

fn monitoring() -> PathBuf {
    paths::workspace_root().join("deploy").join("monitoring")
}

/// Runs promtool; its output, or a panic with it.
fn run(args: &[&str]) -> String {
    let out = promtool()
        .args(args)
        .current_dir(monitoring())
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

#[test]
fn the_rule_file_and_the_prometheus_rules_groups_pass_promtools_check() {
    let text = run(&["check", "rules", "alerts.yaml"]);
    let alerts = kvcache_render::install::monitoring::expressions()
        .iter()
        .filter(|(w, _)| w.starts_with("alert "))
        .count();
    assert!(text.contains(&format!("{alerts} rules found")), "{text}");
    // The PrometheusRule carries the same groups under `spec`: promtool reads them as a rule
    // file.
    let rule: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(monitoring().join("prometheusrule.yaml"))
            .expect("prometheusrule.yaml"),
    )
    .expect("YAML");
    let dir = paths::scratch("promtool").expect("a folder");
    let groups = dir.join("groups.yaml");
    std::fs::write(
        &groups,
        serde_yaml::to_string(&rule["spec"]).expect("the groups"),
    )
    .expect("written");
    let text = run(&["check", "rules", &groups.display().to_string()]);
    assert!(text.contains(&format!("{alerts} rules found")), "{text}");
}

#[test]
fn every_alert_is_quiet_before_its_for_and_fires_with_its_labels_and_annotations() {
    let text = run(&["test", "rules", "alerts-test.yaml"]);
    assert!(text.contains("SUCCESS"), "{text}");
}
