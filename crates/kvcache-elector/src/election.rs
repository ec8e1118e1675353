//! The election state machine: when to acquire, renew and step down, decided from what was
//! observed of the Lease and the local monotonic clock. No I/O, so it is tested with a fake clock.
//!
//! Safety argument: a standby takes over only after it has seen the Lease unchanged for a full
//! `lease_duration` on its own clock; the leader stops its master once it has failed to renew for
//! `renew_deadline`, which is shorter. The old master is therefore gone at least
//! `lease_duration - renew_deadline` (less one bounded Lease call, [`Election::call_budget`])
//! before a new one can start, whatever the clocks of the two machines say (only durations on
//! each machine's own monotonic clock are compared).
//!
//! A pause is not a loss. A node that stalls, or an elector starved of CPU by engines prefilling
//! on every core, wakes past its deadlines without having seen anything. The leader then makes
//! one renewal before it stops: the write carries the resourceVersion of its last renewal, so the
//! API server accepts it only if no standby wrote the Lease meanwhile, which is the only way a
//! standby can lead. It keeps its master, and its keys, when the write succeeds and stops at once
//! when it fails. A standby that did not run for longer than the renew deadline has not watched
//! the Lease over that time, so it watches again for a full `lease_duration` before it takes over
//! (otherwise, after a stall of the whole node, it would race the leader it never saw renew).
use std::time::{Duration, Instant};

/// The Lease as the elector sees it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// The current holder; `None` or empty when released.
    pub holder: Option<String>,
    /// The holder's published store address (`host:port`).
    pub address: Option<String>,
    /// Lease duration in seconds, as written by the holder.
    pub duration_seconds: Option<i32>,
    /// Times the Lease changed hands.
    pub transitions: i32,
    /// The holder's last renew time, as RFC 3339 (opaque here: only its changes are compared).
    pub renew_time: Option<String>,
    /// The object's resourceVersion, for optimistic concurrency.
    pub resource_version: Option<String>,
}

impl LeaseRecord {
    /// The holder, if any (an empty string counts as none).
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// Timing of the election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease stays valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps serving without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is read and renewed.
    pub retry_period: Duration,
}

impl Timing {
    /// Half the margin between the renew deadline and the lease duration: the longest the one
    /// renewal after a pause may take, and the shortest any call of a leader is given (see
    /// [`Election::call_budget`]).
    pub fn call_timeout(&self) -> Duration {
        self.lease_duration.saturating_sub(self.renew_deadline) / 2
    }

    /// Whether the three values leave the safety margin the election needs.
    pub fn check(&self) -> Result<(), TimingError> {
        if self.renew_deadline >= self.lease_duration {
            return Err(TimingError::DeadlineNotBelowDuration {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(TimingError::RetryNotBelowDeadline {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.lease_duration.as_secs() == 0 {
            return Err(TimingError::DurationBelowOneSecond);
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(TimingError::DurationTooLong {
                lease_duration: self.lease_duration,
            });
        }
        Ok(())
    }
}

/// Why a timing is unsafe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The old leader would still serve when a standby may take over.
    #[error(
        "renew deadline ({renew_deadline:?}) must be shorter than the lease duration ({lease_duration:?}): the old leader must stop before a standby may take over"
    )]
    DeadlineNotBelowDuration {
        /// `--renew-deadline`.
        renew_deadline: Duration,
        /// `--lease-duration`.
        lease_duration: Duration,
    },
    /// One missed renewal would stop the leader.
    #[error(
        "retry period ({retry_period:?}) must be shorter than the renew deadline ({renew_deadline:?}), or a single missed renewal stops the leader"
    )]
    RetryNotBelowDeadline {
        /// `--retry-period`.
        retry_period: Duration,
        /// `--renew-deadline`.
        renew_deadline: Duration,
    },
    /// The Lease counts whole seconds.
    #[error("lease duration must be at least one second (the Lease counts whole seconds)")]
    DurationBelowOneSecond,
    /// The Lease's seconds field is a 32-bit integer.
    #[error("lease duration ({lease_duration:?}) does not fit the Lease's leaseDurationSeconds")]
    DurationTooLong {
        /// `--lease-duration`.
        lease_duration: Duration,
    },
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing now.
    Wait,
    /// The Lease is free or expired: try to take it.
    Acquire,
    /// We lead: renew.
    Renew,
    /// We lead but have not renewed within the renew deadline (the API server failed us, or
    /// this elector was paused): one renewal, conditional on the Lease being as we last wrote
    /// it. Keep serving if it succeeds; stop the master at once if it fails
    /// ([`Election::must_step_down`]).
    RenewOrStepDown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Role {
    Standby,
    Leading { last_renew: Instant },
}

/// One elector's view of the election.
#[derive(Clone, Debug)]
pub struct Election {
    identity: String,
    timing: Timing,
    role: Role,
    observed: Option<LeaseRecord>,
    observed_at: Option<Instant>,
    /// When this elector last tried to read the Lease, successfully or not.
    last_pass: Option<Instant>,
}

impl Election {
    /// A standby with this identity.
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Election {
            identity: identity.into(),
            timing,
            role: Role::Standby,
            observed: None,
            observed_at: None,
            last_pass: None,
        }
    }

    /// This elector's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether this elector currently leads.
    pub fn leading(&self) -> bool {
        matches!(self.role, Role::Leading { .. })
    }

    /// The Lease as last observed.
    pub fn observed(&self) -> Option<&LeaseRecord> {
        self.observed.as_ref()
    }

    /// Records a read of the Lease (`None`: it does not exist). The observation time moves only
    /// when the holder or its renew time changed, which is what "unchanged for a lease duration"
    /// is measured from, or when this elector was paused (see [`Election::paused`]).
    pub fn observe(&mut self, record: Option<LeaseRecord>, now: Instant) {
        let changed = match (&self.observed, &record) {
            (Some(old), Some(new)) => old.holder != new.holder || old.renew_time != new.renew_time,
            (None, None) => false,
            _ => true,
        };
        if changed || self.observed_at.is_none() || self.paused(now) {
            self.observed_at = Some(now);
        }
        self.last_pass = Some(now);
        self.observed = record;
    }

    /// Records a read of the Lease that failed: this elector ran, but saw nothing.
    pub fn read_failed(&mut self, now: Instant) {
        self.last_pass = Some(now);
    }

    /// Whether this elector went longer than the renew deadline without trying to read the
    /// Lease: it was paused (a stalled node, a starved process), and cannot say the Lease stayed
    /// unchanged over that time.
    fn paused(&self, now: Instant) -> bool {
        self.last_pass
            .is_some_and(|p| now.saturating_duration_since(p) > self.timing.renew_deadline)
    }

    /// What to do at `now`.
    pub fn plan(&self, now: Instant) -> Plan {
        if self.leading() {
            if self.must_step_down(now) {
                return Plan::RenewOrStepDown;
            }
            return Plan::Renew;
        }
        let Some(record) = &self.observed else {
            // Never read (or absent): creating it is safe, the API server arbitrates.
            return Plan::Acquire;
        };
        match record.holder() {
            None => Plan::Acquire,
            Some(h) if h == self.identity => Plan::Acquire,
            Some(_) => {
                let seen = self.observed_at.unwrap_or(now);
                let held_for = record
                    .duration_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map_or(self.timing.lease_duration, Duration::from_secs)
                    .max(self.timing.lease_duration);
                if now.saturating_duration_since(seen) >= held_for {
                    Plan::Acquire
                } else {
                    Plan::Wait
                }
            }
        }
    }

    /// The record to write when acquiring or renewing: us as holder, our address, now.
    pub fn claim(&self, address: Option<&str>, renew_time: String, acquire: bool) -> LeaseRecord {
        let previous = self.observed.clone().unwrap_or_default();
        let changes_hands = previous.holder() != Some(self.identity.as_str());
        LeaseRecord {
            holder: Some(self.identity.clone()),
            address: address.map(str::to_owned),
            duration_seconds: i32::try_from(self.timing.lease_duration.as_secs()).ok(),
            transitions: previous.transitions
                + i32::from(acquire && changes_hands && previous.holder().is_some()),
            renew_time: Some(renew_time),
            resource_version: previous.resource_version,
        }
    }

    /// The write succeeded: we lead, renewed at `now`.
    pub fn wrote(&mut self, record: LeaseRecord, now: Instant) {
        self.role = Role::Leading { last_renew: now };
        self.observed = Some(record);
        self.observed_at = Some(now);
    }

    /// Whether a renewal that failed at `now` must stop the master: we lead and have not renewed
    /// within the renew deadline. Before it, a failed renewal is retried on the next pass.
    pub fn must_step_down(&self, now: Instant) -> bool {
        match self.role {
            Role::Leading { last_renew } => {
                now.saturating_duration_since(last_renew) >= self.timing.renew_deadline
            }
            Role::Standby => false,
        }
    }

    /// How long a Lease call started at `now` may take. A leader's call may run until half the
    /// margin past its renew deadline (a slow API server under load is given all that time, not
    /// cut early), but never less than half the margin: either way it has ended, and a failed
    /// renewal stopped the master, by `lease_duration` after the last renewal, before any standby
    /// may take over. A standby's call gets the renew deadline.
    pub fn call_budget(&self, now: Instant) -> Duration {
        let half_margin = self.timing.call_timeout();
        match self.role {
            Role::Leading { last_renew } => {
                let cutoff = last_renew + self.timing.renew_deadline + half_margin;
                cutoff.saturating_duration_since(now).max(half_margin)
            }
            Role::Standby => self.timing.renew_deadline,
        }
    }

    /// We no longer lead (lost the Lease, stepped down or released).
    pub fn stand_by(&mut self) {
        self.role = Role::Standby;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_secs(1),
    };

    /// Elector "a", which created the Lease at `start` and leads, and the record it wrote.
    fn leading_since(start: Instant) -> (Election, LeaseRecord) {
        let mut leader = Election::new("a", T);
        leader.observe(None, start);
        let rec = leader.claim(Some("127.0.0.1:1"), "t1".into(), true);
        leader.wrote(rec.clone(), start);
        (leader, rec)
    }

    fn held_by(who: &str, renew: &str) -> Option<LeaseRecord> {
        Some(LeaseRecord {
            holder: Some(who.into()),
            duration_seconds: Some(6),
            renew_time: Some(renew.into()),
            resource_version: Some("1".into()),
            ..Default::default()
        })
    }

    #[test]
    fn a_free_or_absent_lease_is_taken() {
        let start = Instant::now();
        let mut e = Election::new("a", T);
        assert_eq!(e.plan(start), Plan::Acquire);
        e.observe(Some(LeaseRecord::default()), start);
        assert_eq!(e.plan(start), Plan::Acquire, "released: no holder");
    }

    #[test]
    fn a_held_lease_is_taken_only_after_a_full_duration_unchanged() {
        let start = Instant::now();
        let mut e = Election::new("b", T);
        let at = |s: u64| start + Duration::from_secs(s);
        // Read once a second (the retry period).
        for s in 0..=5 {
            e.observe(held_by("a", "t1"), at(s));
        }
        assert_eq!(e.plan(at(5)), Plan::Wait);
        // A renewal resets the wait.
        for s in 5..=10 {
            e.observe(held_by("a", "t2"), at(s));
        }
        assert_eq!(e.plan(at(10)), Plan::Wait);
        // Unchanged for six seconds: expired, whatever the timestamps in it say.
        e.observe(held_by("a", "t2"), at(11));
        assert_eq!(e.plan(at(11)), Plan::Acquire);
    }

    #[test]
    fn the_leader_steps_down_before_anyone_may_take_over() {
        let start = Instant::now();
        let (mut leader, rec) = leading_since(start);
        assert!(leader.leading());
        assert_eq!(leader.plan(start + Duration::from_secs(1)), Plan::Renew);
        // The API server becomes unreachable: every read and renewal fails, each one only after
        // the longest a call may take.
        let mut standby = Election::new("b", T);
        standby.observe(Some(rec), start + Duration::from_millis(1));
        let mut t = start;
        let mut stepped_down = None;
        let mut took_over = None;
        while t < start + Duration::from_secs(20) {
            t += Duration::from_millis(100);
            if stepped_down.is_none() {
                leader.read_failed(t);
                let plan = leader.plan(t);
                assert!(matches!(plan, Plan::Renew | Plan::RenewOrStepDown));
                // The call hangs for all the time it is given.
                let failed_at = t + leader.call_budget(t);
                assert!(
                    failed_at <= start + T.lease_duration,
                    "a call ends by the lease duration"
                );
                if plan == Plan::RenewOrStepDown && leader.must_step_down(failed_at) {
                    leader.stand_by();
                    stepped_down = Some(failed_at);
                }
            }
            standby.observe(standby.observed().cloned(), t);
            if took_over.is_none() && standby.plan(t) == Plan::Acquire {
                took_over = Some(t);
            }
        }
        let (down, over) = (
            stepped_down.expect("steps down"),
            took_over.expect("takes over"),
        );
        assert!(
            over > down,
            "the old master stops before the new one may start"
        );
        assert!(
            over - down >= Duration::from_millis(900),
            "margin {:?}",
            over - down
        );
    }

    #[test]
    fn a_leader_paused_past_its_deadlines_keeps_leading_if_nobody_took_over() {
        let start = Instant::now();
        let (mut leader, rec) = leading_since(start);
        let mut standby = Election::new("b", T);
        standby.observe(Some(rec.clone()), start);
        // The whole node stalls for 16 s (seen in a suite run): nobody runs meanwhile.
        let after = start + Duration::from_secs(16);
        standby.observe(Some(rec.clone()), after);
        assert_eq!(
            standby.plan(after),
            Plan::Wait,
            "a paused standby has not watched the Lease for a lease duration"
        );
        leader.observe(Some(rec), after);
        assert_eq!(leader.plan(after), Plan::RenewOrStepDown);
        let renewed = leader.claim(Some("127.0.0.1:1"), "t2".into(), false);
        assert_eq!(
            renewed.resource_version.as_deref(),
            leader
                .observed()
                .and_then(|r| r.resource_version.as_deref()),
            "the renewal is conditional on the Lease as last seen"
        );
        leader.wrote(renewed.clone(), after);
        assert!(leader.leading());
        assert_eq!(leader.plan(after + Duration::from_secs(1)), Plan::Renew);
        // The standby sees the renewal and keeps waiting.
        standby.observe(Some(renewed), after + Duration::from_secs(1));
        assert_eq!(standby.plan(after + Duration::from_secs(6)), Plan::Wait);
        // Had the renewal failed, the master stops at once.
        assert!(leader.must_step_down(after + Duration::from_secs(5)));
    }

    #[test]
    fn a_leaders_calls_may_take_until_half_the_margin_past_the_deadline() {
        let start = Instant::now();
        let (leader, _) = leading_since(start);
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(leader.call_budget(at(1000)), Duration::from_secs(4));
        assert_eq!(leader.call_budget(at(4500)), Duration::from_millis(1000));
        // After a pause: the one late renewal gets half the margin.
        assert_eq!(leader.call_budget(at(16_000)), T.call_timeout());
        assert_eq!(Election::new("b", T).call_budget(at(0)), T.renew_deadline);
    }

    #[test]
    fn a_standby_that_ran_takes_over_after_one_duration_even_when_reads_failed() {
        let start = Instant::now();
        let mut standby = Election::new("b", T);
        standby.observe(held_by("a", "t1"), start);
        // Reads fail for a while (the API server restarting), but this elector kept running.
        let mut t = start;
        while t < start + Duration::from_secs(5) {
            t += Duration::from_secs(1);
            standby.read_failed(t);
        }
        standby.observe(held_by("a", "t1"), start + Duration::from_secs(6));
        assert_eq!(standby.plan(start + Duration::from_secs(6)), Plan::Acquire);
    }

    #[test]
    fn transitions_count_changes_of_hands() {
        let now = Instant::now();
        let mut e = Election::new("b", T);
        e.observe(held_by("a", "t1"), now);
        let rec = e.claim(None, "t2".into(), true);
        assert_eq!(rec.transitions, 1);
        assert_eq!(rec.resource_version.as_deref(), Some("1"));
        e.wrote(rec, now);
        assert_eq!(
            e.claim(None, "t3".into(), false).transitions,
            1,
            "a renewal is no transition"
        );
    }

    #[test]
    fn timing_is_checked() {
        assert!(T.check().is_ok());
        let bad = Timing {
            renew_deadline: Duration::from_secs(6),
            ..T
        };
        assert!(matches!(
            bad.check(),
            Err(TimingError::DeadlineNotBelowDuration { .. })
        ));
        assert!(
            bad.check()
                .expect_err("refused")
                .to_string()
                .contains("shorter than the lease duration")
        );
        let huge = Timing {
            lease_duration: Duration::from_secs(u64::from(u32::MAX)),
            renew_deadline: Duration::from_secs(4),
            retry_period: Duration::from_secs(1),
        };
        assert!(matches!(
            huge.check(),
            Err(TimingError::DurationTooLong { .. })
        ));
    }
}
