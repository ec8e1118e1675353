//! What a member group's rollout does next ([`GroupStep`], [`Step`]): a wait and what for, a
//! drain started or awaited, or a member replaced, drained first or why not.

use std::fmt;

use kvcache_api::quantity::format_bytes;

use crate::members::maintenance::Leaving;
use crate::observe::store::{DrainJob, JobStatus, ReadError, SegmentStatus};

/// The next step of one member group's rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStep {
    /// The group's index.
    pub group: usize,
    /// Its member Pods still to replace: on an earlier template, or drained for a rollout.
    pub to_replace: usize,
    /// What to do now.
    pub step: Step,
    /// Why the member `step` drains is about to lose its node, when it is: a drain for
    /// maintenance, after which the member is held, not replaced.
    pub maintenance: Option<Leaving>,
    /// The group's members about to lose their node whose turn is over: drained, or why not.
    /// They are held (never replaced: a replacement would land on the same node).
    pub held: Vec<Held>,
}

impl GroupStep {
    /// Nothing is left to replace but the last replacement is under way: the replaced Pod
    /// still terminating, or its successor not created yet. The rollout is not complete.
    pub fn settling(&self) -> bool {
        self.to_replace == 0
            && matches!(
                self.step,
                Step::Wait {
                    until: Until::Gone { .. } | Until::Created { .. },
                    next: None,
                }
            )
    }
}

/// A member about to lose its node, held rather than replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The member Pod's name.
    pub pod: String,
    /// Its node's name.
    pub node: String,
    /// Why the node goes.
    pub leaving: Leaving,
    /// `Ok`: its segment was drained (what moved, as far as the master said); `Err`: why not,
    /// so that what it holds goes with the node.
    pub drained: Result<Moved, NoDrain>,
}

/// What a finished drain moved, as far as the master said (`None`: it did not, e.g. a new
/// leader forgot the job and the segment reads `DRAINED`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Objects (keys) moved.
    pub objects: Option<u64>,
    /// Bytes moved.
    pub bytes: Option<u64>,
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
    pub(super) fn of(job: &DrainJob) -> Progress {
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
    /// A warm backend's leader rolls or no master serves ([`super::RolloutInput::leader_unsettled`]).
    Leader,
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
                    until: Until::Mounted { .. } | Until::Leader,
                    ..
                }
        )
    }
}
