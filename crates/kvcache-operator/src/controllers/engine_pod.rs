//! The NetworkPolicy of each Pod opted in by label that asked for one
//! (`kvcache.gpustack.ai/network-policy: DeclaredPorts`; the injection webhook labels it
//! `kvcache.gpustack.ai/engine-policy`): rendered by `kvcache_render::engine_access::pod_policy`,
//! applied once the Pod exists, owned by the Pod so that the garbage collector removes it with
//! the Pod (docs/isolation.md#engine-pods).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kvcache_render::engine_access::{ENGINE_POLICY_LABEL, pod_policy};
use tracing::instrument;

use crate::context::Context;
use crate::error::Error;

const CONTROLLER: &str = "enginepod";

/// Runs the controller until shutdown.
pub async fn run(ctx: Arc<Context>) {
    // Only the labelled Pods, their policies' owners: nothing else of a Pod is read.
    crate::watch::controller(
        Api::<Pod>::all(ctx.client.clone()),
        watcher::Config::default().labels(ENGINE_POLICY_LABEL),
    )
    .shutdown_on_signal()
    .run(
        super::traced(CONTROLLER, reconcile),
        super::error_policy(crate::error::RETRY),
        ctx,
    )
    .for_each(|_| futures::future::ready(()))
    .await;
}

#[instrument(skip(pod, ctx), fields(pod = %super::id(&*pod)))]
async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A Pod being deleted keeps its policy until it is gone (then the collector takes it).
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(policy) = pod_policy(&pod) {
        let api: Api<NetworkPolicy> =
            Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
        super::apply(&api, &policy).await?;
    }
    // The policy follows the Pod's spec, which does not change once it runs.
    Ok(Action::await_change())
}
