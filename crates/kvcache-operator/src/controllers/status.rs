//! Writing a status: server-side apply on `/status` of a document holding only `apiVersion`,
//! `kind` and `status`, under a field manager, forced. An object deleted since the pass began
//! is not an error: there is nothing left to report on.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, kube as kerr};

/// Applies `status` to the object `meta` names, of `kind`, through `api`. A write that changed
/// the object (its resourceVersion moved from the one `meta` was read at) is logged at info, in
/// the reconcile's span.
pub async fn apply<K, S>(
    api: &Api<K>,
    kind: &str,
    meta: &ObjectMeta,
    manager: &str,
    status: &S,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let name = meta.name.as_deref().unwrap_or_default();
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", kvcache_api::GROUP, kvcache_api::VERSION),
        "kind": kind,
        "status": status,
    });
    match api
        .patch_status(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(written) => {
            if written.meta().resource_version != meta.resource_version {
                tracing::info!(kind, name, manager, "status updated");
            }
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(kerr("patch status of", format!("{kind} {name}"))(e)),
    }
}
