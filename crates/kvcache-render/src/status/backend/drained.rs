//! `Drained` (docs/design.md#node-maintenance): the members about to lose their node, each
//! drained through the master, draining, waiting its turn, or why it could not be, with what
//! moved. Absent while no member's node is leaving.

use kvcache_api::backend::conditions::DRAINED;
use kvcache_api::condition::Cond;
use kvcache_api::quantity::format_bytes;

use super::observation::Observation;
use crate::members::rollout::{Held, Moved, NoDrain, Step};
use crate::observe::read::MemberPod;

/// Where one leaving member stands.
enum Stand<'a> {
    Held(&'a Held),
    Draining(&'a Step),
    Waiting,
}

/// `Drained`: `True` once every member on a leaving node is drained (or held nothing),
/// `False`/`Draining` while one drains or waits its turn, `False`/`NotDrained` when one could
/// not be drained (what it holds goes with its node). `None` while no member's node leaves.
pub(super) fn drained(obs: &Observation) -> Option<Cond> {
    let leaving: Vec<&MemberPod> = obs
        .members
        .iter()
        .filter(|m| m.leaving.is_some() && !m.terminating)
        .collect();
    if leaving.is_empty() {
        return None;
    }
    let mut clauses = Vec::new();
    let (mut lost, mut pending) = (false, false);
    for m in &leaving {
        let stand = stand_of(obs, m);
        match &stand {
            Stand::Held(h) => {
                lost |= matches!(&h.drained, Err(why) if !matches!(why, NoDrain::NotMounted));
            }
            Stand::Draining(_) | Stand::Waiting => pending = true,
        }
        clauses.push(clause(m, &stand));
    }
    let message = clauses.join("; ");
    Some(if lost {
        Cond::no(DRAINED, "NotDrained", message)
    } else if pending {
        Cond::no(DRAINED, "Draining", message)
    } else {
        Cond::yes(DRAINED, "MembersDrained", message)
    })
}

fn stand_of<'a>(obs: &'a Observation, m: &MemberPod) -> Stand<'a> {
    for g in obs.rollout.iter().filter(|g| g.group == m.group) {
        if let Some(h) = g.held.iter().find(|h| h.pod == m.name) {
            return Stand::Held(h);
        }
        let drains_it = matches!(&g.step,
            Step::StartDrain { pod, .. } | Step::AwaitDrain { pod, .. } if *pod == m.name);
        if g.maintenance.is_some() && drains_it {
            return Stand::Draining(&g.step);
        }
    }
    Stand::Waiting
}

fn moved(m: &Moved) -> String {
    match (m.objects, m.bytes) {
        (Some(o), Some(b)) => format!("{o} objects ({}) moved", format_bytes(b)),
        (Some(o), None) => format!("{o} objects moved"),
        (None, Some(b)) => format!("{} moved", format_bytes(b)),
        (None, None) => "its segment reads DRAINED".to_owned(),
    }
}

fn clause(m: &MemberPod, stand: &Stand<'_>) -> String {
    let why = m
        .leaving
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let who = format!("member Pod {} on node {} ({why})", m.name, m.node);
    match stand {
        Stand::Held(Held {
            drained: Ok(done), ..
        }) => format!("{who}: drained, {} to the other members", moved(done)),
        Stand::Held(Held {
            drained: Err(NoDrain::NotMounted),
            ..
        }) => format!("{who}: holds nothing the master knows"),
        Stand::Held(Held {
            drained: Err(why), ..
        }) => format!("{who}: not drained, so what it holds goes with the node: {why}"),
        Stand::Draining(Step::AwaitDrain {
            job,
            progress: Some(p),
            ..
        }) => format!(
            "{who}: draining (job {}), {} objects ({}) moved so far",
            job.as_deref().unwrap_or("unknown"),
            p.objects,
            format_bytes(p.moved)
        ),
        Stand::Draining(Step::StartDrain { bytes, .. }) => format!(
            "{who}: draining {} to the other members",
            format_bytes(*bytes)
        ),
        Stand::Draining(_) => format!("{who}: draining"),
        Stand::Waiting => format!("{who}: waits for another member of its group to drain first"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::maintenance::Leaving;
    use crate::members::rollout::{GroupStep, Progress};
    use kvcache_api::condition::Status;

    fn member(name: &str, leaving: Option<Leaving>) -> MemberPod {
        MemberPod {
            name: name.into(),
            node: format!("node-{name}"),
            leaving,
            ..Default::default()
        }
    }

    fn held(name: &str, drained: Result<Moved, NoDrain>) -> Held {
        Held {
            pod: name.into(),
            node: format!("node-{name}"),
            leaving: Leaving::Cordoned,
            drained,
        }
    }

    fn observed(members: Vec<MemberPod>, step: Step, held: Vec<Held>, drains: bool) -> Observation {
        let mut obs = Observation::empty(None);
        obs.members = members;
        obs.rollout = vec![GroupStep {
            group: 0,
            to_replace: 0,
            step,
            maintenance: drains.then_some(Leaving::Cordoned),
            held,
        }];
        obs
    }

    #[test]
    fn no_member_on_a_leaving_node_means_no_condition() {
        let obs = observed(vec![member("a", None)], Step::UpToDate, Vec::new(), false);
        assert_eq!(drained(&obs), None);
    }

    #[test]
    fn the_condition_names_each_member_its_node_and_what_moved() {
        let moved = Moved {
            objects: Some(160),
            bytes: Some(12 << 20),
        };
        let obs = observed(
            vec![member("a", Some(Leaving::Cordoned)), member("b", None)],
            Step::UpToDate,
            vec![held("a", Ok(moved))],
            false,
        );
        let c = drained(&obs).expect("a condition");
        assert_eq!((c.status, c.reason), (Status::True, "MembersDrained"));
        assert_eq!(
            c.message,
            "member Pod a on node node-a (cordoned): drained, 160 objects (12Mi) moved to the other members"
        );
    }

    #[test]
    fn a_drain_under_way_or_a_member_waiting_its_turn_is_draining() {
        let obs = observed(
            vec![
                member("a", Some(Leaving::Cordoned)),
                member("b", Some(Leaving::ScaleDown)),
            ],
            Step::AwaitDrain {
                pod: "a".into(),
                node: "node-a".into(),
                job: Some("7-9".into()),
                progress: Some(Progress {
                    moved: 1 << 20,
                    objects: 4,
                    blocked: 0,
                }),
            },
            Vec::new(),
            true,
        );
        let c = drained(&obs).expect("a condition");
        assert_eq!((c.status, c.reason), (Status::False, "Draining"));
        assert_eq!(
            c.message,
            "member Pod a on node node-a (cordoned): draining (job 7-9), 4 objects (1Mi) moved so far; \
             member Pod b on node node-b (marked for deletion by the cluster autoscaler): waits for another member of its group to drain first"
        );
    }

    #[test]
    fn a_member_that_could_not_be_drained_says_what_is_lost_and_one_holding_nothing_does_not() {
        let obs = observed(
            vec![
                member("a", Some(Leaving::GroupNarrowed)),
                member("b", Some(Leaving::Cordoned)),
            ],
            Step::UpToDate,
            vec![
                held("a", Err(NoDrain::DiskTier)),
                held("b", Err(NoDrain::NotMounted)),
            ],
            false,
        );
        let c = drained(&obs).expect("a condition");
        assert_eq!((c.status, c.reason), (Status::False, "NotDrained"));
        assert!(
            c.message.starts_with(
                "member Pod a on node node-a (no longer selected by its member group): not drained, so what it holds goes with the node: the group has a disk tier"
            ),
            "{}",
            c.message
        );
        assert!(
            c.message.ends_with(
                "member Pod b on node node-b (cordoned): holds nothing the master knows"
            )
        );
        let only_nothing = observed(
            vec![member("b", Some(Leaving::Cordoned))],
            Step::UpToDate,
            vec![held("b", Err(NoDrain::NotMounted))],
            false,
        );
        assert_eq!(drained(&only_nothing).map(|c| c.status), Some(Status::True));
    }
}
