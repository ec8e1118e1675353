//! The operator's own leader election: the webhooks and metrics serve on every replica, the
//! controllers only on the one holding the Lease (`--leader-elect`). Campaigns go through
//! `kube-lease-manager`; a watch on the Lease starts a new campaign the moment a leader
//! releases it on SIGTERM (the crate's standby would only retry when the Lease it last saw
//! expires).
//!
//! Only a campaign that leads ever releases. The crate's release also clears a Lease whose
//! state it last read as expired or holderless, with no precondition on what the Lease holds
//! now; a standby that released on withdrawing (at start every replica sees the new Lease
//! holderless) cleared the Lease another replica had acquired a few milliseconds before, then
//! took it itself: two replicas led until the first one's next renewal (seen on real nodes:
//! `tests/tests/install/main.rs`, the first leader's bootstrap writes).

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::error::Error;

/// Which Lease to campaign for, and as whom.
#[derive(Clone)]
pub struct Candidate {
    pub client: kube::Client,
    pub namespace: String,
    pub lease: String,
    /// Seconds the Lease holds without renewal.
    pub duration: u64,
    /// The Pod's name and a suffix of this process's own: a container restarted in the same
    /// Pod is a new candidate, not the holder it replaced (whose term runs out).
    pub identity: String,
}

/// A campaign in progress: whether it leads, and the task renewing (or waiting for) the Lease.
struct Campaign {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
}

impl Candidate {
    async fn campaign(&self) -> Result<Campaign, Error> {
        let manager = LeaseManagerBuilder::new(self.client.clone(), &self.lease)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.duration)
            .with_grace(renew_grace(self.duration))
            // One field manager per candidate: acquiring is a server-side apply without force,
            // so a second candidate's apply on a held Lease conflicts (409) instead of silently
            // taking it. A field manager shared by the replicas let both believe they had
            // acquired after a Lease expired (seen on real nodes: two replicas reconciling
            // after a kill -9).
            .with_field_manager(format!("kvcache-operator-election-{}", self.identity))
            .build()
            .await?;
        let (leading, task) = manager.watch().await;
        Ok(Campaign { leading, task })
    }

    /// Stands by until this replica leads (`Some`) or `shutdown` resolves first (`None`, the
    /// campaign withdrawn).
    pub async fn stand_by(
        &self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Option<Leadership>, Error> {
        let mut campaign = self.campaign().await?;
        info!(identity = %self.identity, lease = %self.lease, "standing by for the operator's Lease");
        let released = watcher(
            Api::<Lease>::namespaced(self.client.clone(), &self.namespace),
            watcher::Config::default().fields(&format!("metadata.name={}", self.lease)),
        )
        .default_backoff()
        .applied_objects()
        .filter_map(|l| futures::future::ready(l.ok().filter(holderless)));
        futures::pin_mut!(released);
        futures::pin_mut!(shutdown);
        loop {
            if *campaign.leading.borrow_and_update() {
                info!(identity = %self.identity, "leading: the controllers start");
                return Ok(Some(Leadership {
                    campaign,
                    lease: self.lease.clone(),
                }));
            }
            tokio::select! {
                changed = campaign.leading.changed() => if changed.is_err() {
                    return Err(Error::LeaseLost(self.lease.clone()));
                },
                Some(_) = released.next() => {
                    // A campaign of the same identity: had the old one just acquired, the new
                    // one finds itself the holder and renews.
                    campaign.abandon().await;
                    campaign = self.campaign().await?;
                }
                () = &mut shutdown => {
                    info!("stopping while standing by");
                    campaign.stand_down().await;
                    return Ok(None);
                }
            }
        }
    }
}

/// How long before its Lease expires the leader renews it (`kube-lease-manager`'s grace): two
/// thirds of the duration, so the leader renews every third of it (5 s of a 15 s Lease) and a
/// renewal can come 10 s late, or fail and be retried, before a standby may take over, as
/// client-go's 10 s renew deadline of a 15 s Lease allows. A third (renewing after 10 s, 5 s of
/// slack) lost the Lease during `cargo xtask demo` while two engines prefilled on the same
/// cores (its step 6 checks this).
fn renew_grace(duration: u64) -> u64 {
    (duration * 2 / 3).clamp(1, duration.saturating_sub(1).max(1))
}

/// Whether a Lease names no holder (released, or never taken).
fn holderless(l: &Lease) -> bool {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_none_or(str::is_empty)
}

impl Campaign {
    /// Stops a campaign that does not lead without touching the Lease (dropping it would make
    /// the crate release on a state that may be stale: see the module's comment).
    async fn abandon(self) {
        let Campaign { leading, task } = self;
        task.abort();
        // The receiver outlives the task: its drop is what makes the crate release.
        let _ = task.await;
        drop(leading);
    }

    /// Stops a campaign: released only when it leads (a standby that acquired in the instant
    /// before, unseen, leaves a Lease that expires, as a killed replica does).
    async fn stand_down(self) {
        if *self.leading.borrow() {
            self.withdraw().await;
        } else {
            self.abandon().await;
        }
    }

    /// Drops the campaign; a held Lease is released at once, so a standby takes over.
    async fn withdraw(self) {
        drop(self.leading);
        if let Ok(Err(e)) = self.task.await {
            warn!(error = %e, "releasing the operator's Lease");
        }
    }
}

/// The Lease, held.
pub struct Leadership {
    campaign: Campaign,
    lease: String,
}

impl Leadership {
    /// Runs `work` while the Lease is held, then releases it. Losing the Lease first stops
    /// `work` and is an error: the process exits to restart as a standby, as controller-runtime
    /// does.
    pub async fn lead(self, work: impl Future<Output = ()>) -> Result<(), Error> {
        let Leadership {
            mut campaign,
            lease,
        } = self;
        let still_leading = async {
            while campaign.leading.changed().await.is_ok() {
                if !*campaign.leading.borrow_and_update() {
                    break;
                }
            }
        };
        let lost = tokio::select! {
            () = work => false,
            () = still_leading => true,
        };
        // A lost Lease is someone else's now: only a campaign still leading releases.
        campaign.stand_down().await;
        if lost {
            return Err(Error::LeaseLost(lease));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::renew_grace;

    #[test]
    fn the_leader_renews_every_third_of_its_lease() {
        assert_eq!(renew_grace(15), 10);
        assert_eq!(renew_grace(30), 20);
        // The smallest Lease the CLI takes (2 s) still renews before it expires.
        assert_eq!(renew_grace(2), 1);
        assert_eq!(renew_grace(3), 2);
    }
}
