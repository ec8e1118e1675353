//! The rollout in words: a group's step as `RolloutComplete` names it, and the event a step
//! records when the operator carries it out.

use kvcache_api::quantity::format_bytes;

use super::step::{Drain, GroupStep, Next, Progress, Step, Until};
use crate::note::{Kind, Note};

fn member(pod: &str, node: &str) -> String {
    if node.is_empty() {
        format!("member Pod {pod} (not scheduled)")
    } else {
        format!("member Pod {pod} (node {node})")
    }
}

fn progress_text(p: &Progress) -> String {
    let mut s = format!("{} objects, {} moved", p.objects, format_bytes(p.moved));
    if p.blocked > 0 {
        s.push_str(&format!(
            ", {} waiting (read within their lease, or no room yet)",
            p.blocked
        ));
    }
    s
}

impl GroupStep {
    /// One clause for `RolloutComplete`'s message (`None` when the group is up to date).
    pub fn describe(&self) -> Option<String> {
        let g = self.group;
        let now = match &self.step {
            Step::UpToDate => return None,
            Step::Wait { until, next } => {
                let waiting = match until {
                    Until::Gone { pod, node } => format!("waiting for {} to go", member(pod, node)),
                    Until::Created { present, desired } => format!(
                        "waiting for the DaemonSet to create a member Pod ({present} of {desired} exist)"
                    ),
                    Until::Ready { pod, node } => {
                        format!("waiting for {} to be Ready", member(pod, node))
                    }
                    Until::Leader => "waiting for the leader's rollout to settle and a master to serve (the next master brings the keys back; a member replaced meanwhile could not be drained)".to_owned(),
                    Until::Mounted { pod, node } => {
                        format!("waiting for {} to mount its segment", member(pod, node))
                    }
                };
                match next {
                    Some(Next {
                        pod,
                        node,
                        drained: Ok(()),
                    }) => format!("{waiting}; next {}, drained first", member(pod, node)),
                    Some(Next {
                        pod,
                        node,
                        drained: Err(why),
                    }) => format!(
                        "{waiting}; next {}, without a drain: {why}",
                        member(pod, node)
                    ),
                    None => waiting,
                }
            }
            Step::StartDrain {
                pod,
                node,
                segment,
                bytes,
                ..
            } => format!(
                "draining {}: its segment {segment} ({}) goes to the other members before {}",
                member(pod, node),
                format_bytes(*bytes),
                self.after()
            ),
            Step::AwaitDrain {
                pod,
                node,
                job,
                progress,
            } => {
                let mut s = format!("draining {}", member(pod, node));
                if let Some(job) = job {
                    s.push_str(&format!(", job {job}"));
                }
                if let Some(p) = progress {
                    s.push_str(&format!(": {}", progress_text(p)));
                }
                s
            }
            Step::Replace {
                pod,
                node,
                drain: Drain::Drained { .. },
            } => format!(
                "{} replaced after its segment was drained",
                member(pod, node)
            ),
            Step::Replace {
                pod,
                node,
                drain: Drain::Skipped { why, .. },
            } => format!("{} replaced without a drain: {why}", member(pod, node)),
        };
        Some(format!(
            "member group {g}: {now} ({} member Pods to replace)",
            self.to_replace
        ))
    }

    /// What the drain of this step comes before: the Pod's replacement, or its node going.
    fn after(&self) -> String {
        match &self.maintenance {
            Some(why) => format!("its node goes ({why})"),
            None => "the Pod is replaced".to_owned(),
        }
    }

    /// Whether this step replaces a member without a drain, now or next.
    fn without_drain(&self) -> bool {
        matches!(
            &self.step,
            Step::Replace {
                drain: Drain::Skipped { .. },
                ..
            } | Step::Wait {
                next: Some(Next {
                    drained: Err(_),
                    ..
                }),
                ..
            }
        )
    }
}

/// `RolloutComplete`'s reason and member clauses while member groups roll (`None`: every group
/// up to date): `MembersRolledWithoutDrain` when a member is, or is next, replaced without a
/// drain; otherwise `MembersDraining`.
pub(crate) fn member_progress(steps: &[GroupStep]) -> Option<(&'static str, String)> {
    let clauses: Vec<String> = steps.iter().filter_map(GroupStep::describe).collect();
    if clauses.is_empty() {
        return None;
    }
    let reason = if steps.iter().any(GroupStep::without_drain) {
        "MembersRolledWithoutDrain"
    } else {
        "MembersDraining"
    };
    Some((reason, clauses.join("; ")))
}

/// The event a step records when the operator carries it out: a drain started
/// (`MemberDraining`, with the master's job id), a member replaced after its drain
/// (`MemberDrained`) or without one (`MemberRolledWithoutDrain`, a warning: what it held is
/// lost).
pub fn step_event(step: &GroupStep, job: Option<&str>) -> Option<Note> {
    let g = step.group;
    match &step.step {
        Step::StartDrain {
            pod,
            node,
            segment,
            targets,
            bytes,
        } => Some(Note {
            kind: Kind::Normal,
            reason: "MemberDraining",
            message: format!(
                "draining the segment {segment} of {} in group {g} ({}) onto {} other member segments before {} (job {})",
                member(pod, node),
                format_bytes(*bytes),
                targets.len(),
                match &step.maintenance {
                    Some(_) => step.after(),
                    None => "replacing it".to_owned(),
                },
                job.unwrap_or("not answered")
            ),
        }),
        Step::Replace {
            pod,
            node,
            drain: Drain::Drained { job, moved },
        } => {
            let how = match (job, moved) {
                (Some(j), Some(m)) => format!(" (job {j}, {} moved)", format_bytes(*m)),
                (Some(j), None) => format!(" (job {j})"),
                _ => " (the master reports it DRAINED)".to_owned(),
            };
            Some(Note {
                kind: Kind::Normal,
                reason: "MemberDrained",
                message: format!(
                    "replacing {} of group {g}: its segment was drained to the other members{how}",
                    member(pod, node)
                ),
            })
        }
        Step::Replace {
            pod,
            node,
            drain: Drain::Skipped { why, .. },
        } => Some(Note {
            kind: Kind::Warning,
            reason: "MemberRolledWithoutDrain",
            message: format!(
                "replacing {} of group {g} without a drain, so the cache it held is lost: {why}",
                member(pod, node)
            ),
        }),
        _ => None,
    }
}
