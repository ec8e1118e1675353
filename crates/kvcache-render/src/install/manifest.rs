//! The whole installation in apply order, as YAML documents ([`operator`]) and as the one
//! stream `deploy/operator.yaml` holds ([`operator_yaml`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use super::access::{Access, network_policy, policy_comment};
use super::deployment::{deployment, disruption_budget, service};
use super::meta::{NAME, meta};
use super::rbac::{cluster_role, namespace_role, role_ref, subject};
use super::webhook::{webhook_guard, webhooks};

/// Every object of the installation, as YAML documents in apply order, with the default
/// [`Access`] (what `deploy/operator.yaml` holds).
pub fn operator(
    namespace: &str,
    image: &str,
) -> Result<Vec<serde_yaml::Value>, crate::error::Error> {
    operator_with_access(namespace, image, &Access::default())
}

/// Every object of the installation, as YAML documents in apply order, its NetworkPolicy
/// admitting what `access` names.
pub fn operator_with_access(
    namespace: &str,
    image: &str,
    access: &Access,
) -> Result<Vec<serde_yaml::Value>, crate::error::Error> {
    let ns = Some(namespace);
    let mut docs = Vec::new();
    // The CRDs first: everything else may name their kinds.
    for crd in kvcache_api::crd::all() {
        push(&mut docs, &crd)?;
    }
    push(&mut docs, &namespace_object(namespace))?;
    push(
        &mut docs,
        &ServiceAccount {
            metadata: meta(NAME, ns),
            ..Default::default()
        },
    )?;
    push(&mut docs, &cluster_role())?;
    push(
        &mut docs,
        &ClusterRoleBinding {
            metadata: meta(NAME, None),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(vec![subject(namespace)]),
        },
    )?;
    push(&mut docs, &namespace_role(namespace))?;
    push(
        &mut docs,
        &RoleBinding {
            metadata: meta(NAME, ns),
            role_ref: role_ref("Role"),
            subjects: Some(vec![subject(namespace)]),
        },
    )?;
    push(&mut docs, &deployment(namespace, image, access))?;
    push(&mut docs, &service(namespace))?;
    push(&mut docs, &disruption_budget(namespace))?;
    push(&mut docs, &network_policy(namespace, access))?;
    let (mutating, validating) = webhooks(namespace);
    push(&mut docs, &validating)?;
    push(&mut docs, &mutating)?;
    let (policy, binding) = webhook_guard(namespace);
    push(&mut docs, &policy)?;
    push(&mut docs, &binding)?;
    Ok(docs)
}

/// Appends one object as a YAML document (k8s-openapi writes its apiVersion and kind itself).
fn push<T: Serialize + k8s_openapi::Resource>(
    docs: &mut Vec<serde_yaml::Value>,
    o: &T,
) -> Result<(), crate::error::Error> {
    let v = serde_yaml::to_value(o).map_err(|e| crate::error::Error::Yaml {
        object: T::KIND.to_owned(),
        message: e.to_string(),
    })?;
    docs.push(v);
    Ok(())
}

/// The namespace. It (and the CRDs) carry no `component: operator` label: the uninstall
/// (`kubectl delete -f deploy/operator.yaml -l app.kubernetes.io/component=operator`) keeps
/// them, and with them every object and the store workloads in the namespace.
fn namespace_object(namespace: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.into()),
            // The store Pods meet the restricted Pod Security Standard but for a fabric
            // group's host network and a disk tier's host folder (docs/isolation.md
            // #pod-security): warned and audited here; a cluster with neither sets `enforce`.
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".into(),
                    "kvcache-operator".into(),
                ),
                (
                    "pod-security.kubernetes.io/warn".into(),
                    "restricted".into(),
                ),
                (
                    "pod-security.kubernetes.io/audit".into(),
                    "restricted".into(),
                ),
            ])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The installation as one YAML stream with a header (`deploy/operator.yaml`).
pub fn operator_yaml(namespace: &str, image: &str) -> Result<String, crate::error::Error> {
    operator_yaml_with_access(namespace, image, &Access::default())
}

/// The installation as one YAML stream with a header, its NetworkPolicy admitting what
/// `access` names and a comment above it saying so.
pub fn operator_yaml_with_access(
    namespace: &str,
    image: &str,
    access: &Access,
) -> Result<String, crate::error::Error> {
    let body = operator_with_access(namespace, image, access)?
        .iter()
        .map(|doc| {
            let text = serde_yaml::to_string(doc)?;
            Ok(if doc["kind"].as_str() == Some("NetworkPolicy") {
                format!("{}{text}", policy_comment(access))
            } else {
                text
            })
        })
        .collect::<Result<Vec<String>, serde_yaml::Error>>()
        .map_err(|e| crate::error::Error::Yaml {
            object: "the installation".into(),
            message: e.to_string(),
        })?;
    Ok(format!(
        "# Generated by `cargo xtask manifests` from crates/kvcache-render; do not edit.\n# Install: kubectl apply -f deploy/operator.yaml (README: Install).\n{}",
        body.join("---\n")
    ))
}
