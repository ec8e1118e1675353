//! The NetworkPolicy of each Pod opted in by label that asked for one
//! (`kvcache.gpustack.ai/network-policy: DeclaredPorts`; the injection webhook labels it
//! `kvcache.gpustack.ai/engine-policy`): rendered by `kvcache_render::objects::engine_access::pod_policy`,
//! applied once the Pod exists, owned by the Pod so that the garbage collector removes it with
//! the Pod (docs/isolation.md#engine-pods).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kvcache_render::objects::engine_access::{ENGINE_POLICY_LABEL, held_by_another, pod_policy};
use tracing::{instrument, warn};

use crate::context::Context;
use crate::error::{Error, kube as kerr};

const CONTROLLER: &str = "enginepod";

/// Runs the controller until shutdown.
pub async fn run(ctx: Arc<Context>) {
    // Only the labelled Pods, their policies' owners: nothing else of a Pod is read.
    let controller = crate::watch::controller(
        Api::<Pod>::all(ctx.client.clone()),
        watcher::Config::default().labels(ENGINE_POLICY_LABEL),
    );
    super::shared::drive(controller, CONTROLLER, reconcile, crate::error::RETRY, ctx).await;
}

#[instrument(skip(pod, ctx), fields(pod = %super::shared::id(&*pod)))]
async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A Pod being deleted keeps its policy until it is gone (then the collector takes it).
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(policy) = pod_policy(&pod) else {
        return Ok(Action::await_change());
    };
    let ns = pod.namespace().unwrap_or_default();
    let name = policy.metadata.name.clone().unwrap_or_default();
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    // Applied once: the Pod's spec, and so the policy, does not change while it runs.
    match api
        .get_opt(&name)
        .await
        .map_err(kerr("get", format!("NetworkPolicy {ns}/{name}")))?
    {
        Some(existing) if held_by_another(&existing, &pod.uid().unwrap_or_default()) => {
            warn!(policy = %name, "a NetworkPolicy of this Pod's policy name is another's: left alone");
        }
        Some(_) => {}
        None => {
            super::shared::apply(&api, &policy).await?;
        }
    }
    Ok(Action::await_change())
}
