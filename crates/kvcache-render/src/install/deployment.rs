//! The operator's workload: its Deployment (two replicas, leader election), the Pod and its
//! container, the Service and the PodDisruptionBudget.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::access::Access;
use super::meta::{METRICS_PORT, NAME, WEBHOOK_PORT, labels, meta, selector_labels};

/// The operator Deployment: two replicas, one runs the controllers while holding the Lease
/// `kvcache-operator`, the other stands by and takes over when it is released.
pub(super) fn deployment(namespace: &str, image: &str, access: &Access) -> Deployment {
    Deployment {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..Default::default()
                }),
                spec: Some(pod_spec(image, access)),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The operator Pod: restricted, spread over two nodes where there are two.
fn pod_spec(image: &str, access: &Access) -> PodSpec {
    PodSpec {
        service_account_name: Some(NAME.into()),
        // The restricted Pod Security Standard: non-root, no privilege escalation, every
        // capability dropped, the runtime's seccomp profile, a read-only root filesystem (the
        // operator writes nothing locally).
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        // SIGTERM: the leader releases its Lease, in-flight reconciles and webhook requests
        // drain, all well within this.
        termination_grace_period_seconds: Some(30),
        // The two replicas on different nodes where there are two.
        affinity: Some(crate::names::prefer_separate_nodes(selector_labels())),
        containers: vec![operator_container(image, access)],
        ..Default::default()
    }
}

/// The operator container: `run` with leader election, the webhook and metrics ports (the
/// webhook serving the control plane's addresses alone when `access` names them), probes on
/// `/readyz` and `/healthz`, a read-only root filesystem.
pub(super) fn operator_container(image: &str, access: &Access) -> Container {
    let mut args = vec![
        "run".into(),
        "--leader-elect".into(),
        format!("--webhook-addr=0.0.0.0:{WEBHOOK_PORT}"),
        format!("--metrics-addr=0.0.0.0:{METRICS_PORT}"),
        // One JSON object a line, each with the reconcile's span (controller, namespace, name,
        // trace_id).
        "--log-format=json".into(),
    ];
    // The server itself closes other sources' connections too: where nothing enforces the
    // NetworkPolicy, no other Pod sends reviews or holds the webhook's connections.
    if !access.control_plane.is_empty() {
        args.push(format!(
            "--webhook-allowed-source={}",
            access.control_plane.join(",")
        ));
    }
    Container {
        name: "operator".into(),
        image: Some(image.into()),
        args: Some(args),
        env: Some(vec![
            field_env("KVCACHE_NAMESPACE", "metadata.namespace"),
            // The replica's identity in the Lease and in events.
            field_env("POD_NAME", "metadata.name"),
        ]),
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
        // Ready once the caches are synced and the webhook certificate is loaded: a standby is
        // ready too (it serves webhooks).
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        liveness_probe: Some(http_probe("/healthz", 20, 3)),
        resources: Some(default_resources()),
        // The store containers' restricted settings, the same for the operator.
        security_context: Some(crate::objects::backend::restricted_container()),
        ..Default::default()
    }
}

/// The operator's Service: the webhook on 443, metrics on their own port.
pub(super) fn service(namespace: &str) -> Service {
    Service {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels()),
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
    }
}

/// A drain never takes both replicas at once.
pub(super) fn disruption_budget(namespace: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(NAME, Some(namespace)),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The operator container's CPU request. At 50m (a CPU weight of 51 against an engine's
/// hundreds) the leader missed its Lease renewals while engines prefilled on every core
/// (`lost the operator's Lease kvcache-operator while leading`, seen in `cargo xtask demo`).
pub(crate) const OPERATOR_CPU_REQUEST: &str = "200m";

/// The operator container's requests and limits.
pub(super) fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(OPERATOR_CPU_REQUEST.into())),
            ("memory".to_owned(), Quantity("64Mi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("256Mi".into()),
        )])),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..Default::default()
        }),
        value: None,
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}
