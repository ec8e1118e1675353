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
mod tests;
