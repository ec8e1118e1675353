//! Which events a backend's status transition records (`kubectl describe kvcachebackend`):
//! decided from the status before and after a pass; the operator publishes them.

use kvcache_api::backend::{BackendPhase, KVCacheBackendStatus};
use kvcache_api::condition::Status;

use kvcache_api::backend::conditions;

pub use crate::note::{Kind, Note};

fn condition<'a>(s: &'a KVCacheBackendStatus, t: &str) -> Option<(&'a str, &'a str)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// The events for the transitions a user wants to see: a new generation rendered, a phase
/// change, capacity observed or changed, and a member missing, a rollout held, a deletion held
/// or the settings unreadable (each once, when the condition turns False or its reason
/// changes), and an `UnknownSegment` warning for each segment of no member Pod once it is
/// confirmed (once per segment, not every pass).
pub fn backend_events(before: &KVCacheBackendStatus, after: &KVCacheBackendStatus) -> Vec<Note> {
    let mut out = Vec::new();
    for u in after.unknown_segments.iter().filter(|u| u.confirmed) {
        let known = before
            .unknown_segments
            .iter()
            .any(|b| b.confirmed && b.segment_name == u.segment_name);
        if !known {
            out.push(Note {
                kind: Kind::Warning,
                reason: "UnknownSegment",
                message: format!(
                    "segment {} is mounted on this backend's master by no member Pod of it: the store places any tenant's blocks in its memory (condition UnknownSegments says what the operator does)",
                    crate::status::backend::describe_unknown(u)
                ),
            });
        }
    }
    if before.observed_generation != after.observed_generation {
        out.push(Note {
            kind: Kind::Normal,
            reason: "Rendered",
            message: format!(
                "applied the leader, its Service and the member DaemonSets for generation {}",
                after.observed_generation.unwrap_or_default()
            ),
        });
    }
    if before.phase != after.phase
        && let Some(phase) = after.phase
    {
        let (kind, reason) = match phase {
            BackendPhase::Ready => (Kind::Normal, "BackendReady"),
            BackendPhase::Provisioning => (Kind::Normal, "Provisioning"),
            BackendPhase::Degraded => (Kind::Warning, "BackendDegraded"),
            BackendPhase::Error => (Kind::Warning, "LeaderLost"),
            BackendPhase::Deleting => (Kind::Normal, "Deleting"),
        };
        out.push(Note {
            kind,
            reason,
            message: after
                .phase_message
                .clone()
                .unwrap_or_else(|| "the leader serves and every member is mounted".into()),
        });
    }
    if before.capacity != after.capacity {
        let show = |s: &KVCacheBackendStatus| {
            s.capacity
                .as_ref()
                .map_or("absent".to_owned(), |c| c.total.as_str().to_owned())
        };
        out.push(Note {
            kind: Kind::Normal,
            reason: if before.capacity.is_none() {
                "CapacityObserved"
            } else {
                "CapacityChanged"
            },
            message: format!("capacity {} -> {}", show(before), show(after)),
        });
    }
    out.extend(condition_events(before, after));
    out.extend(drained_event(before, after));
    out
}

/// `Drained` turning `True` (`MembersDrained`: each member on a leaving node drained, what
/// moved) or to `NotDrained` (`MemberNotDrained`, a warning: what one holds goes with its node),
/// once per transition.
fn drained_event(before: &KVCacheBackendStatus, after: &KVCacheBackendStatus) -> Option<Note> {
    let now = condition(after, conditions::DRAINED)?;
    if condition(before, conditions::DRAINED) == Some(now) {
        return None;
    }
    let (kind, reason) = match now {
        (s, _) if s == Status::True.as_str() => (Kind::Normal, "MembersDrained"),
        (_, "NotDrained") => (Kind::Warning, "MemberNotDrained"),
        _ => return None,
    };
    let message = after
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::DRAINED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    Some(Note {
        kind,
        reason,
        message,
    })
}

/// A backend's conditions that turned False, each with the message it shows.
fn condition_events(before: &KVCacheBackendStatus, after: &KVCacheBackendStatus) -> Vec<Note> {
    let mut out = Vec::new();
    for (t, reason, kind) in [
        (conditions::MEMBERS_MOUNTED, "MemberMissing", Kind::Warning),
        (conditions::ROLLOUT_COMPLETE, "RolloutHeld", Kind::Normal),
        (conditions::DELETABLE, "DeletionHeld", Kind::Normal),
        (
            conditions::SETTINGS_READ,
            "SettingsUnreadable",
            Kind::Warning,
        ),
        // Its own reason: HostNetworkMembers or NotEnforced.
        (conditions::NETWORK_ISOLATED, "", Kind::Warning),
    ] {
        let was = condition(before, t);
        let now = condition(after, t);
        if let Some((s, own)) = now
            && s == Status::False.as_str()
            && was != now
        {
            let reason = match (reason, own) {
                ("", "NotEnforced") => "NotEnforced",
                ("", _) => "HostNetworkMembers",
                (r, _) => r,
            };
            let message = after
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| c.message.clone())
                .unwrap_or_default();
            out.push(Note {
                kind,
                reason,
                message,
            });
        }
    }
    out
}

/// The events of a ModelDeployment's shared cache: `LoadsFallingBack` (a warning) when
/// `SharedCacheHealthy` turns False, `LoadsRecovered` when it turns True again. Each once, on
/// the transition.
pub(crate) fn model_events(
    before: &kvcache_api::model::ModelDeploymentStatus,
    after: &kvcache_api::model::ModelDeploymentStatus,
) -> Vec<Note> {
    use kvcache_api::model::conditions::SHARED_CACHE_HEALTHY;
    let find = |s: &kvcache_api::model::ModelDeploymentStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == SHARED_CACHE_HEALTHY)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let (was, now) = (find(before), find(after));
    let false_ = Status::False.as_str();
    let true_ = Status::True.as_str();
    match (&was, &now) {
        (w, Some((s, message))) if s == false_ && w.as_ref().is_none_or(|(ws, _)| ws != false_) => {
            vec![Note {
                kind: Kind::Warning,
                reason: "LoadsFallingBack",
                message: message.clone(),
            }]
        }
        (Some((ws, _)), Some((s, message))) if ws == false_ && s == true_ => vec![Note {
            kind: Kind::Normal,
            reason: "LoadsRecovered",
            message: message.clone(),
        }],
        _ => Vec::new(),
    }
}

/// The events of a Binding: `TenantAtGrant` (a warning) when `QuotaPressure` turns True,
/// `TenantBelowGrant` when it turns False again. Each once, on the transition.
pub fn binding_events(
    before: &kvcache_api::pool::KVCachePoolBindingStatus,
    after: &kvcache_api::pool::KVCachePoolBindingStatus,
) -> Vec<Note> {
    use kvcache_api::pool::binding_conditions::QUOTA_PRESSURE;
    let find = |s: &kvcache_api::pool::KVCachePoolBindingStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == QUOTA_PRESSURE)
            .map(|c| (c.status == Status::True.as_str(), c.message.clone()))
    };
    match (find(before), find(after)) {
        (was, Some((true, message))) if !was.as_ref().is_some_and(|(w, _)| *w) => vec![Note {
            kind: Kind::Warning,
            reason: "TenantAtGrant",
            message,
        }],
        (Some((true, _)), Some((false, message))) => vec![Note {
            kind: Kind::Normal,
            reason: "TenantBelowGrant",
            message,
        }],
        _ => Vec::new(),
    }
}

/// A warning on a ModelDeployment naming each rendered object it left alone, because an object
/// of that name is not its own (`crate::plan::model::leave_foreign`); none when it left none.
pub(crate) fn name_taken(foreign: &[crate::status::model::ForeignObject]) -> Option<Note> {
    (!foreign.is_empty()).then(|| Note {
        kind: Kind::Warning,
        reason: "NameTaken",
        message: foreign
            .iter()
            .map(|f| {
                format!(
                    "{} {} exists and is not this deployment's: left as it is",
                    f.kind, f.name
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// A warning on a backend: the master drains `segment`, which no member Pod of the backend
/// mounted, onto its members (drain job `job`).
pub fn unknown_segment_draining(segment: &str, job: &str) -> Note {
    Note {
        kind: Kind::Warning,
        reason: "UnknownSegmentDraining",
        message: format!(
            "segment {segment}, mounted by no member Pod of this backend, is being drained onto its members (drain job {job}) so that no new block lands there"
        ),
    }
}

/// A warning on a backend: member Pod `pod` (at `ip`) of backend `backend` was mounted on this
/// backend's master and was deleted to mount on its own.
pub fn foreign_member_restarted(pod: &str, backend: &str, ip: &str) -> Note {
    Note {
        kind: Kind::Warning,
        reason: "ForeignMemberRestarted",
        message: format!(
            "member Pod {pod} of backend {backend} ({ip}) was mounted on this backend's master; it was deleted to mount on its own"
        ),
    }
}

/// On a backend: its serving leader Pod was deleted so that a standby takes over before the
/// Pod's node goes (warm: the next master replays the keys; else it starts empty).
pub fn leader_handed_over(h: &crate::members::maintenance::Handover) -> Note {
    let warm = h.warm;
    let cache = if warm {
        "the next master replays the keys from the backend's etcd"
    } else {
        "the next master starts with an empty cache (electionBackend: Etcd keeps it)"
    };
    Note {
        kind: if warm { Kind::Normal } else { Kind::Warning },
        reason: "LeaderHandedOver",
        message: format!(
            "the serving leader Pod {} on node {} ({}) was deleted so that a standby ({}) takes over before the node goes: {cache}",
            h.pod, h.node, h.leaving, h.standby
        ),
    }
}

/// A warning on a workload a backend's teardown abandoned: `kind name` did not go within its
/// Pods' termination grace plus `slack`.
pub fn teardown_abandoned(
    kind: &str,
    name: &str,
    grace: std::time::Duration,
    slack: std::time::Duration,
) -> Note {
    Note {
        kind: Kind::Warning,
        reason: "TeardownAbandoned",
        message: format!(
            "{kind} {name} did not go within its Pods' termination grace ({}s) plus {}s; the backend is released anyway and its Pods are left to the garbage collector",
            grace.as_secs(),
            slack.as_secs()
        ),
    }
}

/// On a Binding being deleted: its tenant was revoked on the master.
pub fn tenant_revoked(tenant: &str) -> Note {
    Note {
        kind: Kind::Normal,
        reason: "TenantRevoked",
        message: format!(
            "tenant {tenant} revoked on the master with the Binding's deletion: its quota cut to {} byte, so its puts are refused on every connection, open ones included; its objects are removed next",
            kvcache_quota::release::REVOKED_QUOTA_BYTES
        ),
    }
}

/// On a Binding being deleted: its tenant's `count` objects were removed from the store.
pub fn cached_data_dropped(tenant: &str, count: u64) -> Note {
    Note {
        kind: Kind::Normal,
        reason: "CachedDataDropped",
        message: format!(
            "removed {count} objects of tenant {tenant} from the store with the Binding's deletion: no connection, open or new, reads them any more"
        ),
    }
}

/// On a pool: the tenant it registered on `backend`, claimed by no Binding and holding
/// nothing, was removed from the ledger.
pub fn unclaimed_tenant_removed(backend: &str, tenant: &str) -> Note {
    Note {
        kind: Kind::Normal,
        reason: "UnclaimedTenantRemoved",
        message: format!(
            "removed tenant {tenant} from the ledger of KVCacheBackend {backend}: this pool registered it, no Binding claims it any more (its Binding went while no operator released it) and it held nothing, but its ceiling still took a share of the capacity"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_says_whether_the_next_master_keeps_the_keys() {
        let mut h = crate::members::maintenance::Handover {
            pod: "l-a".into(),
            node: "n0".into(),
            leaving: crate::members::maintenance::Leaving::Cordoned,
            standby: "l-b".into(),
            warm: true,
        };
        let warm = leader_handed_over(&h);
        assert_eq!((warm.kind, warm.reason), (Kind::Normal, "LeaderHandedOver"));
        assert_eq!(
            warm.message,
            "the serving leader Pod l-a on node n0 (cordoned) was deleted so that a standby (l-b) takes over before the node goes: the next master replays the keys from the backend's etcd"
        );
        h.warm = false;
        let cold = leader_handed_over(&h);
        assert_eq!(cold.kind, Kind::Warning);
        assert!(
            cold.message
                .ends_with("starts with an empty cache (electionBackend: Etcd keeps it)")
        );
    }

    fn binding_status(pressure: Option<&str>) -> kvcache_api::pool::KVCachePoolBindingStatus {
        serde_json::from_value(serde_json::json!({
            "conditions": pressure.map(|s| vec![serde_json::json!({
                "type": "QuotaPressure", "status": s, "reason": "R", "message": format!("m {s}"),
                "lastTransitionTime": "2026-12-04T00:00:00Z"
            })]).unwrap_or_default()
        }))
        .expect("a status")
    }

    #[test]
    fn a_tenant_reaching_its_grant_is_warned_once_and_its_relief_noted() {
        let reasons = |b: Option<&str>, a: Option<&str>| -> Vec<&'static str> {
            binding_events(&binding_status(b), &binding_status(a))
                .iter()
                .map(|n| n.reason)
                .collect()
        };
        assert_eq!(reasons(Some("False"), Some("True")), ["TenantAtGrant"]);
        assert_eq!(reasons(None, Some("True")), ["TenantAtGrant"]);
        assert!(reasons(Some("True"), Some("True")).is_empty(), "once");
        assert_eq!(reasons(Some("True"), Some("False")), ["TenantBelowGrant"]);
        assert!(reasons(None, Some("False")).is_empty());
    }

    fn model_status(healthy: Option<&str>) -> kvcache_api::model::ModelDeploymentStatus {
        serde_json::from_value(serde_json::json!({
            "conditions": healthy.map(|s| vec![serde_json::json!({
                "type": "SharedCacheHealthy", "status": s, "reason": "R", "message": format!("m {s}"),
                "lastTransitionTime": "2026-12-04T00:00:00Z"
            })]).unwrap_or_default()
        }))
        .expect("a status")
    }

    #[test]
    fn a_deployment_falling_back_is_warned_once_and_its_recovery_noted() {
        let reasons = |b: Option<&str>, a: Option<&str>| -> Vec<&'static str> {
            model_events(&model_status(b), &model_status(a))
                .iter()
                .map(|n| n.reason)
                .collect()
        };
        assert_eq!(reasons(Some("True"), Some("False")), ["LoadsFallingBack"]);
        assert_eq!(reasons(None, Some("False")), ["LoadsFallingBack"]);
        assert!(reasons(Some("False"), Some("False")).is_empty(), "once");
        assert_eq!(reasons(Some("False"), Some("True")), ["LoadsRecovered"]);
        assert!(reasons(Some("Unknown"), Some("True")).is_empty());
        assert!(reasons(Some("True"), Some("True")).is_empty());
    }

    fn status(v: serde_json::Value) -> KVCacheBackendStatus {
        serde_json::from_value(v).expect("a status")
    }

    #[test]
    fn a_first_ready_pass_records_rendered_ready_and_capacity() {
        let after = status(serde_json::json!({
            "observedGeneration": 1, "phase": "Ready",
            "capacity": {"total": "1Gi"}
        }));
        let reasons: Vec<_> = backend_events(&Default::default(), &after)
            .into_iter()
            .map(|n| n.reason)
            .collect();
        assert_eq!(reasons, ["Rendered", "BackendReady", "CapacityObserved"]);
    }

    #[test]
    fn unreadable_settings_warn_once_with_the_conditions_message() {
        let refused = status(serde_json::json!({
            "conditions": [{"type": conditions::SETTINGS_READ, "status": "False", "reason": "SettingsUnreadable",
                            "message": "gpustack-settings: kv-cache-elector-image: \"\" is blank",
                            "lastTransitionTime": "2026-12-01T00:00:00Z"}]
        }));
        assert_eq!(
            backend_events(&Default::default(), &refused),
            [Note {
                kind: Kind::Warning,
                reason: "SettingsUnreadable",
                message: "gpustack-settings: kv-cache-elector-image: \"\" is blank".into(),
            }]
        );
        assert!(backend_events(&refused, &refused).is_empty());
    }

    #[test]
    fn a_missing_member_warns_once_and_an_unchanged_status_records_nothing() {
        let missing = status(serde_json::json!({
            "phase": "Degraded", "phaseMessage": "member-0 on n1 is not mounted",
            "conditions": [{"type": conditions::MEMBERS_MOUNTED, "status": "False", "reason": "MemberNotMounted",
                            "message": "member-0 on n1 is not mounted", "lastTransitionTime": "2026-12-01T00:00:00Z"}]
        }));
        let notes = backend_events(&Default::default(), &missing);
        assert!(notes.contains(&Note {
            kind: Kind::Warning,
            reason: "MemberMissing",
            message: "member-0 on n1 is not mounted".into()
        }));
        assert!(
            notes
                .iter()
                .any(|n| n.reason == "BackendDegraded" && n.kind == Kind::Warning)
        );
        assert_eq!(backend_events(&missing, &missing), []);
    }

    #[test]
    fn an_unknown_segment_warns_once_when_confirmed_and_again_only_for_a_new_one() {
        let seen =
            |segments: serde_json::Value| status(serde_json::json!({"unknownSegments": segments}));
        let rogue = |name: &str, confirmed: bool| {
            serde_json::json!({"segmentName": name, "address": "10.0.2.9", "pod": "team-b/rogue",
                               "size": "32Mi", "state": "OK", "firstSeen": "2026-12-06T10:00:00Z",
                               "confirmed": confirmed})
        };
        let pending = seen(serde_json::json!([rogue("10.0.2.9:15003", false)]));
        let confirmed = seen(serde_json::json!([rogue("10.0.2.9:15003", true)]));
        assert!(
            backend_events(&Default::default(), &pending).is_empty(),
            "within its grace"
        );
        assert_eq!(
            backend_events(&pending, &confirmed),
            [Note {
                kind: Kind::Warning,
                reason: "UnknownSegment",
                message: "segment 10.0.2.9:15003 (32Mi at address 10.0.2.9, Pod team-b/rogue, state OK) is mounted on this backend's master by no member Pod of it: the store places any tenant's blocks in its memory (condition UnknownSegments says what the operator does)".into(),
            }]
        );
        assert!(
            backend_events(&confirmed, &confirmed).is_empty(),
            "not every pass"
        );
        let two = seen(serde_json::json!([
            rogue("10.0.2.9:15003", true),
            rogue("10.0.2.9:15004", true)
        ]));
        let notes = backend_events(&confirmed, &two);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].message.starts_with("segment 10.0.2.9:15004 "),
            "{notes:?}"
        );
    }

    #[test]
    fn a_probe_that_connected_warns_with_its_own_reason() {
        let isolated = |status: &str, reason: &str| {
            self::status(serde_json::json!({
                "conditions": [{"type": conditions::NETWORK_ISOLATED, "status": status, "reason": reason,
                                "message": "m", "lastTransitionTime": "2026-12-01T00:00:00Z"}]
            }))
        };
        let reasons = |b: &KVCacheBackendStatus, a: &KVCacheBackendStatus| -> Vec<&'static str> {
            backend_events(b, a).iter().map(|n| n.reason).collect()
        };
        let probing = isolated("Unknown", "Probing");
        assert_eq!(
            reasons(&probing, &isolated("False", "NotEnforced")),
            ["NotEnforced"]
        );
        assert_eq!(
            reasons(&probing, &isolated("False", "HostNetworkMembers")),
            ["HostNetworkMembers"]
        );
        assert!(reasons(&probing, &isolated("True", "Enforced")).is_empty());
        let not = isolated("False", "NotEnforced");
        assert!(reasons(&not, &not).is_empty(), "once");
    }

    #[test]
    fn a_name_taken_warning_names_every_object_left_alone_and_none_without_one() {
        use crate::status::model::ForeignObject;
        assert_eq!(super::name_taken(&[]), None);
        let note = super::name_taken(&[
            ForeignObject {
                kind: "Deployment",
                name: "m-r".into(),
                controller: None,
            },
            ForeignObject {
                kind: "Service",
                name: "m".into(),
                controller: Some("Deployment x".into()),
            },
        ])
        .expect("a warning");
        assert_eq!((note.kind, note.reason), (Kind::Warning, "NameTaken"));
        assert_eq!(
            note.message,
            "Deployment m-r exists and is not this deployment's: left as it is; Service m exists and is not this deployment's: left as it is"
        );
    }

    #[test]
    fn the_operators_action_events_name_what_they_acted_on() {
        let n = super::unknown_segment_draining("10.0.0.9:15000", "j-1");
        assert_eq!(
            (n.kind, n.reason),
            (Kind::Warning, "UnknownSegmentDraining")
        );
        assert!(
            n.message.starts_with("segment 10.0.0.9:15000,") && n.message.contains("drain job j-1")
        );
        let n = super::foreign_member_restarted("p", "other", "10.0.0.1");
        assert_eq!(n.reason, "ForeignMemberRestarted");
        assert!(
            n.message
                .starts_with("member Pod p of backend other (10.0.0.1)")
        );
        let n = super::teardown_abandoned(
            "Deployment",
            "b-leader",
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(120),
        );
        assert_eq!(n.reason, "TeardownAbandoned");
        assert!(n.message.starts_with(
            "Deployment b-leader did not go within its Pods' termination grace (30s) plus 120s;"
        ));
        let n = super::tenant_revoked("team-a");
        assert_eq!((n.kind, n.reason), (Kind::Normal, "TenantRevoked"));
        assert!(n.message.contains("quota cut to 1 byte"));
        let n = super::cached_data_dropped("team-a", 7);
        assert!(n.message.starts_with("removed 7 objects of tenant team-a"));
        let n = super::unclaimed_tenant_removed("b", "t");
        assert!(
            n.message
                .starts_with("removed tenant t from the ledger of KVCacheBackend b:")
        );
    }
}
