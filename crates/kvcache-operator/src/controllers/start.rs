//! Starts every controller and says when one ends.

use std::sync::Arc;

use crate::context::{Changes, Context};

use super::{backend, binding, engine_pod, model, pool};

/// Runs the controllers until shutdown, each on its kind's shared cache where `changes` holds a
/// subscription. Pools, Bindings and ModelDeployments are reconciled by the operator that
/// reconciles every backend (`--backend-selector` scopes backends only, for several operators on
/// one cluster).
pub async fn run(
    ctx: Arc<Context>,
    changes: Changes,
    ended: impl Fn(&'static str) + Clone + Send + Sync + 'static,
) {
    let Changes {
        backends,
        pools,
        bindings,
        models,
        instance_types,
        nodes,
    } = changes;
    // Each loop says when it ends (the liveness probe fails on one that ends alone).
    let backend = watched(
        "the KVCacheBackend controller",
        backend::run(
            ctx.clone(),
            backends,
            pools.clone(),
            bindings.clone(),
            nodes,
        ),
        ended.clone(),
    );
    if ctx.config.backend_selector.is_empty() {
        tokio::join!(
            backend,
            watched(
                "the KVCachePool controller",
                pool::run(ctx.clone(), pools),
                ended.clone()
            ),
            watched(
                "the KVCachePoolBinding controller",
                binding::run(ctx.clone(), bindings.clone()),
                ended.clone()
            ),
            watched(
                "the ModelDeployment controller",
                model::run(ctx.clone(), models, bindings, instance_types),
                ended.clone()
            ),
            watched(
                "the engine Pod policy controller",
                engine_pod::run(ctx.clone()),
                ended
            ),
        );
    } else {
        backend.await;
    }
}

/// Runs `controller`, then says that `what` ended.
async fn watched(
    what: &'static str,
    controller: impl std::future::Future<Output = ()>,
    ended: impl Fn(&'static str),
) {
    controller.await;
    ended(what);
}
