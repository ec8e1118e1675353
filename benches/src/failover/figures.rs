//! What a leader-loss round measures, the members' sizes, and how the figures print.

use std::time::Duration;

pub(super) const SEGMENT: u64 = 64 << 20;

/// The segment of the Service-addressed member with 1 s RPC timeouts (a size of its own, to tell
/// it apart in the master's capacity).
pub(super) const FAST_SEGMENT: u64 = 32 << 20;

pub(super) struct Sample {
    pub(super) serving: Duration,
    pub(super) full: Duration,
}

pub(crate) fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let median = v[v.len() / 2];
    (median, v[0], v[v.len() - 1])
}

pub(crate) fn fmt(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}
