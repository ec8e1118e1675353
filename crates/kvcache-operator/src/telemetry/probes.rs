//! What the liveness and readiness probes answer.

use std::sync::atomic::AtomicBool;

/// What `/healthz` and `/readyz` answer.
#[derive(Default)]
pub struct Readiness {
    /// The controllers' caches are synced.
    pub controllers: AtomicBool,
    /// The webhook serves (or none is asked for).
    pub webhook: AtomicBool,
    /// When the presented webhook certificate expires, seconds since the epoch (0: none
    /// presented).
    pub certificate_not_after: std::sync::atomic::AtomicI64,
    /// The loops that ended while the process runs on (the webhook listener, a controller):
    /// each fails the liveness probe, since nothing restarts them but a restart of the process.
    pub ended: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
}

/// The webhook listener's name among [`Readiness::ended`].
pub const WEBHOOK_LISTENER: &str = "the webhook listener";

impl Readiness {
    /// Records that `what` ended.
    pub fn ended(&self, what: &'static str) {
        self.ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(what);
    }

    pub(super) fn ended_now(&self) -> Vec<&'static str> {
        self.ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

/// Whether the replica is alive as its liveness probe asks: not when a loop that only a restart
/// brings back has ended (`ended`: the webhook listener, a controller), and not when the
/// webhook's presented certificate has expired (`not_after`, seconds since the epoch; 0 when
/// none is presented) at `now`, since then the API server refuses every request the webhook
/// guards and a restart makes the keeper start afresh.
pub fn health(not_after: i64, now: i64, ended: &[&str]) -> Result<(), String> {
    if !ended.is_empty() {
        return Err(format!(
            "{} ended: restart the replica",
            ended.join(" and ")
        ));
    }
    if not_after > 0 && now >= not_after {
        return Err(format!(
            "the webhook's serving certificate expired {} s ago and was not renewed",
            now - not_after
        ));
    }
    Ok(())
}

/// Whether the replica is ready as its readiness probe asks: its caches synced
/// (`controllers`), and the webhook serving: a certificate loaded and trusted (`webhook`) and
/// its listener not ended.
pub fn readiness(controllers: bool, webhook: bool, ended: &[&str]) -> Result<(), &'static str> {
    if !controllers {
        Err("caches not synced yet")
    } else if ended.contains(&WEBHOOK_LISTENER) {
        Err("the webhook listener ended")
    } else if !webhook {
        Err(
            "the webhook has no certificate loaded, or the webhook configurations do not trust it yet",
        )
    } else {
        Ok(())
    }
}
