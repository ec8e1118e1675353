//! `member` mode: follow the Lease holder and keep the member pointed at it.
//!
//! The member watches the one Lease (a watch with a `metadata.name` field selector, which RBAC
//! can pin to that name), so a new holder's address arrives as an event rather than on the next
//! poll.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::Error;
use crate::child::StoreProcess;
use crate::lease::{LeaseClient, to_record};

/// How a member elector is configured.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// The Lease name (`<backend>-leader`).
    pub lease: String,
    /// The Lease's namespace (the Pod's own).
    pub namespace: String,
    /// How often the member process is checked (a crashed member is restarted).
    pub retry_period: Duration,
    /// The variable the member reads its master address from.
    pub master_env: String,
    /// How long the member gets to unmount on a restart or SIGTERM.
    pub stop_grace: Duration,
    /// The member's command line.
    pub command: Vec<String>,
}

/// The address the Lease's holder publishes, if it has a holder.
fn holder_address(lease: &Lease) -> Option<String> {
    let record = to_record(lease);
    record
        .holder()
        .is_some()
        .then_some(record.address)
        .flatten()
}

/// Runs a member elector until SIGTERM.
pub async fn run(config: MemberConfig) -> Result<(), Error> {
    if config.command.is_empty() {
        return Err(Error::NoCommand { role: "member" });
    }
    let client = kube::Client::try_default().await?;
    let lease = LeaseClient::new(client, &config.namespace, &config.lease);
    let mut events = watcher(
        lease.api().clone(),
        watcher::Config::default().fields(&format!("metadata.name={}", lease.name())),
    )
    .default_backoff()
    .boxed();
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
    let mut check = tokio::time::interval(config.retry_period);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wanted: Option<String> = None;
    let mut current: Option<(String, StoreProcess)> = None;
    let mut last_error: Option<String> = None;
    let result = loop {
        tokio::select! {
            _ = term.recv() => break Ok(()),
            _ = interrupt.recv() => break Ok(()),
            event = events.next() => match event {
                None => break Err(Error::WatchEnded { lease: config.lease.clone() }),
                Some(Err(e)) => {
                    let text = e.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        warn!(error = %text, "cannot watch the Lease; the member keeps its current master");
                        last_error = Some(text);
                    }
                    continue;
                }
                Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => {
                    last_error = None;
                    // A released Lease (no holder) keeps the member where it is until the next
                    // holder publishes its address.
                    if let Some(address) = holder_address(&l) {
                        wanted = Some(address);
                    }
                }
                Some(Ok(_)) => continue,
            },
            _ = check.tick() => {}
        }
        // A crashed member is restarted toward the current holder.
        if let Some((_, child)) = current.as_mut()
            && let Some(status) = child.exited()
        {
            warn!(%status, "the member exited; restarting it");
            current = None;
        }
        let Some(address) = wanted.clone() else {
            continue;
        };
        if current.as_ref().is_some_and(|(a, _)| *a == address) {
            continue;
        }
        if let Some((old, child)) = current.take() {
            // The old master is gone (it lost the Lease), so there is nothing to unmount from:
            // a quick kill lets the member mount on the new leader at once.
            info!(from = %old, to = %address, "the leader moved; restarting the member toward it");
            child.kill().await;
        }
        let child = StoreProcess::start(
            &config.command,
            &[(config.master_env.clone(), address.clone())],
        )
        .map_err(|source| Error::Spawn {
            program: config.command.first().cloned().unwrap_or_default(),
            source,
        })?;
        info!(master = %address, pid = ?child.pid(), "member started");
        current = Some((address, child));
    };
    if let Some((_, child)) = current.take() {
        child.stop(config.stop_grace).await;
    }
    result
}
