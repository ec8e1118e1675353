//! The backend's phase (docs/design.md#backend-phase) and the conditions of its own course:
//! `Deletable`, `RolloutComplete`, `Rendered` and `SettingsRead`.

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::conditions::*;
use kvcache_api::backend::{BackendPhase, ObjectRef};
use kvcache_api::condition::Cond;

use super::facts::{listed, managed, name, no_ready_leader};
use super::observation::Observation;
use crate::members::rollout::{member_progress, stale_member_pods};

/// `Deletable`: held while a pool uses the backend.
pub(super) fn deletable(used_by: &[ObjectRef]) -> Cond {
    if used_by.is_empty() {
        Cond::yes(DELETABLE, "NotInUse", "no pool uses this backend")
    } else {
        Cond::no(
            DELETABLE,
            "InUse",
            format!("in use by {}; delete those first", listed(used_by)),
        )
    }
}

/// `RolloutComplete`: every leader replica and member Pod on the current template; while member
/// Pods are replaced, how: drained first (`MembersDraining`) or not, and why
/// (`MembersRolledWithoutDrain`).
pub(super) fn rollout_complete(b: &KVCacheBackend, obs: &Observation) -> Cond {
    let stale = stale_member_pods(&obs.members, &obs.rendered_hashes);
    // The last member replaced still going, or its successor not created: not complete yet.
    let settling = obs.rollout.iter().any(|g| g.settling());
    match obs.leader {
        _ if obs.standbys_held => Cond::no(
            ROLLOUT_COMPLETE,
            "ReplicasPending",
            "election is being enabled at one replica first; standbys are added once that rollout is complete",
        ),
        Some(l)
            if l.observed
                && l.updated == l.desired
                && l.total == l.desired
                && stale.is_empty()
                && !settling =>
        {
            Cond::yes(
                ROLLOUT_COMPLETE,
                "UpToDate",
                "every leader replica and member Pod runs the current template",
            )
        }
        Some(l) => {
            let leader = format!(
                "leader: {} of {} replicas updated ({} Pods in all)",
                l.updated, l.desired, l.total
            );
            // While members roll, how (docs/design.md#member-rollout).
            match member_progress(&obs.rollout).filter(|_| !stale.is_empty() || settling) {
                // Only the last replacement settling: nothing drains any more.
                Some((_, members)) if stale.is_empty() => Cond::no(
                    ROLLOUT_COMPLETE,
                    "RolloutInProgress",
                    format!("{leader}; {members}"),
                ),
                Some((reason, members)) => {
                    Cond::no(ROLLOUT_COMPLETE, reason, format!("{leader}; {members}"))
                }
                None => Cond::no(
                    ROLLOUT_COMPLETE,
                    "RolloutInProgress",
                    format!("{leader}; {} member Pods to replace", stale.len()),
                ),
            }
        }
        None if managed(b) => Cond::unknown(
            ROLLOUT_COMPLETE,
            "NotCreated",
            "the leader Deployment does not exist yet",
        ),
        None => Cond::yes(
            ROLLOUT_COMPLETE,
            "External",
            "an external store has nothing to roll out",
        ),
    }
}

/// `Rendered`, written only when the backend's objects could not be rendered this pass.
pub(super) fn rendered(obs: &Observation) -> Option<Cond> {
    let (reason, why) = obs.render_refused.as_ref()?;
    Some(Cond::no(RENDERED, reason, why.clone()))
}

/// `SettingsRead`, written only while the cluster settings cannot be read: it names the key
/// and says what the operator renders with meanwhile.
pub(super) fn settings_read(obs: &Observation) -> Option<Cond> {
    let (why, kept) = obs.settings_refused.as_ref()?;
    let meanwhile = if *kept {
        "the last good settings are kept until it is fixed"
    } else {
        "no settings were read since the operator started, so this backend's objects are left as they are until it is fixed"
    };
    Some(Cond::no(
        SETTINGS_READ,
        "SettingsUnreadable",
        format!("{why}; {meanwhile}"),
    ))
}

/// The phase and why it is not `Ready` (docs/design.md#backend-phase): a render refusal is an
/// `Error` whatever else was seen; then deletion, a leader not serving (`Provisioning` while a
/// managed leader has no ready replica), and `problem` (members short, a tier unregistered)
/// `Degraded`.
pub(super) fn phase(
    b: &KVCacheBackend,
    obs: &Observation,
    serving: bool,
    conditions: &[Cond],
    problem: Option<String>,
) -> (BackendPhase, Option<String>) {
    if let Some((_, why)) = &obs.render_refused {
        (BackendPhase::Error, Some(why.clone()))
    } else if obs.deleting {
        let why = if obs.used_by.is_empty() {
            "tearing down the leader and member workloads".to_owned()
        } else {
            format!("deletion waits for {}", listed(&obs.used_by))
        };
        (BackendPhase::Deleting, Some(why))
    } else if no_ready_leader(b, obs) && !serving {
        (
            BackendPhase::Provisioning,
            Some(format!(
                "the leader Deployment of {} has no ready replica yet",
                name(b)
            )),
        )
    } else if !serving {
        let why = conditions
            .iter()
            .find(|c| c.type_ == LEADER_AVAILABLE)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        (
            BackendPhase::Error,
            Some(format!("the leader is not available: {why}")),
        )
    } else if let Some(why) = problem {
        (BackendPhase::Degraded, Some(why))
    } else {
        (BackendPhase::Ready, None)
    }
}
