//! The operator's installation manifest is generated and committed; this fails when it is stale.

use kvcache_render::install::operator_yaml;
use kvcache_render::resolve::{DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE};

#[test]
fn deploy_operator_yaml_is_up_to_date() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator.yaml");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == operator_yaml(DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE),
        "{} is stale or missing: run `cargo xtask manifests` and commit it",
        path.display()
    );
}

#[test]
fn least_privilege_shape() {
    let yaml = operator_yaml(DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE);
    assert!(yaml.contains("kind: MutatingWebhookConfiguration"));
    assert!(
        yaml.contains("failurePolicy: Ignore"),
        "the Pod freeze guard fails open"
    );
    assert!(
        yaml.contains("kvcache.gpustack.ai/inject: 'true'"),
        "only opted-in Pods are mutated"
    );
    assert!(!yaml.contains("secrets"), "the operator reads no Secret");
}
