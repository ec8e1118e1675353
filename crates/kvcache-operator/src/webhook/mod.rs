//! The admission webhook, served over HTTPS by `kvcache-operator run` on every replica: this
//! module is the HTTP shell (routes, decoding, the metrics and log line of each answer); what an
//! answer says is [`admission`] (pure, over a snapshot of the related objects), the snapshot comes
//! from the caches or from [`live`] reads, [`tls`] serves it and [`certs`] keeps its
//! certificate.

pub mod admission;
pub mod certs;
mod live;
pub mod tls;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tracing::{info, warn};

use crate::context::Context;
use admission::{World, freeze_pod, live_read, mutate_pod, validate};
use live::live_world;

/// What the handlers read.
pub struct Webhook {
    /// The operator's shared state (stores, metrics).
    pub ctx: Arc<Context>,
    /// Turns for live reads, shared by every request ([`live::READS_AT_ONCE`]).
    live_reads: live::Turns,
}

impl Webhook {
    /// The handlers' state over `ctx`.
    pub fn new(ctx: Arc<Context>) -> Self {
        Webhook {
            ctx,
            live_reads: live::Turns::default(),
        }
    }

    fn world(&self) -> World {
        self.ctx.world()
    }
}

async fn validate_handler(
    State(hook): State<Arc<Webhook>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let (settings, settings_warning) = hook.ctx.settings_for_admission();
    // ModelDeployments: live reads (docs/design.md#live-reads). The other kinds: the caches,
    // fresh enough for the claims they judge (a race past them is what DomainExclusive reports).
    let live = match review.request.as_ref() {
        Some(r)
            if r.kind.kind == "ModelDeployment"
                && matches!(r.operation, Operation::Create | Operation::Update) =>
        {
            match r.object.as_ref() {
                Some(o) => Some(hook.live_reads.run(live_world(&hook.ctx.client, o)).await),
                None => None,
            }
        }
        _ => None,
    };
    let world = match live {
        Some(Ok(w)) => Ok(w),
        Some(Err(why)) => Err(why),
        None => with_references(&hook, review.request.as_ref()).await,
    };
    let world = match world {
        Ok(w) => w,
        Err(why) => {
            return answer(&hook, "validate", review, |req| {
                AdmissionResponse::from(req).deny(why)
            });
        }
    };
    answer(&hook, "validate", review, |req| {
        warned(validate(req, &settings, &world), settings_warning)
    })
}

/// The caches' world, with what a Binding or pool being written names read live where the
/// caches lag behind ([`admission::live_read`] decides what): a reference is never judged as
/// missing only because the caches have not seen it yet.
async fn with_references(
    hook: &Webhook,
    req: Option<&AdmissionRequest<DynamicObject>>,
) -> Result<World, crate::error::Error> {
    let mut world = hook.world();
    if let Some(what) = req.and_then(|r| live_read(r, &world)) {
        hook.live_reads
            .run(live::read(&hook.ctx.client, &what, &mut world))
            .await?;
    }
    Ok(world)
}

/// The response with the settings' refusal as a warning `kubectl` prints, when there is one.
fn warned(mut response: AdmissionResponse, warning: Option<String>) -> AdmissionResponse {
    if let Some(w) = warning {
        response.warnings.get_or_insert_with(Vec::new).push(w);
    }
    response
}

/// Decodes a review, answers it with `decide`, records the outcome.
fn answer(
    hook: &Webhook,
    name: &'static str,
    review: AdmissionReview<DynamicObject>,
    decide: impl FnOnce(&AdmissionRequest<DynamicObject>) -> AdmissionResponse,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let started = Instant::now();
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "an AdmissionReview without a request");
            return axum::Json(AdmissionResponse::invalid(e.to_string()).into_review());
        }
    };
    let response = decide(&req);
    let outcome = if response.allowed {
        "allowed"
    } else {
        "refused"
    };
    hook.ctx
        .metrics
        .webhook(name, outcome, started.elapsed().as_secs_f64());
    info!(
        webhook = name,
        kind = %req.kind.kind,
        namespace = req.namespace.as_deref().unwrap_or(""),
        name = %req.name,
        operation = ?req.operation,
        outcome,
        reason = %response.result.reason,
        "admission"
    );
    axum::Json(response.into_review())
}

async fn mutate_pods_handler(
    State(hook): State<Arc<Webhook>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let (settings, settings_warning) = hook.ctx.settings_for_admission();
    let mut world = hook.world();
    let mut unreadable = None;
    // The Binding, pool and backend come from the shared caches (fresh within a watch event);
    // when the chain a Pod names is not all there (a Binding created a moment before its
    // Pods), they are read live, so that the Pod is judged on what exists, not on a lagging
    // cache. A failed read refuses the Pod (the webhook fails closed).
    if let Some(what) = review.request.as_ref().and_then(|r| live_read(r, &world))
        && let Err(e) = hook
            .live_reads
            .run(live::read(&hook.ctx.client, &what, &mut world))
            .await
    {
        warn!(object = %what, error = %e, "live read for a Pod's Binding failed");
        unreadable = Some(e);
    }
    let config = &hook.ctx.config;
    answer(&hook, "inject", review, |req| {
        if let Some(e) = &unreadable {
            return AdmissionResponse::from(req).deny(format!(
                "BindingUnreadable: {e}; the Pod is refused until it can be read"
            ));
        }
        warned(
            mutate_pod(req, &config.namespace, &settings, &world),
            settings_warning,
        )
    })
}

async fn validate_pods_handler(
    State(hook): State<Arc<Webhook>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    answer(&hook, "freeze", review, freeze_pod)
}

/// The webhook's routes: `/validate` (this operator's kinds), `/mutate-pods` (the injection) and
/// `/validate-pods` (the freeze on Pod updates).
pub fn router(hook: Arc<Webhook>) -> Router {
    Router::new()
        .route("/validate", post(validate_handler))
        .route("/mutate-pods", post(mutate_pods_handler))
        .route("/validate-pods", post(validate_pods_handler))
        .with_state(hook)
}
