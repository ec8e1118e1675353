//! Conditions as plain values, and the one merge that keeps `lastTransitionTime` unless the
//! status really changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition's `status` field: whether its `type` holds, or `Unknown` while the operator cannot
/// tell yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// `True`: the condition holds.
    True,
    /// `False`: the condition does not hold; its reason and message say why.
    False,
    /// `Unknown`: not observed yet, or what it depends on could not be read.
    Unknown,
}

impl Status {
    /// As Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition before it has a time: what the pure crates compute and the operator writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// CamelCase type, e.g. `QuotaGranted`.
    pub type_: &'static str,
    /// Whether `type_` holds (`True`/`False`), or `Unknown` when it could not be observed.
    pub status: Status,
    /// CamelCase reason a user can search for; always set.
    pub reason: &'static str,
    /// What it means and what to do, naming the object.
    pub message: String,
}

impl Cond {
    /// A condition with every field given; [`Cond::yes`] is the short form for `True`.
    pub fn new(
        type_: &'static str,
        status: Status,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Cond {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }

    /// `True` with a reason.
    pub fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Cond::new(type_, Status::True, reason, message)
    }

    /// `False` with a reason.
    pub fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Cond::new(type_, Status::False, reason, message)
    }

    /// `Unknown` with a reason.
    pub fn unknown(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Cond::new(type_, Status::Unknown, reason, message)
    }
}

/// Finds a condition by type.
pub fn find<'a>(conds: &'a [Cond], type_: &str) -> Option<&'a Cond> {
    conds.iter().find(|c| c.type_ == type_)
}

/// Merges freshly computed conditions into the stored ones: a condition whose status is unchanged
/// keeps its `lastTransitionTime`; the others get `now`. Types not computed this time are dropped.
pub fn merge(
    stored: &[Condition],
    computed: &[Cond],
    now: &Time,
    generation: Option<i64>,
) -> Vec<Condition> {
    computed
        .iter()
        .map(|c| {
            let previous = stored.iter().find(|s| s.type_ == c.type_);
            let last_transition_time = match previous {
                Some(p) if p.status == c.status.as_str() => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: c.type_.to_owned(),
                status: c.status.as_str().to_owned(),
                reason: c.reason.to_owned(),
                message: c.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("valid time"))
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let first = merge(&[], &[Cond::yes("Ready", "Fine", "ok")], &at(10), Some(1));
        assert_eq!(first[0].last_transition_time, at(10));
        let same = merge(
            &first,
            &[Cond::yes("Ready", "StillFine", "still ok")],
            &at(20),
            Some(2),
        );
        assert_eq!(
            same[0].last_transition_time,
            at(10),
            "same status keeps its time"
        );
        assert_eq!(same[0].reason, "StillFine");
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(
            &same,
            &[Cond::no("Ready", "Broken", "down")],
            &at(30),
            Some(2),
        );
        assert_eq!(flipped[0].last_transition_time, at(30));
    }
}
