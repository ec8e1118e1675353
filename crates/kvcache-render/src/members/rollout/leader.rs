//! The two-step election enablement of the leader Deployment
//! (docs/design.md#two-step-election): whether the standbys wait for election to run at one
//! replica first.

use k8s_openapi::api::apps::v1::Deployment;

/// Whether the leader Deployment's template runs the elector.
fn elects(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.command.as_ref())
        .and_then(|c| c.first())
        .is_some_and(|c| c == crate::names::ELECTOR_PATH)
}

/// The two-step election enablement (docs/design.md#two-step-election): when the live leader
/// Deployment does not run the elector yet and the rendered one asks for standbys, election is
/// first enabled at one replica; the standbys follow once that rollout is complete. Returns
/// whether standbys are held back.
pub fn hold_standbys(live: Option<&Deployment>, rendered: &Deployment) -> bool {
    let wanted = rendered.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(live) = live else {
        return false;
    };
    if wanted <= 1 || !elects(rendered) {
        return false;
    }
    if !elects(live) {
        return true;
    }
    // Election is on in the live template; while it runs at one replica, wait for that rollout.
    let replicas = live.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = live.status.clone().unwrap_or_default();
    let caught_up = status.observed_generation.is_some()
        && status.observed_generation == live.metadata.generation;
    replicas == 1
        && !(caught_up
            && status.updated_replicas.unwrap_or(0) == 1
            && status.replicas.unwrap_or(0) == 1)
}
