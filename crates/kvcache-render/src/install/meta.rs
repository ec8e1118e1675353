//! What every object of the installation shares: the operator's name, its labels and object
//! metadata, the Secrets of its webhook and the ports of its Pods.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub(super) const NAME: &str = "kvcache-operator";
/// The Secret holding the webhook's serving pair and CA certificate (`kvcache-operator run
/// --webhook-secret`'s default).
pub const WEBHOOK_SECRET: &str = "kvcache-operator-webhook-tls";
/// The Secret holding the webhook's CA and its key, apart from the serving pair
/// (`kvcache-operator run --webhook-ca-secret`'s default).
pub const WEBHOOK_CA_SECRET: &str = "kvcache-operator-webhook-ca";
/// The webhook server's port in the operator Pod.
pub(crate) const WEBHOOK_PORT: i32 = 9443;
/// Metrics and health.
pub(crate) const METRICS_PORT: i32 = 8080;

pub(super) fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), NAME.into()),
        ("app.kubernetes.io/component".into(), "operator".into()),
        (
            "app.kubernetes.io/managed-by".into(),
            "kvcache-operator".into(),
        ),
    ])
}

pub(super) fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_owned),
        labels: Some(labels()),
        ..Default::default()
    }
}

/// The labels the Deployment selects its Pods by.
pub(super) fn selector_labels() -> BTreeMap<String, String> {
    labels()
        .into_iter()
        .filter(|(k, _)| k != "app.kubernetes.io/managed-by")
        .collect()
}
