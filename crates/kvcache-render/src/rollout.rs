//! A backend's rollout, decided from what runs: which member Pods to replace (their DaemonSets
//! are `OnDelete`, so the operator deletes them), one at a time per group, each member's segment
//! drained to the other members first where the master can ([`member_rollout`],
//! docs/design.md#member-rollout); and whether the standbys wait for election to be enabled at
//! one replica first.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kvcache_api::quantity::format_bytes;

use crate::events::{Kind, Note};
use crate::read::MemberPod;
use crate::store::{DrainJob, JobStatus, ReadError, Segment, SegmentStatus, StoreReading};

/// Member Pods whose template fingerprint differs from the rendered one: the rollout deletes
/// exactly these (DaemonSets are `OnDelete`). Pods already terminating are left alone.
pub fn stale_member_pods<'a>(pods: &'a [MemberPod], rendered: &[String]) -> Vec<&'a str> {
    pods.iter()
        .filter(|p| !p.terminating)
        .filter(|p| rendered.get(p.group).is_some_and(|h| *h != p.hash))
        .map(|p| p.name.as_str())
        .collect()
}

/// Whether the leader Deployment's template runs the elector.
fn elects(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.command.as_ref())
        .and_then(|c| c.first())
        .is_some_and(|c| c == crate::backend::ELECTOR_PATH)
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
}

/// The next step of one member group's rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStep {
    /// The group's index.
    pub group: usize,
    /// Its member Pods still to replace: on an earlier template, or drained for a rollout.
    pub to_replace: usize,
    /// What to do now.
    pub step: Step,
}

/// What a member group's rollout does now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every member Pod runs the current template.
    UpToDate,
    /// One member at a time: something must happen before the next member is touched.
    Wait {
        /// What is waited for.
        until: Until,
        /// The member Pod that comes next, and whether it will be drained.
        next: Option<Next>,
    },
    /// Ask the master to drain the Pod's segment onto `targets`.
    StartDrain {
        /// The member Pod's name.
        pod: String,
        /// Its node's name (empty while it is not scheduled).
        node: String,
        /// Its segment's name on the master.
        segment: String,
        /// The other members' segments that take its objects.
        targets: Vec<String>,
        /// What the segment holds, in bytes.
        bytes: u64,
    },
    /// The Pod's drain runs: ask again shortly.
    AwaitDrain {
        /// The member Pod's name.
        pod: String,
        /// Its node's name (empty while it is not scheduled).
        node: String,
        /// The master's job id (`None`: started, no id recorded; the segment's status says).
        job: Option<String>,
        /// The job's figures, when the master answered.
        progress: Option<Progress>,
    },
    /// Delete the Pod (its DaemonSet creates the replacement).
    Replace {
        /// The member Pod's name.
        pod: String,
        /// Its node's name (empty while it is not scheduled).
        node: String,
        /// Drained first, or why not.
        drain: Drain,
    },
}

/// How far a drain job got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes moved.
    pub moved: u64,
    /// Objects moved.
    pub objects: u64,
    /// Objects that cannot move yet (read within their lease, or no room).
    pub blocked: u64,
}

impl Progress {
    fn of(job: &DrainJob) -> Progress {
        Progress {
            moved: job.migrated_bytes,
            objects: job.succeeded_units,
            blocked: job.blocked_units,
        }
    }
}

/// What a wait is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Until {
    /// A member Pod of the group is terminating.
    Gone {
        /// The member Pod's name.
        pod: String,
        /// Its node's name (empty while it is not scheduled).
        node: String,
    },
    /// The DaemonSet has not created every Pod yet (a replacement is missing).
    Created {
        /// Member Pods of the group that exist.
        present: usize,
        /// Nodes the DaemonSet runs one on.
        desired: usize,
    },
    /// A member Pod on the current template is not Ready.
    Ready {
        /// The member Pod's name.
        pod: String,
        /// Its node's name (empty while it is not scheduled).
        node: String,
    },
    /// A member Pod on the current template is Ready but its segment is not mounted.
    Mounted {
        /// The member Pod's name.
        pod: String,
        /// Its node's name (empty while it is not scheduled).
        node: String,
    },
}

/// The member Pod that comes after a wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    /// The member Pod's name.
    pub pod: String,
    /// Its node's name (empty while it is not scheduled).
    pub node: String,
    /// `Ok`: it will be drained first; `Err`: why it will be replaced without a drain.
    pub drained: Result<(), NoDrain>,
}

/// How a replaced member left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Its segment was drained: its objects are on the other members.
    Drained {
        /// The master's job id (`None`: the segment read `DRAINED` without a job known).
        job: Option<String>,
        /// Bytes moved, when the master said.
        moved: Option<u64>,
    },
    /// Replaced without a drain: what it held is lost.
    Skipped {
        /// Why the segment was not drained first.
        why: NoDrain,
        /// A job still running to cancel first (best effort).
        cancel: Option<String>,
    },
}

/// Why a member is replaced without a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoDrain {
    /// The group has a disk tier: the master leaves tier keys out of a drain.
    DiskTier,
    /// The leader does not serve: nothing can be drained (a new leader starts empty).
    LeaderNotServing,
    /// The master's segment listing could not be read.
    SegmentsUnlisted(ReadError),
    /// No segment carries the Pod's address: it holds nothing the master knows.
    NotMounted,
    /// The Pod's address is shared (host networking): its segment cannot be told apart.
    AmbiguousSegment {
        /// The shared address.
        address: String,
        /// The other member Pods on it (empty: more than one segment carries it).
        with: Vec<String>,
    },
    /// Its segment does not take objects (neither `OK` nor drained).
    SegmentNotOk(SegmentStatus),
    /// The other members lack room for what the segment holds.
    NoRoom {
        /// Bytes the segment holds.
        needed: u64,
        /// Bytes free on the other members' segments.
        free: u64,
    },
    /// The master does not serve drain jobs (older than 0.3.13).
    NotServed,
    /// The master refused the drain.
    Refused(ReadError),
    /// The job ended without emptying the segment.
    Failed {
        /// The master's drain job id.
        job: String,
        /// How it ended.
        status: JobStatus,
        /// The master's words.
        message: String,
    },
    /// The drain did not finish within the deadline.
    TimedOut {
        /// The job, when known.
        job: Option<String>,
        /// The deadline, in seconds.
        seconds: u64,
    },
}

impl SegmentStatus {
    /// The master's own word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentStatus::Ok => "OK",
            SegmentStatus::Draining => "DRAINING",
            SegmentStatus::Drained => "DRAINED",
            SegmentStatus::GracefullyUnmounting => "GRACEFULLY_UNMOUNTING",
            SegmentStatus::Unmounting => "UNMOUNTING",
            SegmentStatus::Undefined => "UNDEFINED",
            SegmentStatus::Unknown => "unknown",
        }
    }
}

impl fmt::Display for NoDrain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoDrain::DiskTier => write!(
                f,
                "the group has a disk tier, whose keys the master leaves out of a drain"
            ),
            NoDrain::LeaderNotServing => write!(
                f,
                "the leader does not serve, so nothing can be drained (a new leader starts with an empty cache)"
            ),
            NoDrain::SegmentsUnlisted(e) => {
                write!(f, "the master's segment listing could not be read: {e}")
            }
            NoDrain::NotMounted => write!(
                f,
                "no segment on the master carries its address, so it holds nothing"
            ),
            NoDrain::AmbiguousSegment { address, with } if with.is_empty() => write!(
                f,
                "more than one segment carries its address {address} (host networking), so a drain could empty a neighbour's"
            ),
            NoDrain::AmbiguousSegment { address, with } => write!(
                f,
                "its address {address} is shared with {} (host networking), so a drain could empty a neighbour's segment",
                with.join(", ")
            ),
            NoDrain::SegmentNotOk(status) => write!(
                f,
                "its segment is {} on the master, not OK (a drain this operator did not start, or unmounting)",
                status.as_str()
            ),
            NoDrain::NoRoom { needed, free } => write!(
                f,
                "its segment holds {} and the other members have {} free",
                format_bytes(*needed),
                format_bytes(*free)
            ),
            NoDrain::NotServed => write!(
                f,
                "the master does not serve drain jobs (/api/v1/drain_jobs, from 0.3.13)"
            ),
            NoDrain::Refused(e) => write!(f, "the master refused the drain: {e}"),
            NoDrain::Failed {
                job,
                status,
                message,
            } => write!(f, "drain job {job} ended {status:?}: {message}"),
            NoDrain::TimedOut {
                job: Some(job),
                seconds,
            } => write!(f, "drain job {job} did not finish within {seconds}s"),
            NoDrain::TimedOut { job: None, seconds } => {
                write!(f, "the drain did not finish within {seconds}s")
            }
        }
    }
}

impl Step {
    /// The job to cancel before the Pod is deleted, if any.
    pub fn cancel(&self) -> Option<&str> {
        match self {
            Step::Replace {
                drain: Drain::Skipped {
                    cancel: Some(job), ..
                },
                ..
            } => Some(job),
            _ => None,
        }
    }

    /// The master must be asked again soon: a drain runs, or a replacement's mount is awaited.
    pub fn polls_store(&self) -> bool {
        matches!(
            self,
            Step::StartDrain { .. }
                | Step::AwaitDrain { .. }
                | Step::Wait {
                    until: Until::Mounted { .. },
                    ..
                }
        )
    }
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
    let mut candidates: Vec<&MemberPod> = pods
        .iter()
        .copied()
        .filter(|p| !p.terminating && (p.hash != rendered || p.drain.is_some()))
        .collect();
    // A drain under way first (re-entry), then a member that is not Ready, then by name.
    candidates.sort_by_key(|p| (p.drain.is_none(), p.ready, p.name.as_str()));
    let to_replace = candidates.len();
    let at = |step| GroupStep {
        group,
        to_replace,
        step,
    };
    let Some(next) = candidates.first() else {
        return at(Step::UpToDate);
    };
    let facts = input.groups.get(group).copied().unwrap_or_default();
    let step = candidate_step(input, next, facts, leaving);
    // A drain under way goes on whatever else the group waits for.
    if matches!(step, Step::AwaitDrain { .. }) {
        return at(step);
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
        return at(Step::Wait {
            until,
            next: Some(Next {
                pod: next.name.clone(),
                node: next.node.clone(),
                drained,
            }),
        });
    }
    at(step)
}

/// What one member at a time waits for before the next is touched, if anything.
fn gate(
    input: &RolloutInput<'_>,
    pods: &[&MemberPod],
    rendered: &str,
    facts: GroupFacts,
) -> Option<Until> {
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
    if pods.len() < desired {
        return Some(Until::Created {
            present: pods.len(),
            desired,
        });
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
/// themselves leaving.
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
            input
                .members
                .iter()
                .any(|o| !o.terminating && !o.ip.is_empty() && o.ip == s.host())
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
                        "waiting for the DaemonSet to create the replacement ({present} of {desired} member Pods exist)"
                    ),
                    Until::Ready { pod, node } => {
                        format!("waiting for {} to be Ready", member(pod, node))
                    }
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
                "draining {}: its segment {segment} ({}) goes to the other members before the Pod is replaced",
                member(pod, node),
                format_bytes(*bytes)
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
pub fn member_progress(steps: &[GroupStep]) -> Option<(&'static str, String)> {
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
                "draining the segment {segment} of {} in group {g} ({}) onto {} other member segments before replacing it (job {})",
                member(pod, node),
                format_bytes(*bytes),
                targets.len(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::DrainRecord;
    use crate::store::{Health, Metrics};

    const MI: u64 = 1 << 20;
    const NOW: &str = "2026-12-02T12:10:00Z";
    /// A minute before [`NOW`]: within the deadline.
    const RECENT: &str = "2026-12-02T12:09:00Z";
    /// Twenty minutes before [`NOW`]: past the deadline.
    const LONG_AGO: &str = "2026-12-02T11:50:00Z";
    const DEADLINE: Duration = Duration::from_secs(600);

    fn time(t: &str) -> Timestamp {
        t.parse().expect("a time")
    }

    fn pod(name: &str, ip: &str) -> MemberPod {
        MemberPod {
            name: name.into(),
            node: format!("node-{name}"),
            ip: ip.into(),
            group: 0,
            ready: true,
            terminating: false,
            hash: "old".into(),
            problem: None,
            survey: None,
            drain: None,
        }
    }

    fn segment(ip: &str, used: u64, status: SegmentStatus) -> Segment {
        Segment {
            segment_name: format!("{ip}:13360"),
            segment_id: format!("id-{ip}"),
            client_id: format!("client-{ip}"),
            size_bytes: 64 * MI,
            allocator_used_bytes: used,
            status,
        }
    }

    fn serving(segments: Vec<Segment>) -> StoreReading {
        StoreReading {
            health: Ok(Health {
                service_ready: true,
                role: Some("leader".into()),
                ha_state: Some("serving".into()),
                ..Default::default()
            }),
            metrics: Ok(Metrics::default()),
            segments: Ok(segments),
        }
    }

    fn job(status: JobStatus) -> DrainJob {
        DrainJob {
            job_id: "7-9".into(),
            status,
            segments: vec!["10.0.0.1:13360".into()],
            succeeded_units: 16,
            migrated_bytes: 8 * MI,
            blocked_units: 2,
            message: "Drain job running".into(),
            created_at_ms_epoch: time(RECENT).as_millisecond(),
            ..Default::default()
        }
    }

    fn record(started: Option<&str>, job: Option<&str>) -> Option<DrainRecord> {
        Some(DrainRecord {
            started: started.map(time),
            job: job.map(str::to_owned),
        })
    }

    /// One group of two members on an earlier template, both mounted: m-a holds 8 MiB, m-b
    /// 4 MiB of 64 MiB each; an engine's segment (10.0.9.9) beside them.
    struct Fixture {
        members: Vec<MemberPod>,
        rendered: Vec<String>,
        groups: Vec<GroupFacts>,
        store: Option<StoreReading>,
        jobs: BTreeMap<String, Result<DrainJob, ReadError>>,
        refused: BTreeMap<String, ReadError>,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                members: vec![pod("m-a", "10.0.0.1"), pod("m-b", "10.0.0.2")],
                rendered: vec!["new".into()],
                groups: vec![GroupFacts {
                    tier: false,
                    desired: Some(2),
                }],
                store: Some(serving(vec![
                    segment("10.0.0.1", 8 * MI, SegmentStatus::Ok),
                    segment("10.0.0.2", 4 * MI, SegmentStatus::Ok),
                    segment("10.0.9.9", 0, SegmentStatus::Ok),
                ])),
                jobs: BTreeMap::new(),
                refused: BTreeMap::new(),
            }
        }

        fn member(&mut self, name: &str) -> &mut MemberPod {
            self.members
                .iter_mut()
                .find(|p| p.name == name)
                .expect("a member of the fixture")
        }

        fn segments(&mut self) -> &mut Vec<Segment> {
            self.store
                .as_mut()
                .and_then(|s| s.segments.as_mut().ok())
                .expect("a listing")
        }

        fn steps(&self) -> Vec<GroupStep> {
            member_rollout(&RolloutInput {
                members: &self.members,
                rendered: &self.rendered,
                groups: &self.groups,
                store: self.store.as_ref(),
                jobs: &self.jobs,
                refused: &self.refused,
                now: time(NOW),
                deadline: DEADLINE,
            })
        }

        fn step(&self) -> Step {
            self.steps().remove(0).step
        }
    }

    fn start_of(pod: &str, targets: &[&str], bytes: u64) -> Step {
        let ip = if pod == "m-a" { "10.0.0.1" } else { "10.0.0.2" };
        Step::StartDrain {
            pod: pod.into(),
            node: format!("node-{pod}"),
            segment: format!("{ip}:13360"),
            targets: targets.iter().map(|t| format!("{t}:13360")).collect(),
            bytes,
        }
    }

    fn skipped(pod: &str, why: NoDrain) -> Step {
        Step::Replace {
            pod: pod.into(),
            node: format!("node-{pod}"),
            drain: Drain::Skipped { why, cancel: None },
        }
    }

    fn drained(pod: &str, job: Option<&str>, moved: Option<u64>) -> Step {
        Step::Replace {
            pod: pod.into(),
            node: format!("node-{pod}"),
            drain: Drain::Drained {
                job: job.map(str::to_owned),
                moved,
            },
        }
    }

    #[test]
    fn a_group_on_the_current_template_has_nothing_to_do() {
        let mut f = Fixture::new();
        f.rendered = vec!["old".into()];
        assert_eq!(
            f.steps(),
            [GroupStep {
                group: 0,
                to_replace: 0,
                step: Step::UpToDate
            }]
        );
        assert_eq!(member_progress(&f.steps()), None);
    }

    #[test]
    fn the_first_member_by_name_is_drained_onto_the_other_members_only() {
        let f = Fixture::new();
        let steps = f.steps();
        assert_eq!(steps[0].to_replace, 2);
        // The engine's segment (no member Pod on 10.0.9.9) takes nothing.
        assert_eq!(steps[0].step, start_of("m-a", &["10.0.0.2"], 8 * MI));
    }

    #[test]
    fn a_member_that_is_not_ready_goes_before_the_others() {
        let mut f = Fixture::new();
        f.member("m-b").ready = false;
        assert_eq!(f.step(), start_of("m-b", &["10.0.0.1"], 4 * MI));
    }

    #[test]
    fn a_recorded_drain_goes_on_before_any_other_member() {
        let mut f = Fixture::new();
        f.member("m-b").drain = record(Some(RECENT), Some("7-9"));
        f.jobs.insert("7-9".into(), Ok(job(JobStatus::Running)));
        assert_eq!(
            f.step(),
            Step::AwaitDrain {
                pod: "m-b".into(),
                node: "node-m-b".into(),
                job: Some("7-9".into()),
                progress: Some(Progress {
                    moved: 8 * MI,
                    objects: 16,
                    blocked: 2
                }),
            }
        );
    }

    #[test]
    fn a_drain_under_way_goes_on_while_the_group_waits() {
        let mut f = Fixture::new();
        f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
        f.jobs.insert("7-9".into(), Ok(job(JobStatus::Planning)));
        f.member("m-b").terminating = true;
        assert!(matches!(f.step(), Step::AwaitDrain { .. }));
    }

    #[test]
    fn nothing_is_touched_while_a_member_of_the_group_is_going() {
        let mut f = Fixture::new();
        f.member("m-b").terminating = true;
        assert_eq!(
            f.step(),
            Step::Wait {
                until: Until::Gone {
                    pod: "m-b".into(),
                    node: "node-m-b".into()
                },
                next: Some(Next {
                    pod: "m-a".into(),
                    node: "node-m-a".into(),
                    drained: Ok(())
                }),
            }
        );
    }

    #[test]
    fn nothing_is_touched_while_the_daemon_set_has_not_created_the_replacement() {
        let mut f = Fixture::new();
        f.members.remove(1);
        assert!(matches!(
            f.step(),
            Step::Wait {
                until: Until::Created {
                    present: 1,
                    desired: 2
                },
                ..
            }
        ));
        // Not reported yet: the count is not waited for.
        f.groups[0].desired = None;
        assert!(matches!(f.step(), Step::Replace { .. }));
    }

    #[test]
    fn a_replacement_is_waited_for_until_ready_and_mounted() {
        let mut f = Fixture::new();
        let mut fresh = pod("m-c", "10.0.0.3");
        fresh.hash = "new".into();
        fresh.ready = false;
        f.members[1] = fresh;
        // No room for m-a yet (its one other member is new and unmounted): judged at its turn.
        let next = Some(Next {
            pod: "m-a".into(),
            node: "node-m-a".into(),
            drained: Ok(()),
        });
        assert_eq!(
            f.step(),
            Step::Wait {
                until: Until::Ready {
                    pod: "m-c".into(),
                    node: "node-m-c".into()
                },
                next: next.clone(),
            }
        );
        f.member("m-c").ready = true;
        assert_eq!(
            f.step(),
            Step::Wait {
                until: Until::Mounted {
                    pod: "m-c".into(),
                    node: "node-m-c".into()
                },
                next,
            }
        );
        assert!(f.step().polls_store());
        f.segments().push(segment("10.0.0.3", 0, SegmentStatus::Ok));
        assert_eq!(f.step(), start_of("m-a", &["10.0.0.3"], 8 * MI));
    }

    #[test]
    fn a_mount_is_not_waited_for_when_the_leader_does_not_serve() {
        let mut f = Fixture::new();
        let mut fresh = pod("m-c", "10.0.0.3");
        fresh.hash = "new".into();
        f.members[1] = fresh;
        f.store = None;
        assert_eq!(f.step(), skipped("m-a", NoDrain::LeaderNotServing));
    }

    #[test]
    fn a_finished_drain_replaces_its_member_as_drained() {
        let mut f = Fixture::new();
        f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
        f.jobs.insert("7-9".into(), Ok(job(JobStatus::Succeeded)));
        f.segments()[0].status = SegmentStatus::Drained;
        assert_eq!(f.step(), drained("m-a", Some("7-9"), Some(8 * MI)));
    }

    #[test]
    fn a_failed_or_cancelled_drain_replaces_its_member_without_and_says_so() {
        for status in [JobStatus::Failed, JobStatus::Canceled] {
            let mut f = Fixture::new();
            f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
            let mut j = job(status);
            j.message = "Drain job failed: unrecoverable units remain".into();
            f.jobs.insert("7-9".into(), Ok(j));
            assert_eq!(
                f.step(),
                skipped(
                    "m-a",
                    NoDrain::Failed {
                        job: "7-9".into(),
                        status,
                        message: "Drain job failed: unrecoverable units remain".into()
                    }
                )
            );
        }
    }

    #[test]
    fn a_drain_past_the_deadline_is_cancelled_and_its_member_replaced_without() {
        let mut f = Fixture::new();
        f.member("m-a").drain = record(Some(LONG_AGO), Some("7-9"));
        f.jobs.insert("7-9".into(), Ok(job(JobStatus::Running)));
        let step = f.step();
        assert_eq!(
            step,
            Step::Replace {
                pod: "m-a".into(),
                node: "node-m-a".into(),
                drain: Drain::Skipped {
                    why: NoDrain::TimedOut {
                        job: Some("7-9".into()),
                        seconds: 600
                    },
                    cancel: Some("7-9".into())
                }
            }
        );
        assert_eq!(step.cancel(), Some("7-9"));
    }

    #[test]
    fn an_unanswered_job_is_awaited_until_the_deadline() {
        let mut f = Fixture::new();
        f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
        f.jobs.insert(
            "7-9".into(),
            Err(ReadError::Unreachable {
                url: "q".into(),
                cause: kvcache_quota::admin::NoAnswer::TimedOut { after_ms: 1500 },
            }),
        );
        assert_eq!(
            f.step(),
            Step::AwaitDrain {
                pod: "m-a".into(),
                node: "node-m-a".into(),
                job: Some("7-9".into()),
                progress: None
            }
        );
        f.member("m-a").drain = record(Some(LONG_AGO), Some("7-9"));
        assert_eq!(f.step().cancel(), Some("7-9"));
    }

    #[test]
    fn a_job_the_master_forgot_is_followed_by_the_segment() {
        let forgot = || {
            Err(ReadError::Refused {
                url: "q".into(),
                status: 404,
                code: crate::store::JOB_NOT_FOUND,
                message: "JOB_NOT_FOUND".into(),
            })
        };
        // Drained already: replaced as drained.
        let mut f = Fixture::new();
        f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
        f.jobs.insert("7-9".into(), forgot());
        f.segments()[0].status = SegmentStatus::Drained;
        assert_eq!(f.step(), drained("m-a", None, None));
        // Taking objects again (a new leader): drained again, within the first deadline.
        f.segments()[0].status = SegmentStatus::Ok;
        assert_eq!(f.step(), start_of("m-a", &["10.0.0.2"], 8 * MI));
        // Past it: replaced without, nothing left to cancel.
        f.member("m-a").drain = record(Some(LONG_AGO), Some("7-9"));
        assert_eq!(
            f.step(),
            skipped(
                "m-a",
                NoDrain::TimedOut {
                    job: Some("7-9".into()),
                    seconds: 600
                }
            )
        );
    }

    #[test]
    fn a_drain_started_without_an_answer_is_followed_by_the_segment() {
        let mut f = Fixture::new();
        f.member("m-a").drain = record(Some(RECENT), None);
        f.segments()[0].status = SegmentStatus::Draining;
        assert_eq!(
            f.step(),
            Step::AwaitDrain {
                pod: "m-a".into(),
                node: "node-m-a".into(),
                job: None,
                progress: None
            }
        );
        f.segments()[0].status = SegmentStatus::Drained;
        assert_eq!(f.step(), drained("m-a", None, None));
        // Never created: asked again.
        f.segments()[0].status = SegmentStatus::Ok;
        assert_eq!(f.step(), start_of("m-a", &["10.0.0.2"], 8 * MI));
        f.member("m-a").drain = record(Some(LONG_AGO), None);
        f.segments()[0].status = SegmentStatus::Draining;
        assert_eq!(
            f.step(),
            skipped(
                "m-a",
                NoDrain::TimedOut {
                    job: None,
                    seconds: 600
                }
            )
        );
    }

    #[test]
    fn a_drain_without_a_readable_start_is_bounded_by_the_jobs_own_time() {
        let mut f = Fixture::new();
        f.member("m-a").drain = record(None, Some("7-9"));
        f.jobs.insert("7-9".into(), Ok(job(JobStatus::Running)));
        assert!(matches!(f.step(), Step::AwaitDrain { .. }));
        let mut old = job(JobStatus::Running);
        old.created_at_ms_epoch = time(LONG_AGO).as_millisecond();
        f.jobs.insert("7-9".into(), Ok(old));
        assert_eq!(f.step().cancel(), Some("7-9"));
        // Neither time known: nothing bounds it, so it is over.
        f.jobs.clear();
        assert_eq!(f.step().cancel(), Some("7-9"));
    }

    #[test]
    fn a_disk_tier_group_rolls_one_at_a_time_without_a_drain() {
        let mut f = Fixture::new();
        f.groups[0].tier = true;
        assert_eq!(f.step(), skipped("m-a", NoDrain::DiskTier));
    }

    #[test]
    fn no_serving_leader_or_no_listing_rolls_without_a_drain() {
        let mut f = Fixture::new();
        f.store = None;
        assert_eq!(f.step(), skipped("m-a", NoDrain::LeaderNotServing));
        let mut f = Fixture::new();
        if let Some(s) = f.store.as_mut() {
            s.health = Ok(Health::default());
        }
        assert_eq!(f.step(), skipped("m-a", NoDrain::LeaderNotServing));
        let mut f = Fixture::new();
        let unlisted = ReadError::Status {
            url: "http://m:9003/get_segments_detail".into(),
            status: 404,
        };
        if let Some(s) = f.store.as_mut() {
            s.segments = Err(unlisted.clone());
        }
        assert_eq!(
            f.step(),
            skipped("m-a", NoDrain::SegmentsUnlisted(unlisted))
        );
    }

    #[test]
    fn a_member_without_a_segment_holds_nothing_to_drain() {
        let mut f = Fixture::new();
        f.segments().remove(0);
        assert_eq!(f.step(), skipped("m-a", NoDrain::NotMounted));
        let mut f = Fixture::new();
        f.member("m-a").ip = String::new();
        f.member("m-a").ready = false;
        assert_eq!(f.step(), skipped("m-a", NoDrain::NotMounted));
    }

    #[test]
    fn a_segment_name_shared_on_host_networking_is_not_drained() {
        // Two groups on one node's address: neither can be told apart.
        let mut f = Fixture::new();
        let mut other = pod("m-x", "10.0.0.1");
        other.group = 1;
        f.members.push(other);
        f.rendered.push("old".into());
        f.groups.push(GroupFacts::default());
        assert_eq!(
            f.step(),
            skipped(
                "m-a",
                NoDrain::AmbiguousSegment {
                    address: "10.0.0.1".into(),
                    with: vec!["m-x".into()]
                }
            )
        );
        // Two segments on the address (an engine on the host network beside it).
        let mut f = Fixture::new();
        let mut second = segment("10.0.0.1", 0, SegmentStatus::Ok);
        second.segment_name = "10.0.0.1:17000".into();
        f.segments().push(second);
        assert_eq!(
            f.step(),
            skipped(
                "m-a",
                NoDrain::AmbiguousSegment {
                    address: "10.0.0.1".into(),
                    with: vec![]
                }
            )
        );
    }

    #[test]
    fn a_segment_drained_or_draining_without_a_record_is_judged_by_its_status() {
        let mut f = Fixture::new();
        f.segments()[0].status = SegmentStatus::Drained;
        assert_eq!(f.step(), drained("m-a", None, None));
        f.segments()[0].status = SegmentStatus::Draining;
        assert_eq!(
            f.step(),
            skipped("m-a", NoDrain::SegmentNotOk(SegmentStatus::Draining))
        );
    }

    #[test]
    fn a_master_without_the_drain_api_or_refusing_it_rolls_without() {
        let mut f = Fixture::new();
        f.refused.insert(
            "m-a".into(),
            ReadError::Status {
                url: "http://m:9003/api/v1/drain_jobs".into(),
                status: 404,
            },
        );
        assert_eq!(f.step(), skipped("m-a", NoDrain::NotServed));
        let conflict = ReadError::Refused {
            url: "http://m:9003/api/v1/drain_jobs".into(),
            status: 409,
            code: -1010,
            message: "UNAVAILABLE_IN_CURRENT_STATUS".into(),
        };
        f.refused.insert("m-a".into(), conflict.clone());
        assert_eq!(f.step(), skipped("m-a", NoDrain::Refused(conflict)));
    }

    #[test]
    fn no_room_on_the_other_members_rolls_without_a_drain() {
        let mut f = Fixture::new();
        f.segments()[1].allocator_used_bytes = 60 * MI;
        assert_eq!(
            f.step(),
            skipped(
                "m-a",
                NoDrain::NoRoom {
                    needed: 8 * MI,
                    free: 4 * MI
                }
            )
        );
        // Exactly enough room is enough.
        f.segments()[1].allocator_used_bytes = 56 * MI;
        assert_eq!(f.step(), start_of("m-a", &["10.0.0.2"], 8 * MI));
        // A lone member has nowhere to go, even empty.
        let mut f = Fixture::new();
        f.members.remove(1);
        f.groups[0].desired = Some(1);
        f.segments()[0].allocator_used_bytes = 0;
        assert_eq!(
            f.step(),
            skipped("m-a", NoDrain::NoRoom { needed: 0, free: 0 })
        );
    }

    #[test]
    fn targets_are_ok_segments_of_members_that_stay() {
        let mut f = Fixture::new();
        f.members.push(pod("m-c", "10.0.0.3"));
        f.members.push(pod("m-d", "10.0.0.4"));
        f.groups[0].desired = Some(4);
        f.segments()
            .push(segment("10.0.0.3", 0, SegmentStatus::Draining));
        f.segments().push(segment("10.0.0.4", 0, SegmentStatus::Ok));
        assert_eq!(f.step(), start_of("m-a", &["10.0.0.2", "10.0.0.4"], 8 * MI));
        // A member going takes nothing (one of another group, so this one does not wait).
        f.member("m-d").terminating = true;
        f.member("m-d").group = 1;
        f.rendered.push("old".into());
        f.groups[0].desired = Some(3);
        assert_eq!(f.step(), start_of("m-a", &["10.0.0.2"], 8 * MI));
    }

    #[test]
    fn groups_roll_side_by_side_and_a_segment_leaving_takes_nothing() {
        let mut f = Fixture::new();
        let (mut x, mut y) = (pod("m-x", "10.0.1.1"), pod("m-y", "10.0.1.2"));
        x.group = 1;
        y.group = 1;
        f.members.extend([x, y]);
        f.rendered.push("new".into());
        f.groups.push(GroupFacts {
            tier: false,
            desired: Some(2),
        });
        f.segments()
            .push(segment("10.0.1.1", MI, SegmentStatus::Ok));
        f.segments().push(segment("10.0.1.2", 0, SegmentStatus::Ok));
        let steps = f.steps();
        assert_eq!(
            steps[0].step,
            start_of("m-a", &["10.0.0.2", "10.0.1.1", "10.0.1.2"], 8 * MI)
        );
        // Group 1's drain does not count on group 0's leaving segment.
        let Step::StartDrain { pod, targets, .. } = &steps[1].step else {
            panic!("group 1 drains: {:?}", steps[1]);
        };
        assert_eq!(pod, "m-x");
        assert_eq!(targets, &["10.0.0.2:13360", "10.0.1.2:13360"]);
    }

    #[test]
    fn a_drain_held_by_a_wait_leaves_its_segment_to_the_other_groups() {
        let mut f = Fixture::new();
        f.member("m-b").terminating = true;
        let mut x = pod("m-x", "10.0.1.1");
        x.group = 1;
        f.members.push(x);
        f.rendered.push("new".into());
        f.groups.push(GroupFacts {
            tier: false,
            desired: Some(1),
        });
        f.segments()
            .push(segment("10.0.1.1", MI, SegmentStatus::Ok));
        let steps = f.steps();
        assert!(matches!(steps[0].step, Step::Wait { .. }));
        let Step::StartDrain { targets, .. } = &steps[1].step else {
            panic!("group 1 drains: {:?}", steps[1]);
        };
        assert_eq!(targets, &["10.0.0.1:13360"]);
    }

    #[test]
    fn a_member_drained_for_a_template_since_reverted_is_still_replaced() {
        let mut f = Fixture::new();
        f.rendered = vec!["old".into()];
        f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
        f.jobs.insert("7-9".into(), Ok(job(JobStatus::Succeeded)));
        let steps = f.steps();
        assert_eq!(steps[0].to_replace, 1);
        assert_eq!(steps[0].step, drained("m-a", Some("7-9"), Some(8 * MI)));
    }

    #[test]
    fn the_condition_says_how_members_roll() {
        let f = Fixture::new();
        let (reason, message) = member_progress(&f.steps()).expect("rolling");
        assert_eq!(reason, "MembersDraining");
        assert_eq!(
            message,
            "member group 0: draining member Pod m-a (node node-m-a): its segment 10.0.0.1:13360 (8Mi) goes to the other members before the Pod is replaced (2 member Pods to replace)"
        );
        let mut f = Fixture::new();
        f.groups[0].tier = true;
        f.member("m-b").terminating = true;
        let (reason, message) = member_progress(&f.steps()).expect("rolling");
        assert_eq!(reason, "MembersRolledWithoutDrain");
        assert_eq!(
            message,
            "member group 0: waiting for member Pod m-b (node node-m-b) to go; next member Pod m-a (node node-m-a), without a drain: the group has a disk tier, whose keys the master leaves out of a drain (1 member Pods to replace)"
        );
    }

    #[test]
    fn each_step_reads_as_a_clause() {
        let step = |step| GroupStep {
            group: 1,
            to_replace: 2,
            step,
        };
        let cases = [
            (
                Step::AwaitDrain {
                    pod: "m-a".into(),
                    node: "n1".into(),
                    job: Some("7-9".into()),
                    progress: Some(Progress {
                        moved: 8 * MI,
                        objects: 16,
                        blocked: 2,
                    }),
                },
                "member group 1: draining member Pod m-a (node n1), job 7-9: 16 objects, 8Mi moved, 2 waiting (read within their lease, or no room yet) (2 member Pods to replace)",
            ),
            (
                Step::Wait {
                    until: Until::Created {
                        present: 1,
                        desired: 2,
                    },
                    next: None,
                },
                "member group 1: waiting for the DaemonSet to create the replacement (1 of 2 member Pods exist) (2 member Pods to replace)",
            ),
            (
                Step::Wait {
                    until: Until::Ready {
                        pod: "m-c".into(),
                        node: String::new(),
                    },
                    next: None,
                },
                "member group 1: waiting for member Pod m-c (not scheduled) to be Ready (2 member Pods to replace)",
            ),
            (
                drained("m-a", Some("7-9"), Some(MI)),
                "member group 1: member Pod m-a (node node-m-a) replaced after its segment was drained (2 member Pods to replace)",
            ),
            (
                skipped("m-a", NoDrain::NotServed),
                "member group 1: member Pod m-a (node node-m-a) replaced without a drain: the master does not serve drain jobs (/api/v1/drain_jobs, from 0.3.13) (2 member Pods to replace)",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(step(s).describe().as_deref(), Some(want));
        }
    }

    #[test]
    fn every_reason_not_to_drain_reads_as_a_sentence() {
        let refusal = ReadError::Refused {
            url: "u".into(),
            status: 409,
            code: -1010,
            message: "UNAVAILABLE_IN_CURRENT_STATUS".into(),
        };
        let cases = [
            (
                NoDrain::NotMounted,
                "no segment on the master carries its address, so it holds nothing",
            ),
            (
                NoDrain::AmbiguousSegment {
                    address: "10.0.0.1".into(),
                    with: vec!["m-x".into()],
                },
                "its address 10.0.0.1 is shared with m-x (host networking), so a drain could empty a neighbour's segment",
            ),
            (
                NoDrain::AmbiguousSegment {
                    address: "10.0.0.1".into(),
                    with: vec![],
                },
                "more than one segment carries its address 10.0.0.1 (host networking), so a drain could empty a neighbour's",
            ),
            (
                NoDrain::SegmentNotOk(SegmentStatus::Unmounting),
                "its segment is UNMOUNTING on the master, not OK (a drain this operator did not start, or unmounting)",
            ),
            (
                NoDrain::NoRoom {
                    needed: 8 * MI,
                    free: 4 * MI,
                },
                "its segment holds 8Mi and the other members have 4Mi free",
            ),
            (
                NoDrain::Refused(refusal),
                "the master refused the drain: u answered HTTP 409: UNAVAILABLE_IN_CURRENT_STATUS (error code -1010)",
            ),
            (
                NoDrain::Failed {
                    job: "7-9".into(),
                    status: JobStatus::Failed,
                    message: "m".into(),
                },
                "drain job 7-9 ended Failed: m",
            ),
            (
                NoDrain::TimedOut {
                    job: Some("7-9".into()),
                    seconds: 600,
                },
                "drain job 7-9 did not finish within 600s",
            ),
            (
                NoDrain::TimedOut {
                    job: None,
                    seconds: 600,
                },
                "the drain did not finish within 600s",
            ),
        ];
        for (why, want) in cases {
            assert_eq!(why.to_string(), want);
        }
    }

    #[test]
    fn carried_out_steps_record_drained_or_not_naming_the_pod() {
        let step = |step| GroupStep {
            group: 0,
            to_replace: 2,
            step,
        };
        let started = step_event(&step(start_of("m-a", &["10.0.0.2"], 8 * MI)), Some("7-9"))
            .expect("an event");
        assert_eq!(
            (started.kind, started.reason),
            (Kind::Normal, "MemberDraining")
        );
        assert_eq!(
            started.message,
            "draining the segment 10.0.0.1:13360 of member Pod m-a (node node-m-a) in group 0 (8Mi) onto 1 other member segments before replacing it (job 7-9)"
        );
        let done =
            step_event(&step(drained("m-a", Some("7-9"), Some(8 * MI))), None).expect("an event");
        assert_eq!((done.kind, done.reason), (Kind::Normal, "MemberDrained"));
        assert!(done.message.contains("m-a") && done.message.contains("job 7-9, 8Mi moved"));
        let lost = step_event(&step(skipped("m-b", NoDrain::DiskTier)), None).expect("an event");
        assert_eq!(
            (lost.kind, lost.reason),
            (Kind::Warning, "MemberRolledWithoutDrain")
        );
        assert_eq!(
            lost.message,
            "replacing member Pod m-b (node node-m-b) of group 0 without a drain, so the cache it held is lost: the group has a disk tier, whose keys the master leaves out of a drain"
        );
        assert_eq!(step_event(&step(Step::UpToDate), None), None);
    }
}
