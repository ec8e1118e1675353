use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::note::Kind;
use crate::observe::read::{DrainRecord, MemberPod};
use crate::observe::store::{
    DrainJob, Health, JobStatus, Metrics, ReadError, Segment, SegmentStatus, StoreReading,
};

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
        leaving: None,
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
    leader_unsettled: bool,
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
            leader_unsettled: false,
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
            leader_unsettled: self.leader_unsettled,
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
            step: Step::UpToDate,
            maintenance: None,
            held: Vec::new(),
        }]
    );
    assert_eq!(member_progress(&f.steps()), None);
}

#[test]
fn the_last_replacement_settles_before_the_group_is_up_to_date() {
    let mut f = Fixture::new();
    f.rendered = vec!["old".into()];
    // The last member replaced still terminating (seen as Ready): not up to date.
    f.member("m-b").terminating = true;
    let steps = f.steps();
    assert_eq!(
        steps[0].step,
        Step::Wait {
            until: Until::Gone {
                pod: "m-b".into(),
                node: "node-m-b".into(),
            },
            next: None,
        }
    );
    assert!(steps[0].settling(), "{steps:?}");
    // Gone, its successor not created yet.
    f.members.retain(|p| p.name != "m-b");
    let steps = f.steps();
    assert_eq!(
        steps[0].step,
        Step::Wait {
            until: Until::Created {
                present: 1,
                desired: 2,
            },
            next: None,
        }
    );
    assert!(steps[0].settling(), "{steps:?}");
    // Its successor exists: up to date (its readiness is `MembersMounted`'s to tell).
    let mut next = pod("m-c", "10.0.0.3");
    next.ready = false;
    f.members.push(next);
    let steps = f.steps();
    assert_eq!(steps[0].step, Step::UpToDate);
    assert!(!steps[0].settling());
    // A group with members still to replace waits the same way but is not settling: it rolls.
    f.rendered = vec!["new".into()];
    f.member("m-a").terminating = true;
    assert!(!f.steps()[0].settling());
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
            code: crate::observe::store::JOB_NOT_FOUND,
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
        maintenance: None,
        held: Vec::new(),
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
            "member group 1: waiting for the DaemonSet to create a member Pod (1 of 2 exist) (2 member Pods to replace)",
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
        maintenance: None,
        held: Vec::new(),
    };
    let started =
        step_event(&step(start_of("m-a", &["10.0.0.2"], 8 * MI)), Some("7-9")).expect("an event");
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

// Node maintenance (docs/design.md#node-maintenance): members about to lose their node.

use crate::members::maintenance::Leaving;

/// The fixture with every member on the current template and `m-a`'s node cordoned.
fn cordoned() -> Fixture {
    let mut f = Fixture::new();
    f.rendered = vec!["old".into()];
    f.member("m-a").leaving = Some(Leaving::Cordoned);
    f
}

#[test]
fn a_member_on_a_cordoned_node_is_drained_onto_the_others_then_held_not_replaced() {
    let mut f = cordoned();
    let steps = f.steps();
    assert_eq!(steps[0].step, start_of("m-a", &["10.0.0.2"], 8 * MI));
    assert_eq!(steps[0].maintenance, Some(Leaving::Cordoned));
    let event = step_event(&steps[0], Some("7-9")).expect("an event");
    assert!(
        event
            .message
            .ends_with("before its node goes (cordoned) (job 7-9)"),
        "{}",
        event.message
    );
    // Re-entry: the job runs.
    f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
    f.jobs.insert("7-9".into(), Ok(job(JobStatus::Running)));
    assert!(matches!(f.step(), Step::AwaitDrain { .. }));
    // Done: held with what moved; nothing is replaced, the group is up to date.
    f.jobs.insert("7-9".into(), Ok(job(JobStatus::Succeeded)));
    f.segments()[0].status = SegmentStatus::Drained;
    let steps = f.steps();
    assert_eq!(steps[0].step, Step::UpToDate);
    assert_eq!(
        steps[0].held,
        [Held {
            pod: "m-a".into(),
            node: "node-m-a".into(),
            leaving: Leaving::Cordoned,
            drained: Ok(Moved {
                objects: Some(16),
                bytes: Some(8 * MI),
            }),
        }]
    );
}

#[test]
fn a_member_on_a_leaving_node_is_never_a_target_and_one_that_cannot_drain_is_held_saying_why() {
    let mut f = cordoned();
    f.member("m-b").leaving = Some(Leaving::ScaleDown);
    let steps = f.steps();
    assert_eq!(steps[0].step, Step::UpToDate);
    let whys: Vec<_> = steps[0].held.iter().map(|h| h.drained.clone()).collect();
    assert_eq!(
        whys,
        [
            Err(NoDrain::NoRoom {
                needed: 8 * MI,
                free: 0
            }),
            Err(NoDrain::NoRoom {
                needed: 4 * MI,
                free: 0
            })
        ]
    );
    // A disk tier's keys are left out of a drain by the master.
    let mut f = cordoned();
    f.groups[0].tier = true;
    assert_eq!(f.steps()[0].held[0].drained, Err(NoDrain::DiskTier));
}

#[test]
fn a_leaving_member_drains_before_a_stale_one_rolls_and_is_left_out_of_its_drain() {
    let mut f = Fixture::new();
    f.member("m-a").hash = "new".into();
    f.member("m-a").leaving = Some(Leaving::GroupNarrowed);
    // m-b is stale, but m-a's node goes first.
    assert_eq!(f.step(), start_of("m-a", &["10.0.0.2"], 8 * MI));
    f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
    f.jobs.insert("7-9".into(), Ok(job(JobStatus::Succeeded)));
    f.segments()[0].status = SegmentStatus::Drained;
    // m-a held; m-b rolls, its drain onto none of m-a's (leaving, and DRAINED).
    let steps = f.steps();
    assert_eq!(steps[0].held.len(), 1);
    assert_eq!(steps[0].to_replace, 1);
    assert_eq!(
        steps[0].step,
        skipped(
            "m-b",
            NoDrain::NoRoom {
                needed: 4 * MI,
                free: 0
            }
        )
    );
}

#[test]
fn a_node_uncordoned_mid_drain_finishes_the_drain_then_replaces_its_member_to_take_objects_again() {
    let mut f = cordoned();
    f.member("m-a").drain = record(Some(RECENT), Some("7-9"));
    f.jobs.insert("7-9".into(), Ok(job(JobStatus::Running)));
    f.member("m-a").leaving = None;
    let steps = f.steps();
    assert!(matches!(steps[0].step, Step::AwaitDrain { .. }));
    assert_eq!(steps[0].maintenance, None);
    f.jobs.insert("7-9".into(), Ok(job(JobStatus::Succeeded)));
    assert_eq!(f.step(), drained("m-a", Some("7-9"), Some(8 * MI)));
}

#[test]
fn a_warm_backend_whose_leader_rolls_or_does_not_serve_drains_and_replaces_no_member() {
    let mut f = Fixture::new();
    f.leader_unsettled = true;
    f.member("m-b").leaving = Some(Leaving::Cordoned);
    let steps = f.steps();
    assert_eq!(
        steps[0].step,
        Step::Wait {
            until: Until::Leader,
            next: Some(Next {
                pod: "m-a".into(),
                node: "node-m-a".into(),
                drained: Ok(()),
            }),
        }
    );
    assert!(
        steps[0].step.polls_store(),
        "the master is asked again soon"
    );
    assert!(steps[0].held.is_empty());
    // Settled: the rollout goes on, the leaving member first.
    f.leader_unsettled = false;
    assert_eq!(f.step(), start_of("m-b", &["10.0.0.1"], 4 * MI));
    // Nothing to do: nothing waited for.
    let mut f = Fixture::new();
    f.rendered = vec!["old".into()];
    f.leader_unsettled = true;
    assert_eq!(f.step(), Step::UpToDate);
}
