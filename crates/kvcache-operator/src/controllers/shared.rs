//! What every controller's pass shares: how a reconcile is driven, traced and retried, how an
//! object is applied or deleted, and how an event is built from the `Note` a plan decided and
//! recorded.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use kvcache_render::status::events::{Kind, Note};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::context::{Context, MANAGER};
use crate::error::{Error, kube as kerr, retry_after};

/// The finalizer named `release` (`kvcache_render::names::RELEASE_FINALIZER`).
pub const RELEASE_FINALIZER: &str = kvcache_render::names::RELEASE_FINALIZER;

/// Runs `controller` until shutdown: each reconcile through [`traced`] under the name
/// `name`, failures retried by [`error_policy`] (`held`: when a held deletion is looked at
/// again); outcomes are the metrics' and the logs', nothing more is done with them here.
pub(crate) async fn drive<K, F, Fut>(
    controller: kube::runtime::Controller<K>,
    name: &'static str,
    reconcile: F,
    held: Duration,
    ctx: Arc<Context>,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    use futures::StreamExt;
    controller
        .shutdown_on_signal()
        .run(traced(name, reconcile), error_policy(held), ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Server-side apply under the one field manager, forced.
pub(crate) async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
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

/// Deletes the object `name` of kind `kind`, a missing one being deleted already (`false`).
pub(crate) async fn delete<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    params: &DeleteParams,
) -> Result<bool, Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(kerr("delete", format!("{kind} {name}"))(e)),
    }
}

/// Publishes `event` on `regarding` (a pass's every event goes through here); a failure to
/// record one is logged and never fails the pass.
pub(crate) async fn publish(ctx: &Context, regarding: &ObjectReference, event: &Event) {
    if let Err(e) = ctx.recorder.publish(event, regarding).await {
        warn!(error = %e, reason = %event.reason, "could not record an event");
    }
}

/// The event of a note `kvcache-render::status::events` (or a controller) decided on, under `action`,
/// naming `secondary` when the note is about another object (a member Pod).
pub(crate) fn event_of(note: &Note, action: &str, secondary: Option<ObjectReference>) -> Event {
    Event {
        type_: match note.kind {
            Kind::Normal => EventType::Normal,
            Kind::Warning => EventType::Warning,
        },
        reason: note.reason.into(),
        // The API server refuses a note over 1 kB.
        note: Some(note.message.chars().take(1000).collect()),
        action: action.into(),
        secondary,
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
pub(crate) fn id<K: Resource>(o: &K) -> String {
    match o.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", o.name_any()),
        None => o.name_any(),
    }
}

/// A reconcile function whose every call runs in a span naming the controller, the object's
/// namespace and name and a trace id of its own, so that every log line of one reconcile
/// (JSON with `--log-format json`: the span's fields are on each line) can be found together;
/// its outcome and duration, failures included, go to `kvcache_operator_reconcile_*`.
pub fn traced<K, F, Fut>(
    controller: &'static str,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<Context>) -> BoxFuture<'static, Result<Action, Error>>
where
    K: kube::Resource,
    F: Fn(Arc<K>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    use tracing::Instrument;
    move |object, ctx| {
        let meta = object.meta();
        let span = tracing::info_span!(
            "reconcile",
            controller,
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            // `object`, not `name`: JSON logs print the span's own name under `name`.
            object = meta.name.as_deref().unwrap_or_default(),
            trace_id = %trace_id(),
        );
        let pass = reconcile(object, ctx.clone());
        async move {
            let started = Instant::now();
            let result = pass.await;
            let outcome = result.as_ref().err().map_or("ok", Error::metric_label);
            ctx.metrics
                .reconciled(controller, outcome, started.elapsed().as_secs_f64());
            result
        }
        .instrument(span)
        .boxed()
    }
}

/// A fresh 128-bit id in the W3C trace-context spelling (32 hex digits): two 64-bit hashes of
/// a process-wide counter under the process's random hasher keys.
pub fn trace_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::AtomicU64;
    static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let keys = KEYS.get_or_init(std::hash::RandomState::new);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u64| {
        let mut h = keys.build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}

/// The error policy of every controller: a held deletion is retried after `held` (logged at
/// info: it is waiting, not failing), anything else after [`retry_after`] with a warning. The
/// failure's duration is recorded by [`traced`].
pub(crate) fn error_policy<K: Resource>(
    held: Duration,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |object, error, _| match error.held() {
        Some(why) => {
            info!(object = %id(&*object), why, "deletion held");
            Action::requeue(held)
        }
        None => {
            warn!(object = %id(&*object), error = %error, "reconcile failed");
            Action::requeue(retry_after(error))
        }
    }
}
