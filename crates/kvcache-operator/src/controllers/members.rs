//! The member steps a backend's pass carries out, as its plan decided them
//! (`kvcache_render::plan::backend`): the rollout's drains and replacements, each recorded on
//! the member Pod and as an event; the members of other backends restarted; the segments of no
//! member Pod drained onto the members.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_render::members::mounts::OtherMember;
use kvcache_render::members::rollout::{GroupStep, Step, step_event};
use kvcache_render::observe::read::{DRAIN_JOB_ANNOTATION, DRAIN_STARTED_ANNOTATION};
use kvcache_render::observe::store::{DrainRequest, ReadError};
use kvcache_render::plan::backend::{self as plan, BackendPlan, BackendRead};
use kvcache_render::status::backend::Observation;
use kvcache_render::status::events;
use tracing::{info, warn};

use super::shared;
use crate::context::Context;
use crate::error::{Error, kube as kerr};

/// Asks the master to drain each segment of no member Pod the plan picked
/// (`kvcache_render::members::mounts::quarantine`), with a Warning event on the backend naming it and
/// the job; a refusal or no answer is logged, and the next pass asks again while the segment
/// still takes blocks.
pub(crate) async fn quarantine(ctx: &Context, b: &KVCacheBackend, drains: &[DrainRequest]) {
    let Some(admin) = ctx.admin_address(b) else {
        return;
    };
    for req in drains {
        let segment = req.segments.join(", ");
        match ctx.store.create_drain(&admin, req).await {
            Ok(job) => {
                warn!(%segment, %job, "draining a segment no member Pod mounted");
                let note = events::unknown_segment_draining(&segment, &job);
                shared::publish(
                    ctx,
                    &b.object_ref(&()),
                    &shared::event_of(&note, "Quarantine", None),
                )
                .await;
            }
            Err(e) => {
                warn!(%segment, error = %e, "the master did not drain a segment no member Pod mounted");
            }
        }
    }
}

/// Restarts each member of another backend that this backend's master lists (`foreign`, from
/// `kvcache_render::members::mounts::foreign_mounts`), so that it mounts on its own master again, with
/// a Warning event on this backend naming it.
pub(crate) async fn restart_foreign_members(
    ctx: &Context,
    b: &KVCacheBackend,
    foreign: &[OtherMember],
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    for m in foreign {
        warn!(pod = %m.pod.name, of = %m.backend, "a member of another backend is mounted on this master; restarting it");
        pods.delete(&m.pod.name, &DeleteParams::default())
            .await
            .map_err(kerr("delete", format!("Pod {}", m.pod.name)))?;
        let note = events::foreign_member_restarted(&m.pod.name, &m.backend, &m.pod.ip);
        let pod = member_ref(ctx, &m.pod.name);
        shared::publish(
            ctx,
            &b.object_ref(&()),
            &shared::event_of(&note, "Reconcile", Some(pod)),
        )
        .await;
    }
    Ok(())
}

/// Deletes the serving leader Pod the plan hands over (its node leaves; a standby on a node
/// that stays takes over), with an event on the backend saying whether the keys are kept.
pub(crate) async fn hand_over(
    ctx: &Context,
    b: &KVCacheBackend,
    plan: &BackendPlan,
) -> Result<(), Error> {
    let Some(h) = &plan.handover else {
        return Ok(());
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    info!(pod = %h.pod, node = %h.node, standby = %h.standby, "handing the serving leader over before its node goes");
    if shared::delete(&pods, "Pod", &h.pod, &DeleteParams::default()).await? {
        let note = events::leader_handed_over(h);
        shared::publish(
            ctx,
            &b.object_ref(&()),
            &shared::event_of(&note, "Maintenance", Some(member_ref(ctx, &h.pod))),
        )
        .await;
    }
    Ok(())
}

/// Carries out the member rollout's step per group that the plan decided, each drained first
/// where it can be; a drain the master refuses is decided again (the member goes without one).
/// Returns the steps for the status.
pub(crate) async fn roll_members(
    ctx: &Context,
    b: &KVCacheBackend,
    read: &BackendRead<'_>,
    plan: &BackendPlan,
) -> Result<Vec<GroupStep>, Error> {
    let admin = ctx.admin_address(b);
    let obs = &plan.observation;
    let mut refused = BTreeMap::new();
    let mut steps = obs.rollout.clone();
    for (i, step) in steps.iter_mut().enumerate() {
        if let Some((pod, refusal)) = carry_out(ctx, b, obs, admin.as_deref(), step).await? {
            refused.insert(pod, refusal);
            if let Some(again) = plan::rollout(read, obs, &plan.groups, &refused)
                .into_iter()
                .nth(i)
            {
                carry_out(ctx, b, obs, admin.as_deref(), &again).await?;
                *step = again;
            }
        }
    }
    Ok(steps)
}

/// Carries out one group's step: a drain asked of the master and recorded on the Pod, or the
/// Pod deleted (a running job cancelled first), each with its event. Returns the master's
/// refusal of a drain (the Pod's name and the answer), for the step to be decided again.
pub(crate) async fn carry_out(
    ctx: &Context,
    b: &KVCacheBackend,
    obs: &Observation,
    admin: Option<&str>,
    step: &GroupStep,
) -> Result<Option<(String, ReadError)>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    match &step.step {
        Step::StartDrain {
            pod,
            segment,
            targets,
            ..
        } => {
            let Some(admin) = admin else {
                return Ok(None);
            };
            // The start is written first: the drain is bounded even if the answer is lost.
            let started = obs
                .members
                .iter()
                .find(|p| p.name == *pod)
                .and_then(|p| p.drain.as_ref())
                .and_then(|d| d.started);
            if started.is_none() {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                annotate(&pods, pod, DRAIN_STARTED_ANNOTATION, &now).await?;
            }
            match ctx
                .store
                .create_drain(admin, &DrainRequest::new(segment, targets))
                .await
            {
                Ok(job) => {
                    match &step.maintenance {
                        Some(why) => {
                            info!(pod = %pod, job = %job, node_leaving = %why, "draining a member's segment before its node goes");
                        }
                        None => {
                            info!(pod = %pod, job = %job, "draining a member's segment before replacing it");
                        }
                    }
                    annotate(&pods, pod, DRAIN_JOB_ANNOTATION, &job).await?;
                    publish(ctx, b, pod, step, Some(&job)).await;
                }
                Err(e @ (ReadError::Status { .. } | ReadError::Refused { .. })) => {
                    return Ok(Some((pod.clone(), e)));
                }
                // No answer: the next pass finds the start recorded and asks again.
                Err(e) => warn!(pod = %pod, error = %e, "the master did not answer a drain"),
            }
        }
        Step::Replace { pod, .. } => {
            if let (Some(admin), Some(job)) = (admin, step.step.cancel())
                && let Err(e) = ctx.store.cancel_drain(admin, job).await
            {
                warn!(pod = %pod, job, error = %e, "could not cancel a drain past its deadline");
            }
            info!(pod = %pod, "replacing a member Pod whose template changed");
            if shared::delete(&pods, "Pod", pod, &DeleteParams::default()).await? {
                publish(ctx, b, pod, step, None).await;
            }
        }
        Step::UpToDate | Step::Wait { .. } | Step::AwaitDrain { .. } => {}
    }
    Ok(None)
}

/// Sets one annotation on a member Pod.
pub(crate) async fn annotate(
    pods: &Api<Pod>,
    pod: &str,
    key: &str,
    value: &str,
) -> Result<(), Error> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr("annotate", format!("Pod {pod}")))?;
    Ok(())
}

/// A member Pod, as an event names it.
fn member_ref(ctx: &Context, pod: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.to_owned()),
        namespace: Some(ctx.config.namespace.clone()),
        ..Default::default()
    }
}

/// Records the event of a carried-out step on the backend, naming the member Pod.
pub(crate) async fn publish(
    ctx: &Context,
    b: &KVCacheBackend,
    pod: &str,
    step: &GroupStep,
    job: Option<&str>,
) {
    if let Some(note) = step_event(step, job) {
        let event = shared::event_of(&note, "Rollout", Some(member_ref(ctx, pod)));
        shared::publish(ctx, &b.object_ref(&()), &event).await;
    }
}
