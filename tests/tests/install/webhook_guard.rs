//! The installation's ValidatingAdmissionPolicy on the webhook configurations, enforced by the
//! API server: the operator's account may rewrite their `caBundle` and nothing else.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kvcache_e2e::Error;
use kvcache_e2e::cluster::block_on;

use super::support::*;

/// A client that acts as the operator's account (the admin impersonating it).
async fn as_operator() -> Result<Client, Error> {
    let kc = Kubeconfig::read_from(&cluster().control_plane.kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(ACCOUNT.to_owned());
    Ok(Client::try_from(config)?)
}

/// Replaces the webhook configuration `kind/kvcache-operator` as the operator's account, as
/// read, after `edit`.
async fn replace_as_operator(
    kind: &str,
    plural: &str,
    edit: &(dyn Fn(&mut serde_json::Value) + Send + Sync),
) -> Result<Result<(), kube::Error>, Error> {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    let admin = cluster().client().await?;
    let read = Api::<DynamicObject>::all_with(admin, &resource)
        .get("kvcache-operator")
        .await?;
    let mut value = serde_json::to_value(&read).expect("JSON");
    edit(&mut value);
    let edited: DynamicObject = serde_json::from_value(value).expect("an object");
    Ok(
        Api::<DynamicObject>::all_with(as_operator().await?, &resource)
            .replace("kvcache-operator", &PostParams::default(), &edited)
            .await
            .map(drop),
    )
}

type Edit = Box<dyn Fn(&mut serde_json::Value) + Send + Sync>;

#[test]
fn the_operators_account_may_rewrite_a_webhooks_ca_bundle_and_nothing_else() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        for (kind, plural) in [
            (
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
            ),
            (
                "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations",
            ),
        ] {
            // Its own write, as it makes it: every caBundle rewritten (here with the bundle
            // it holds, so that the webhooks keep working).
            let same_bundle: Edit = Box::new(|o| {
                for w in o["webhooks"].as_array_mut().into_iter().flatten() {
                    let bundle = w["clientConfig"]["caBundle"].clone();
                    assert!(bundle.is_string(), "the operator wrote the bundle: {w}");
                    w["clientConfig"]["caBundle"] = bundle;
                }
            });
            replace_as_operator(kind, plural, &same_bundle)
                .await?
                .unwrap_or_else(|e| panic!("{kind}: its caBundle update refused: {e}"));
            // Switching a check off (fail open, no rules) or relabelling is refused by the
            // policy, not by RBAC: the same account, the same verb.
            let edits: [(&str, Edit); 3] = [
                (
                    "failurePolicy",
                    Box::new(|o| o["webhooks"][0]["failurePolicy"] = "Ignore".into()),
                ),
                (
                    "rules",
                    Box::new(|o| o["webhooks"][0]["rules"] = serde_json::json!([])),
                ),
                (
                    "a label",
                    Box::new(|o| o["metadata"]["labels"]["edited"] = "yes".into()),
                ),
            ];
            for (what, edit) in edits {
                match replace_as_operator(kind, plural, &edit).await? {
                    Err(kube::Error::Api(s)) => assert!(
                        s.message.contains("may change only the caBundle"),
                        "{kind} {what}: refused by the policy, not otherwise: {s:?}"
                    ),
                    other => panic!("{kind}: the operator's account changed {what}: {other:?}"),
                }
            }
        }
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
