//! The controllers, one file each, and what they share: server-side apply under the operator's
//! field manager, pruning what a render no longer returns, the error policy, the status writer.

mod backend;
mod binding;
mod model;
mod pool;
pub mod status;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use kvcache_render::backend::OWNER_LABEL;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::context::{Context, MANAGER};
use crate::error::{Error, kube as kerr, retry_after};

/// Runs the controllers until shutdown. Pools, Bindings and ModelDeployments are reconciled by
/// the operator that reconciles every backend (`--backend-selector` scopes backends only, for
/// several operators on one cluster).
pub async fn run(ctx: Arc<Context>) {
    if ctx.config.backend_selector.is_empty() {
        tokio::join!(
            backend::run(ctx.clone()),
            pool::run(ctx.clone()),
            binding::run(ctx.clone()),
            model::run(ctx.clone()),
        );
    } else {
        backend::run(ctx).await;
    }
}

/// Server-side apply under the one field manager, forced.
async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(kerr(
        "apply",
        format!("{} {name}", K::kind(&K::DynamicType::default())),
    ))
}

/// Deletes one object, a missing one being deleted already.
async fn delete<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(kerr(
            "delete",
            format!("{} {name}", K::kind(&K::DynamicType::default())),
        )(e)),
    }
}

/// Deletes the objects of one kind owned by `uid` (the owner label) that the render no longer
/// returns.
async fn prune<K>(api: &Api<K>, uid: &str, keep: &BTreeSet<String>) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let list = api
        .list(&ListParams::default().labels(&format!("{OWNER_LABEL}={uid}")))
        .await
        .map_err(kerr("list", kind.clone()))?;
    for o in list {
        let name = o.name_any();
        if keep.contains(&name) || o.meta().deletion_timestamp.is_some() {
            continue;
        }
        info!(kind = %kind, name = %name, "pruning an object the render no longer returns");
        delete(api, &name, &DeleteParams::default()).await?;
    }
    Ok(())
}

fn names<K: Resource>(objs: &[K]) -> BTreeSet<String> {
    objs.iter().filter_map(|o| o.meta().name.clone()).collect()
}

/// `namespace/name`, or `name` for a cluster-scoped object.
fn id<K: Resource>(o: &K) -> String {
    match o.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", o.name_any()),
        None => o.name_any(),
    }
}

/// The error policy of every controller: a held deletion is retried after `held` (logged at
/// info: it is waiting, not failing), anything else after [`retry_after`] with a warning. The
/// failure's duration is recorded by [`crate::watch::traced`].
fn error_policy<K: Resource>(held: Duration) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |object, error, _| match error {
        Error::DeletionHeld(why) => {
            info!(object = %id(&*object), why, "deletion held");
            Action::requeue(held)
        }
        e => {
            warn!(object = %id(&*object), error = %e, "reconcile failed");
            Action::requeue(retry_after(e))
        }
    }
}
