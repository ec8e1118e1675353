//! The operator's own installation: the CRDs, namespace, account, least-privilege RBAC, the
//! Deployment (two replicas, leader election), its Service, PodDisruptionBudget and the webhook
//! configurations. `cargo xtask manifests` writes it to `deploy/operator.yaml`.

mod access;
mod deployment;
mod helm;
mod manifest;
mod meta;
pub mod monitoring;
mod rbac;
mod webhook;

pub use access::{Access, DEFAULT_METRICS_NAMESPACE};
pub use helm::helm_chart;
pub use manifest::{operator, operator_with_access, operator_yaml, operator_yaml_with_access};
pub use meta::{WEBHOOK_CA_SECRET, WEBHOOK_SECRET};
pub use webhook::webhooks;

#[cfg(test)]
mod tests;
