//! The election state machine: when to acquire, renew and step down, decided from what was
//! observed of the Lease and the local monotonic clock. No I/O, so it is tested with a fake clock.
//!
//! Safety argument: a standby takes over only after it has seen the Lease unchanged for a full
//! `lease_duration` on its own clock; the leader stops its master once it has failed to renew for
//! `renew_deadline`, which is shorter. The old master is therefore gone at least
//! `lease_duration - renew_deadline` before a new one can start, whatever the clocks of the two
//! machines say (only durations on each machine's own monotonic clock are compared).

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
    /// We lead but have not renewed within the deadline: stop serving now.
    StepDown,
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
    /// is measured from.
    pub fn observe(&mut self, record: Option<LeaseRecord>, now: Instant) {
        let changed = match (&self.observed, &record) {
            (Some(old), Some(new)) => old.holder != new.holder || old.renew_time != new.renew_time,
            (None, None) => false,
            _ => true,
        };
        if changed || self.observed_at.is_none() {
            self.observed_at = Some(now);
        }
        self.observed = record;
    }

    /// What to do at `now`.
    pub fn plan(&self, now: Instant) -> Plan {
        if let Role::Leading { last_renew } = self.role {
            if now.saturating_duration_since(last_renew) >= self.timing.renew_deadline {
                return Plan::StepDown;
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
        e.observe(held_by("a", "t1"), start);
        assert_eq!(e.plan(start + Duration::from_secs(5)), Plan::Wait);
        // A renewal resets the wait.
        e.observe(held_by("a", "t2"), start + Duration::from_secs(5));
        assert_eq!(e.plan(start + Duration::from_secs(10)), Plan::Wait);
        // Unchanged for six seconds: expired, whatever the timestamps in it say.
        e.observe(held_by("a", "t2"), start + Duration::from_secs(10));
        assert_eq!(e.plan(start + Duration::from_secs(11)), Plan::Acquire);
    }

    #[test]
    fn the_leader_steps_down_before_anyone_may_take_over() {
        let start = Instant::now();
        let mut leader = Election::new("a", T);
        leader.observe(None, start);
        let rec = leader.claim(Some("127.0.0.1:1"), "t1".into(), true);
        leader.wrote(rec.clone(), start);
        assert!(leader.leading());
        assert_eq!(leader.plan(start + Duration::from_secs(1)), Plan::Renew);
        // The API server becomes unreachable: no renewal succeeds.
        let mut standby = Election::new("b", T);
        standby.observe(Some(rec), start + Duration::from_millis(1));
        let mut t = start;
        let mut stepped_down = None;
        let mut took_over = None;
        while t < start + Duration::from_secs(20) {
            t += Duration::from_millis(100);
            if stepped_down.is_none() && leader.plan(t) == Plan::StepDown {
                leader.stand_by();
                stepped_down = Some(t);
            }
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
            over - down >= Duration::from_millis(1900),
            "margin {:?}",
            over - down
        );
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
