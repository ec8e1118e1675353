//! The webhook configurations, addressed to the operator's Service, and the
//! ValidatingAdmissionPolicy that lets the operator's account change only their `caBundle`.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, MutatingWebhook, MutatingWebhookConfiguration,
    NamedRuleWithOperations, RuleWithOperations, ServiceReference, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, ValidatingWebhook, ValidatingWebhookConfiguration, Validation,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::meta::{NAME, meta};

/// The fields of a webhook that the operator's account must leave as they are (every field but
/// `clientConfig.caBundle`, whose `url` and `service` are compared apart).
const WEBHOOK_FIELDS_KEPT: &[&str] = &[
    "rules",
    "failurePolicy",
    "matchPolicy",
    "namespaceSelector",
    "objectSelector",
    "sideEffects",
    "timeoutSeconds",
    "admissionReviewVersions",
    "matchConditions",
    "reinvocationPolicy",
];

/// The CEL that holds when an update of a webhook configuration changed nothing but the
/// webhooks' `caBundle`: the same webhooks by name, each with every other field as it was, and
/// the same labels and annotations.
pub(crate) fn ca_bundle_only_expression() -> String {
    let same: Vec<String> = WEBHOOK_FIELDS_KEPT
        .iter()
        .map(|f| format!("o.?{f} == w.?{f}"))
        .collect();
    format!(
        "object.metadata.?labels == oldObject.metadata.?labels \
         && object.metadata.?annotations == oldObject.metadata.?annotations \
         && object.?webhooks.orValue([]).size() == oldObject.?webhooks.orValue([]).size() \
         && object.?webhooks.orValue([]).all(w, oldObject.?webhooks.orValue([]).exists(o, \
         o.name == w.name \
         && o.clientConfig.?url == w.clientConfig.?url \
         && o.clientConfig.?service == w.clientConfig.?service \
         && {}))",
        same.join(" && ")
    )
}

/// A ValidatingAdmissionPolicy and its binding that let the operator's account change nothing
/// in a webhook configuration but `caBundle`: RBAC can limit it to its own two configurations
/// and to `update`, not to one field, and an account that could rewrite their rules or failure
/// policy could switch the admission checks off.
pub(super) fn webhook_guard(
    namespace: &str,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let name = format!("{NAME}-webhook-ca-bundle-only");
    let account = format!("system:serviceaccount:{namespace}:{NAME}");
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(&name, None),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["admissionregistration.k8s.io".into()]),
                    api_versions: Some(vec!["*".into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    resources: Some(vec![
                        "validatingwebhookconfigurations".into(),
                        "mutatingwebhookconfigurations".into(),
                    ]),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "the-operators-account".into(),
                expression: format!("request.userInfo.username == '{account}'"),
            }]),
            validations: Some(vec![Validation {
                expression: ca_bundle_only_expression(),
                message: Some(format!(
                    "{account} may change only the caBundle of a webhook configuration"
                )),
                reason: Some("Forbidden".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(&name, None),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(name.clone()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

/// The validating webhook's match condition: every CREATE, and an UPDATE only when the spec
/// changes (none of the kinds' rules read metadata).
pub(crate) const SPEC_CHANGES_ONLY: &str =
    "request.operation != 'UPDATE' || object.spec != oldObject.spec";

/// The webhook configurations (the Pod injection, the validation of our kinds, the Pod
/// annotation freeze), addressed to the operator's Service; the operator writes their
/// `caBundle`. Until a replica serves, writes of our kinds and of Pods labelled
/// `kvcache.gpustack.ai/inject: "true"` are refused (they fail closed); nothing else is matched.
pub fn webhooks(namespace: &str) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let client = |path: &str| WebhookClientConfig {
        service: Some(ServiceReference {
            name: NAME.into(),
            namespace: namespace.into(),
            path: Some(path.into()),
            port: Some(443),
        }),
        ..Default::default()
    };
    let ops = |ops: &[&str], groups: &[&str], resources: &[&str]| RuleWithOperations {
        operations: Some(ops.iter().map(|s| (*s).to_owned()).collect()),
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        api_versions: Some(vec!["v1".into()]),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        scope: None,
    };
    let inject_label = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kvcache.gpustack.ai/inject".into(),
            "true".into(),
        )])),
        ..Default::default()
    };
    let mutating = MutatingWebhookConfiguration {
        metadata: meta(NAME, None),
        webhooks: Some(vec![MutatingWebhook {
            name: "inject.kvcache.gpustack.ai".into(),
            client_config: client("/mutate-pods"),
            rules: Some(vec![ops(&["CREATE"], &[""], &["pods"])]),
            object_selector: Some(inject_label.clone()),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["kube-system".into()]),
                }]),
                ..Default::default()
            }),
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(10),
            ..Default::default()
        }]),
    };
    let validating = ValidatingWebhookConfiguration {
        metadata: meta(NAME, None),
        webhooks: Some(vec![
            ValidatingWebhook {
                name: "validate.kvcache.gpustack.ai".into(),
                client_config: client("/validate"),
                rules: Some(vec![ops(
                    &["CREATE", "UPDATE"],
                    &[kvcache_api::GROUP],
                    &[
                        "kvcachebackends",
                        "kvcachepools",
                        "kvcachepoolbindings",
                        "modeldeployments",
                        "instancetypes",
                    ],
                )]),
                // Equivalent: a request through another version of these resources (should
                // one be served later) is converted and judged all the same.
                match_policy: Some("Equivalent".into()),
                // Only what the webhook judges is sent to it: an update that leaves the spec
                // alone (a finalizer removed, a label or annotation) never waits on a stopped
                // operator, so a namespace deletion or a stuck object can always finish.
                match_conditions: Some(vec![MatchCondition {
                    name: "spec-changes-only".into(),
                    expression: SPEC_CHANGES_ONLY.into(),
                }]),
                failure_policy: Some("Fail".into()),
                side_effects: "None".into(),
                admission_review_versions: vec!["v1".into()],
                timeout_seconds: Some(10),
                ..Default::default()
            },
            ValidatingWebhook {
                name: "freeze.kvcache.gpustack.ai".into(),
                client_config: client("/validate-pods"),
                rules: Some(vec![ops(&["UPDATE"], &[""], &["pods"])]),
                object_selector: Some(inject_label),
                failure_policy: Some("Ignore".into()),
                side_effects: "None".into(),
                admission_review_versions: vec!["v1".into()],
                timeout_seconds: Some(5),
                ..Default::default()
            },
        ]),
    };
    (mutating, validating)
}
