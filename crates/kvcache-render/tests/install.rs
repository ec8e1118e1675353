//! The operator's installation manifest is generated and committed (this fails when it is
//! stale); its objects are parsed and judged one by one: least-privilege RBAC, the operator
//! Pod's restricted security settings, the webhook configurations, the disruption budget.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kvcache_render::install::{operator, operator_yaml, webhooks};
use kvcache_render::plan::resolve::{DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE};

fn installation() -> Vec<serde_yaml::Value> {
    operator(DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE).expect("the installation renders")
}

fn kind(doc: &serde_yaml::Value) -> &str {
    doc["kind"].as_str().expect("every object has a kind")
}

fn rules() -> Vec<(String, PolicyRule)> {
    let mut out = Vec::new();
    for doc in installation() {
        let (name, rules) = match kind(&doc) {
            "ClusterRole" => {
                let r: ClusterRole = serde_yaml::from_value(doc).expect("a ClusterRole");
                (
                    format!("ClusterRole {}", r.metadata.name.unwrap_or_default()),
                    r.rules,
                )
            }
            "Role" => {
                let r: Role = serde_yaml::from_value(doc).expect("a Role");
                (
                    format!("Role {}", r.metadata.name.unwrap_or_default()),
                    r.rules,
                )
            }
            _ => continue,
        };
        out.extend(
            rules
                .unwrap_or_default()
                .into_iter()
                .map(|r| (name.clone(), r)),
        );
    }
    out
}

#[test]
fn deploy_operator_yaml_is_up_to_date() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator.yaml");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == operator_yaml(DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE).expect("renders"),
        "{} is stale or missing: run `cargo xtask manifests` and commit it",
        path.display()
    );
}

#[test]
fn deploy_monitoring_is_up_to_date() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    for (name, text) in
        kvcache_render::install::monitoring::files(DEFAULT_NAMESPACE).expect("renders")
    {
        let have = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            have == text,
            "deploy/monitoring/{name} is stale or missing: run `cargo xtask manifests` and commit it"
        );
    }
}

#[test]
fn the_troubleshooting_runbook_lists_every_alert_as_shipped() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/troubleshooting.md");
    let text = std::fs::read_to_string(&path).expect("docs/troubleshooting.md");
    let fresh = kvcache_render::install::monitoring::with_runbook(&text)
        .expect("docs/troubleshooting.md holds the alerts markers");
    assert!(
        fresh == text,
        "the alerts' runbook in docs/troubleshooting.md is stale: run `cargo xtask manifests` and commit it"
    );
    for (what, _) in kvcache_render::install::monitoring::expressions() {
        if let Some(alert) = what.strip_prefix("alert ") {
            assert!(
                text.contains(&format!("| `{alert}` |")),
                "{alert} has its row"
            );
        }
    }
}

#[test]
fn deploy_helm_is_up_to_date() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/kvcache-operator");
    let files = kvcache_render::install::helm_chart(DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE)
        .expect("renders");
    for (name, text) in &files {
        let have = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            have == *text,
            "deploy/helm/kvcache-operator/{name} is stale or missing: run `cargo xtask manifests` and commit it"
        );
    }
    // No file left over from an earlier chart.
    let mut stored = Vec::new();
    for sub in ["", "crds", "templates"] {
        for e in std::fs::read_dir(dir.join(sub))
            .expect("the chart's folders")
            .flatten()
        {
            if e.path().is_file() {
                let name = e.file_name().to_string_lossy().into_owned();
                stored.push(if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    for s in &stored {
        assert!(
            files.iter().any(|(n, _)| n == s),
            "{s} is not generated: remove it"
        );
    }
}

#[test]
fn the_installation_holds_crds_first_then_the_operator_its_webhooks_and_budget() {
    let kinds: Vec<String> = installation().iter().map(|d| kind(d).to_owned()).collect();
    let crds = kinds
        .iter()
        .take_while(|k| *k == "CustomResourceDefinition")
        .count();
    assert_eq!(crds, 5, "the five CRDs come first: {kinds:?}");
    for k in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing: {kinds:?}");
    }
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_yaml::from_value(
        installation()
            .into_iter()
            .find(|d| kind(d) == "Deployment")
            .expect("a Deployment"),
    )
    .expect("parses");
    let spec = deployment.spec.expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default();
    for a in ["run", "--leader-elect", "--webhook-addr=0.0.0.0:9443"] {
        assert!(args.iter().any(|x| x == a), "{a} in {args:?}");
    }
    // The restricted Pod Security Standard, field by field.
    let psc = pod.security_context.expect("pod security context");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.map(|p| p.type_).as_deref(),
        Some("RuntimeDefault")
    );
    let sc = c
        .security_context
        .clone()
        .expect("container security context");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.and_then(|c| c.drop),
        Some(vec!["ALL".to_string()])
    );
    let probe_path = |p: Option<k8s_openapi::api::core::v1::Probe>| {
        p.and_then(|p| p.http_get).and_then(|h| h.path)
    };
    assert_eq!(
        probe_path(c.readiness_probe.clone()).as_deref(),
        Some("/readyz")
    );
    assert_eq!(
        probe_path(c.liveness_probe.clone()).as_deref(),
        Some("/healthz")
    );
}

#[test]
fn no_rule_grants_wildcards_and_secrets_only_in_the_operator_namespace() {
    let rules = rules();
    assert!(!rules.is_empty(), "the installation grants something");
    for (role, rule) in &rules {
        let resources = rule.resources.clone().unwrap_or_default();
        assert!(!resources.iter().any(|r| r == "*"), "{role}: {rule:?}");
        // The webhook's certificate Secret lives in the operator's namespace: a Role, never
        // a ClusterRole, and never delete.
        if resources.iter().any(|r| r == "secrets") {
            assert!(role.starts_with("Role "), "{role}: {rule:?}");
            assert!(
                !rule.verbs.iter().any(|v| v == "delete"),
                "{role}: {rule:?}"
            );
        }
        // Webhook configurations: its own two only.
        if resources
            .iter()
            .any(|r| r.ends_with("webhookconfigurations"))
        {
            assert_eq!(
                rule.resource_names.as_deref(),
                Some(&["kvcache-operator".to_string()][..]),
                "{role}: {rule:?}"
            );
        }
        assert!(!rule.verbs.iter().any(|v| v == "*"), "{role}: {rule:?}");
        assert!(
            !rule
                .api_groups
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|g| g == "*"),
            "{role}: {rule:?}"
        );
    }
    // Pods are listed and watched cluster-wide, never written there.
    for (role, rule) in rules.iter().filter(|(r, _)| r.starts_with("ClusterRole")) {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r == "pods"))
        {
            assert_eq!(rule.verbs, ["list", "watch"], "{role}: {rule:?}");
        }
    }
}

#[test]
fn each_webhook_is_scoped_and_fails_as_intended() {
    let (mutating, validating): (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) =
        webhooks(DEFAULT_NAMESPACE);
    let inject = mutating.webhooks.expect("webhooks");
    assert_eq!(inject.len(), 1);
    let inject = &inject[0];
    assert_eq!(inject.name, "inject.kvcache.gpustack.ai");
    assert_eq!(inject.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(
        inject
            .object_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .and_then(|l| l.get("kvcache.gpustack.ai/inject").cloned())
            .as_deref(),
        Some("true"),
        "only opted-in Pods are mutated"
    );
    let rule = &inject.rules.as_ref().expect("rules")[0];
    assert_eq!(
        rule.operations.as_deref(),
        Some(&["CREATE".to_string()][..])
    );
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_string()][..]));

    let by_name = |name: &str| {
        validating
            .webhooks
            .as_ref()
            .expect("webhooks")
            .iter()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("{name} is registered"))
            .clone()
    };
    let validate = by_name("validate.kvcache.gpustack.ai");
    assert_eq!(validate.failure_policy.as_deref(), Some("Fail"));
    for rule in validate.rules.expect("rules") {
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["worker.gpustack.ai".to_string()][..]),
            "only our group"
        );
    }
    let freeze = by_name("freeze.kvcache.gpustack.ai");
    assert_eq!(
        freeze.failure_policy.as_deref(),
        Some("Ignore"),
        "the Pod freeze guard fails open"
    );
    assert!(
        freeze
            .object_selector
            .and_then(|s| s.match_labels)
            .is_some_and(
                |l| l.get("kvcache.gpustack.ai/inject").map(String::as_str) == Some("true")
            ),
        "the freeze sees opted-in Pods only"
    );
}
