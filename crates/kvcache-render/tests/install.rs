//! The operator's installation manifest is generated and committed (this fails when it is
//! stale); its objects are parsed and judged one by one: least-privilege RBAC, and webhook
//! configurations kept out of the file until the operator serves them.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kvcache_render::install::{operator, operator_yaml, webhooks};
use kvcache_render::resolve::{DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE};

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
fn the_installation_registers_no_webhook_it_cannot_serve_yet() {
    let kinds: Vec<String> = installation().iter().map(|d| kind(d).to_owned()).collect();
    for webhook_kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(
            !kinds.iter().any(|k| k == webhook_kind),
            "{webhook_kind} in the installation: {kinds:?}"
        );
    }
    assert!(kinds.iter().any(|k| k == "Deployment"), "{kinds:?}");
}

#[test]
fn no_rule_reaches_secrets_or_grants_wildcards() {
    let rules = rules();
    assert!(!rules.is_empty(), "the installation grants something");
    for (role, rule) in &rules {
        let resources = rule.resources.clone().unwrap_or_default();
        assert!(
            !resources.iter().any(|r| r == "secrets" || r == "*"),
            "{role}: {rule:?}"
        );
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
    // Pods are read cluster-wide, never written there.
    for (role, rule) in rules.iter().filter(|(r, _)| r.starts_with("ClusterRole")) {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r == "pods"))
        {
            assert_eq!(rule.verbs, ["get", "list", "watch"], "{role}: {rule:?}");
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
