//! The operator's own installation: namespace, account, least-privilege RBAC, Deployment and
//! Service. `cargo xtask manifests` writes it to `deploy/operator.yaml`. The webhook
//! configurations ([`webhooks`]) are kept out of the file until the operator serves them.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace, ObjectFieldSelector,
    PodSpec, PodTemplateSpec, Probe, Service, ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

const NAME: &str = "kvcache-operator";
/// The webhook server's port in the operator Pod.
pub const WEBHOOK_PORT: i32 = 9443;
/// Metrics and health.
pub const METRICS_PORT: i32 = 8080;

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), NAME.into()),
        ("app.kubernetes.io/component".into(), "operator".into()),
        (
            "app.kubernetes.io/managed-by".into(),
            "kvcache-operator".into(),
        ),
    ])
}

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_owned),
        labels: Some(labels()),
        ..Default::default()
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

fn role_ref(kind: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: NAME.into(),
    }
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// Every object of the installation, as YAML documents in apply order.
pub fn operator(namespace: &str, image: &str) -> Result<Vec<serde_yaml::Value>, crate::Error> {
    let ns = Some(namespace);
    let mut docs = Vec::new();
    // Both bindings grant the operator's own account.
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    };
    // k8s-openapi writes each object's apiVersion and kind itself.
    fn push<T: Serialize + k8s_openapi::Resource>(
        docs: &mut Vec<serde_yaml::Value>,
        o: &T,
    ) -> Result<(), crate::Error> {
        let v = serde_yaml::to_value(o).map_err(|e| crate::Error::Yaml {
            object: T::KIND.to_owned(),
            message: e.to_string(),
        })?;
        docs.push(v);
        Ok(())
    }
    push(
        &mut docs,
        &Namespace {
            metadata: meta(namespace, None),
            ..Default::default()
        },
    )?;
    push(
        &mut docs,
        &ServiceAccount {
            metadata: meta(NAME, ns),
            ..Default::default()
        },
    )?;
    // Cluster-wide: its own kinds, what the injection and admission read, events.
    push(
        &mut docs,
        &ClusterRole {
            metadata: meta(NAME, None),
            rules: Some(vec![
                rule(
                    &["worker.gpustack.ai"],
                    &[
                        "kvcachebackends",
                        "kvcachepools",
                        "kvcachepoolbindings",
                        "modeldeployments",
                        "instancetypes",
                    ],
                    &["get", "list", "watch", "update", "patch"],
                ),
                rule(
                    &["worker.gpustack.ai"],
                    &[
                        "kvcachebackends/status",
                        "kvcachepools/status",
                        "kvcachepoolbindings/status",
                        "modeldeployments/status",
                    ],
                    &["get", "update", "patch"],
                ),
                rule(
                    &["worker.gpustack.ai"],
                    &[
                        "kvcachebackends/finalizers",
                        "kvcachepools/finalizers",
                        "kvcachepoolbindings/finalizers",
                        "modeldeployments/finalizers",
                    ],
                    &["update"],
                ),
                rule(&["apps"], &["deployments"], WRITE),
                rule(&[""], &["services"], WRITE),
                rule(&[""], &["pods"], READ),
                rule(&[""], &["nodes", "namespaces"], READ),
                rule(&[""], &["events"], &["create", "patch"]),
                rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
                rule(
                    &["apiextensions.k8s.io"],
                    &["customresourcedefinitions"],
                    &["get"],
                ),
            ]),
            ..Default::default()
        },
    )?;
    push(
        &mut docs,
        &ClusterRoleBinding {
            metadata: meta(NAME, None),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(vec![subject.clone()]),
        },
    )?;
    // In its own namespace only: the store workloads and what their Pods are granted (a Role
    // can only grant what its creator holds).
    push(
        &mut docs,
        &Role {
            metadata: meta(NAME, ns),
            rules: Some(vec![
                rule(&["apps"], &["daemonsets"], WRITE),
                rule(&[""], &["configmaps", "serviceaccounts"], WRITE),
                // Member Pods whose template changed are deleted (DaemonSets are OnDelete).
                rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
                // The leader Service's endpoints tell when the serving leader moves.
                rule(&["discovery.k8s.io"], &["endpointslices"], READ),
                rule(&["coordination.k8s.io"], &["leases"], WRITE),
                rule(
                    &["rbac.authorization.k8s.io"],
                    &["roles", "rolebindings"],
                    WRITE,
                ),
            ]),
        },
    )?;
    push(
        &mut docs,
        &RoleBinding {
            metadata: meta(NAME, ns),
            role_ref: role_ref("Role"),
            subjects: Some(vec![subject]),
        },
    )?;
    let selector: BTreeMap<String, String> = labels()
        .into_iter()
        .filter(|(k, _)| k != "app.kubernetes.io/managed-by")
        .collect();
    push(
        &mut docs,
        &Deployment {
            metadata: meta(NAME, ns),
            spec: Some(DeploymentSpec {
                // Two replicas: one runs the controllers while holding the Lease
                // `kvcache-operator`, the other stands by and takes over when it is released.
                replicas: Some(2),
                selector: LabelSelector {
                    match_labels: Some(selector.clone()),
                    ..Default::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels()),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(NAME.into()),
                        containers: vec![Container {
                            name: "operator".into(),
                            image: Some(image.into()),
                            args: Some(vec!["run".into(), "--leader-elect".into()]),
                            env: Some(vec![EnvVar {
                                name: "KVCACHE_NAMESPACE".into(),
                                value_from: Some(EnvVarSource {
                                    field_ref: Some(ObjectFieldSelector {
                                        api_version: None,
                                        field_path: "metadata.namespace".into(),
                                    }),
                                    ..Default::default()
                                }),
                                value: None,
                            }]),
                            ports: Some(vec![
                                ContainerPort {
                                    name: Some("webhook".into()),
                                    container_port: WEBHOOK_PORT,
                                    ..Default::default()
                                },
                                ContainerPort {
                                    name: Some("metrics".into()),
                                    container_port: METRICS_PORT,
                                    ..Default::default()
                                },
                            ]),
                            readiness_probe: Some(Probe {
                                http_get: Some(HTTPGetAction {
                                    path: Some("/health".into()),
                                    port: IntOrString::String("metrics".into()),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            ..Default::default()
        },
    )?;
    push(
        &mut docs,
        &Service {
            metadata: meta(NAME, ns),
            spec: Some(ServiceSpec {
                selector: Some(selector),
                ports: Some(vec![
                    ServicePort {
                        name: Some("webhook".into()),
                        port: 443,
                        target_port: Some(IntOrString::String("webhook".into())),
                        ..Default::default()
                    },
                    ServicePort {
                        name: Some("metrics".into()),
                        port: METRICS_PORT,
                        target_port: Some(IntOrString::String("metrics".into())),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        },
    )?;
    Ok(docs)
}

/// The webhook configurations the operator registers once it serves them (the Pod injection,
/// the validation of our kinds, the Pod annotation freeze). Not part of the installation file:
/// a configuration whose server is not running with a `caBundle` blocks every matching write.
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
                    &["worker.gpustack.ai"],
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

/// The installation as one YAML stream with a header.
pub fn operator_yaml(namespace: &str, image: &str) -> Result<String, crate::Error> {
    let body = operator(namespace, image)?
        .iter()
        .map(serde_yaml::to_string)
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| crate::Error::Yaml {
            object: "the installation".into(),
            message: e.to_string(),
        })?;
    Ok(format!(
        "# Generated by `cargo xtask manifests` from crates/kvcache-render; do not edit.\n# CRDs are in deploy/crds/.\n{}",
        body.join("---\n")
    ))
}
