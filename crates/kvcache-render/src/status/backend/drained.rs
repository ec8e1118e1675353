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
