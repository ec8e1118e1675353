//! Writing a status: server-side apply on `/status` of a document holding only `apiVersion`,
//! `kind` and `status`, under a field manager, forced. An object deleted since the pass began
//! is not an error: there is nothing left to report on.

use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, kube as kerr};

/// Applies `status` to the object `name` of `kind` through `api`.
pub async fn apply<K, S>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    manager: &str,
    status: &S,
) -> Result<(), Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
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
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(kerr("patch status of", format!("{kind} {name}"))(e)),
    }
}
