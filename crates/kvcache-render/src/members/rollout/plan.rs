//! The member rollout decided (docs/design.md#member-rollout): which member Pods run an earlier
//! template, and each group's next step, one member at a time, drained first where the master
//! can.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::step::{Drain, GroupStep, Held, Moved, Next, NoDrain, Progress, Step, Until};
use crate::members::maintenance::Leaving;
use crate::observe::read::MemberPod;
use crate::observe::store::{DrainJob, JobStatus, ReadError, Segment, SegmentStatus, StoreReading};

/// Member Pods whose template fingerprint differs from the rendered one: the rollout deletes
/// exactly these (DaemonSets are `OnDelete`). Pods already terminating are left alone.
pub fn stale_member_pods<'a>(pods: &'a [MemberPod], rendered: &[String]) -> Vec<&'a str> {
    pods.iter()
        .filter(|p| !p.terminating)
        .filter(|p| rendered.get(p.group).is_some_and(|h| *h != p.hash))
        .map(|p| p.name.as_str())
        .collect()
}

/// What the member rollout sees of one member group besides its Pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupFacts {
    /// The group declares a disk tier: the master leaves tier keys out of a drain.
    pub tier: bool,
    /// On how many nodes its DaemonSet runs a Pod (`status.desiredNumberScheduled`; `None`:
    /// not reported yet).
    pub desired: Option<i32>,
}

/// Everything one pass of the member rollout decides from.
#[derive(Clone, Copy, Debug)]
pub struct RolloutInput<'a> {
    /// Every member Pod of the backend, of every group, terminating ones included.
    pub members: &'a [MemberPod],
    /// The rendered template fingerprint of each group, by index.
    pub rendered: &'a [String],
    /// Each group's facts, by index (a missing entry: no tier, count unknown).
    pub groups: &'a [GroupFacts],
    /// The master's answers this pass (`None`: not read).
    pub store: Option<&'a StoreReading>,
    /// The master's answer about each drain job recorded on a member Pod, by job id.
    pub jobs: &'a BTreeMap<String, Result<DrainJob, ReadError>>,
    /// The master's refusals of drains asked this pass, by Pod name.
    pub refused: &'a BTreeMap<String, ReadError>,
    /// The time of this pass.
    pub now: Timestamp,
    /// How long a drain may take before its member is replaced without it.
    pub deadline: Duration,
    /// A warm backend's leader is rolling, or no master serves: the next master brings the keys
    /// back (`electionBackend: Etcd`), so no member is drained or replaced meanwhile (a member
    /// replaced then could not be drained, and what it held would be lost for good).
    pub leader_unsettled: bool,
}

/// The next step of every member group's rollout (docs/design.md#member-rollout). One member at
/// a time per group: while a member Pod of the group is going, missing, or on the current
/// template but not Ready and mounted, nothing else is touched. The next member (one whose
/// drain is recorded first, then one not Ready, then by name) is drained first where its segment
/// can be told apart and the other members have room; otherwise, or past the deadline, it is
/// replaced without a drain, saying why.
pub fn member_rollout(input: &RolloutInput<'_>) -> Vec<GroupStep> {
    // Segments leaving (a drain recorded, or started this pass) take nothing.
    let mut leaving: BTreeSet<String> = input
        .members
        .iter()
        .filter(|p| p.drain.is_some() && !p.ip.is_empty())
        .map(|p| p.ip.clone())
        .collect();
    input
        .rendered
        .iter()
        .enumerate()
        .map(|(group, rendered)| group_step(input, group, rendered, &mut leaving))
        .collect()
}

fn group_step(
    input: &RolloutInput<'_>,
    group: usize,
    rendered: &str,
    leaving: &mut BTreeSet<String>,
) -> GroupStep {
    let pods: Vec<&MemberPod> = input.members.iter().filter(|p| p.group == group).collect();
    let facts = input.groups.get(group).copied().unwrap_or_default();
    let mut candidates: Vec<&MemberPod> = pods
        .iter()
        .copied()
        .filter(|p| !p.terminating && p.leaving.is_none())
        .filter(|p| p.hash != rendered || p.drain.is_some())
        .collect();
    // A drain under way first (re-entry), then a member that is not Ready, then by name.
    candidates.sort_by_key(|p| (p.drain.is_none(), p.ready, p.name.as_str()));
    let to_replace = candidates.len();
    let going = pods.iter().any(|p| !p.terminating && p.leaving.is_some());
    if input.leader_unsettled && (going || !candidates.is_empty()) {
        return GroupStep {
            group,
            to_replace,
            step: Step::Wait {
                until: Until::Leader,
                next: candidates.first().map(|p| Next {
                    pod: p.name.clone(),
                    node: p.node.clone(),
                    drained: Ok(()),
                }),
            },
            maintenance: None,
            held: Vec::new(),
        };
    }
    // Members about to lose their node first (docs/design.md#node-maintenance).
    let (maintenance, held) = maintenance_step(input, &pods, facts, leaving);
    let at = |step, why| GroupStep {
        group,
        to_replace,
        step,
        maintenance: why,
        held: held.clone(),
    };
    if let Some((step, why)) = maintenance {
        return at(step, Some(why));
    }
    let Some(next) = candidates.first() else {
        // Nothing left to replace, but the last replacement may still be under way: the
        // group's rollout is over once that Pod went and its successor exists.
        return match settling(&pods, facts) {
            Some(until) => at(Step::Wait { until, next: None }, None),
            None => at(Step::UpToDate, None),
        };
    };
    let step = candidate_step(input, next, facts, leaving);
    // A drain under way goes on whatever else the group waits for.
    if matches!(step, Step::AwaitDrain { .. }) {
        return at(step, None);
    }
    if let Some(until) = gate(input, &pods, rendered, facts) {
        // Room is judged when the member's turn comes: the replacement waited for brings some.
        let drained = match &step {
            Step::Replace {
                drain: Drain::Skipped { why, .. },
                ..
            } if !matches!(why, NoDrain::NoRoom { .. }) => Err(why.clone()),
            _ => Ok(()),
        };
        if let Step::StartDrain { .. } = step {
            // Not started after all: its segment still takes objects.
            leaving.remove(&next.ip);
        }
        return at(
            Step::Wait {
                until,
                next: Some(Next {
                    pod: next.name.clone(),
                    node: next.node.clone(),
                    drained,
                }),
            },
            None,
        );
    }
    at(step, None)
}

/// The group's members about to lose their node, a drain recorded first, then by name: the
/// first whose drain starts or runs is the group's step (one drain at a time, started whatever
/// else the group waits for: a drain takes no member down); those whose turn is over are held,
/// drained or why not. A held member is never replaced: its replacement would land on the node
/// that goes.
fn maintenance_step(
    input: &RolloutInput<'_>,
    pods: &[&MemberPod],
    facts: GroupFacts,
    leaving: &mut BTreeSet<String>,
) -> (Option<(Step, Leaving)>, Vec<Held>) {
    let mut going: Vec<(&MemberPod, &Leaving)> = pods
        .iter()
        .filter(|p| !p.terminating)
        .filter_map(|p| Some((*p, p.leaving.as_ref()?)))
        .collect();
    going.sort_by_key(|(p, _)| (p.drain.is_none(), p.name.as_str()));
    let mut held = Vec::new();
    for (p, why) in going {
        let drained = match candidate_step(input, p, facts, leaving) {
            step @ (Step::StartDrain { .. } | Step::AwaitDrain { .. }) => {
                return (Some((step, why.clone())), held);
            }
            Step::Replace {
                drain: Drain::Drained { job, moved },
                ..
            } => Ok(Moved {
                objects: job
                    .and_then(|j| input.jobs.get(&j)?.as_ref().ok().map(|j| j.succeeded_units)),
                bytes: moved,
            }),
            Step::Replace {
                drain: Drain::Skipped { why, .. },
                ..
            } => Err(why),
            // A member's own step is a drain or its end.
            Step::UpToDate | Step::Wait { .. } => continue,
        };
        held.push(Held {
            pod: p.name.clone(),
            node: p.node.clone(),
            leaving: why.clone(),
            drained,
        });
    }
    (None, held)
}

/// A replacement still under way in the group: a member Pod terminating, or fewer Pods than
/// the DaemonSet runs (`facts.desired`), its successor not created yet.
fn settling(pods: &[&MemberPod], facts: GroupFacts) -> Option<Until> {
    if let Some(p) = pods.iter().find(|p| p.terminating) {
        return Some(Until::Gone {
            pod: p.name.clone(),
            node: p.node.clone(),
        });
    }
    let desired = facts
        .desired
        .and_then(|d| usize::try_from(d).ok())
        .unwrap_or(0);
    (pods.len() < desired).then_some(Until::Created {
        present: pods.len(),
        desired,
    })
}

/// What one member at a time waits for before the next is touched, if anything.
fn gate(
    input: &RolloutInput<'_>,
    pods: &[&MemberPod],
    rendered: &str,
    facts: GroupFacts,
) -> Option<Until> {
    if let Some(until) = settling(pods, facts) {
        return Some(until);
    }
    let listing = serving_listing(input).ok();
    for p in pods
        .iter()
        .filter(|p| p.hash == rendered && p.drain.is_none())
    {
        if !p.ready {
            return Some(Until::Ready {
                pod: p.name.clone(),
                node: p.node.clone(),
            });
        }
        let mounted = listing.is_none_or(|segments| {
            segments.iter().any(|s| {
                s.host() == p.ip && matches!(s.status, SegmentStatus::Ok | SegmentStatus::Unknown)
            })
        });
        if !mounted {
            return Some(Until::Mounted {
                pod: p.name.clone(),
                node: p.node.clone(),
            });
        }
    }
    None
}

/// The segment listing of a serving leader, or why there is none.
fn serving_listing<'a>(input: &RolloutInput<'a>) -> Result<&'a [Segment], NoDrain> {
    let Some(reading) = input.store else {
        return Err(NoDrain::LeaderNotServing);
    };
    if !matches!(&reading.health, Ok(h) if h.service_ready) {
        return Err(NoDrain::LeaderNotServing);
    }
    reading
        .segments
        .as_deref()
        .map_err(|e| NoDrain::SegmentsUnlisted(e.clone()))
}

/// The Pod's own segment on the master, or why it cannot be told.
fn segment_of<'a>(input: &RolloutInput<'a>, p: &MemberPod) -> Result<&'a Segment, NoDrain> {
    let segments = serving_listing(input)?;
    if p.ip.is_empty() {
        return Err(NoDrain::NotMounted);
    }
    let with: Vec<String> = input
        .members
        .iter()
        .filter(|o| o.name != p.name && o.ip == p.ip)
        .map(|o| o.name.clone())
        .collect();
    let ambiguous = |with| NoDrain::AmbiguousSegment {
        address: p.ip.clone(),
        with,
    };
    if !with.is_empty() {
        return Err(ambiguous(with));
    }
    match segments
        .iter()
        .filter(|s| s.host() == p.ip)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => Err(NoDrain::NotMounted),
        [one] => Ok(one),
        _ => Err(ambiguous(Vec::new())),
    }
}

/// The segments a drain of `p` may fill: `OK`, of another member Pod that is not going, not
/// themselves leaving, not on a node that goes.
fn targets<'a>(
    input: &RolloutInput<'a>,
    p: &MemberPod,
    segments: &'a [Segment],
    leaving: &BTreeSet<String>,
) -> Vec<&'a Segment> {
    segments
        .iter()
        .filter(|s| s.status == SegmentStatus::Ok)
        .filter(|s| s.host() != p.ip && !leaving.contains(s.host()))
        .filter(|s| {
            input.members.iter().any(|o| {
                !o.terminating && o.leaving.is_none() && !o.ip.is_empty() && o.ip == s.host()
            })
        })
        .collect()
}

fn replace(p: &MemberPod, drain: Drain) -> Step {
    Step::Replace {
        pod: p.name.clone(),
        node: p.node.clone(),
        drain,
    }
}

fn skip(p: &MemberPod, why: NoDrain) -> Step {
    replace(p, Drain::Skipped { why, cancel: None })
}

/// The step for the member that goes next: its recorded drain followed, or a new one started.
fn candidate_step(
    input: &RolloutInput<'_>,
    p: &MemberPod,
    facts: GroupFacts,
    leaving: &mut BTreeSet<String>,
) -> Step {
    let segment = segment_of(input, p);
    let Some(record) = &p.drain else {
        return start(input, p, facts, segment, leaving);
    };
    let answer = record.job.as_ref().and_then(|j| input.jobs.get(j));
    let created = match answer {
        Some(Ok(job)) if job.created_at_ms_epoch > 0 => {
            Timestamp::from_millisecond(job.created_at_ms_epoch).ok()
        }
        _ => None,
    };
    let deadline = SignedDuration::try_from(input.deadline).unwrap_or(SignedDuration::MAX);
    // Unknown start: bounded by nothing, so the deadline has passed.
    let overdue = record
        .started
        .or(created)
        .is_none_or(|t| input.now.duration_since(t) >= deadline);
    let timed_out = |job: Option<&String>, cancel: Option<String>| {
        replace(
            p,
            Drain::Skipped {
                why: NoDrain::TimedOut {
                    job: job.cloned(),
                    seconds: input.deadline.as_secs(),
                },
                cancel,
            },
        )
    };
    let awaiting = |job: Option<&String>, progress| Step::AwaitDrain {
        pod: p.name.clone(),
        node: p.node.clone(),
        job: job.cloned(),
        progress,
    };
    if let Some(job) = &record.job {
        match answer {
            Some(Ok(j)) => {
                return match j.status {
                    JobStatus::Succeeded => replace(
                        p,
                        Drain::Drained {
                            job: Some(job.clone()),
                            moved: Some(j.migrated_bytes),
                        },
                    ),
                    JobStatus::Failed | JobStatus::Canceled => skip(
                        p,
                        NoDrain::Failed {
                            job: job.clone(),
                            status: j.status,
                            message: j.message.clone(),
                        },
                    ),
                    _ if overdue => timed_out(Some(job), Some(job.clone())),
                    _ => awaiting(Some(job), Some(Progress::of(j))),
                };
            }
            // The master forgot the job (a new leader): the segment says where it stands.
            Some(Err(e)) if e.job_not_found() => {}
            // Not answered: the job may still run.
            _ if overdue => return timed_out(Some(job), Some(job.clone())),
            _ => return awaiting(Some(job), None),
        }
    }
    // Started, and no job the master knows: the segment says.
    match segment.as_ref().map(|s| s.status) {
        Ok(SegmentStatus::Drained) => replace(
            p,
            Drain::Drained {
                job: None,
                moved: None,
            },
        ),
        _ if overdue => timed_out(record.job.as_ref(), None),
        Ok(SegmentStatus::Draining) => awaiting(None, None),
        _ => start(input, p, facts, segment, leaving),
    }
}

/// A drain started for `p`, or why it is replaced without one.
fn start(
    input: &RolloutInput<'_>,
    p: &MemberPod,
    facts: GroupFacts,
    segment: Result<&Segment, NoDrain>,
    leaving: &mut BTreeSet<String>,
) -> Step {
    if facts.tier {
        return skip(p, NoDrain::DiskTier);
    }
    let s = match segment {
        Ok(s) => s,
        Err(why) => return skip(p, why),
    };
    match s.status {
        SegmentStatus::Ok => {}
        SegmentStatus::Drained => {
            return replace(
                p,
                Drain::Drained {
                    job: None,
                    moved: None,
                },
            );
        }
        other => return skip(p, NoDrain::SegmentNotOk(other)),
    }
    if let Some(e) = input.refused.get(&p.name) {
        let why = if e.not_served() {
            NoDrain::NotServed
        } else {
            NoDrain::Refused(e.clone())
        };
        return skip(p, why);
    }
    let segments = serving_listing(input).unwrap_or_default();
    let targets = targets(input, p, segments, leaving);
    let free = targets
        .iter()
        .map(|t| t.size_bytes.saturating_sub(t.allocator_used_bytes))
        .fold(0u64, u64::saturating_add);
    let needed = s.allocator_used_bytes;
    if targets.is_empty() || free < needed {
        return skip(p, NoDrain::NoRoom { needed, free });
    }
    leaving.insert(p.ip.clone());
    Step::StartDrain {
        pod: p.name.clone(),
        node: p.node.clone(),
        segment: s.segment_name.clone(),
        targets: targets.iter().map(|t| t.segment_name.clone()).collect(),
        bytes: needed,
    }
}
