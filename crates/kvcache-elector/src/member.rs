//! `member` mode: follow the Lease holder and keep the member pointed at it.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::Error;
use crate::child::StoreProcess;
use crate::lease::LeaseClient;

/// How a member elector is configured.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// The Lease name (`<backend>-leader`).
    pub lease: String,
    /// Its namespace.
    pub namespace: String,
    /// How often the Lease is read.
    pub retry_period: Duration,
    /// The variable the member reads its master address from.
    pub master_env: String,
    /// How long the member gets to unmount on a restart or SIGTERM.
    pub stop_grace: Duration,
    /// The member's command line.
    pub command: Vec<String>,
}

/// Runs a member elector until SIGTERM.
pub async fn run(config: MemberConfig) -> Result<(), Error> {
    if config.command.is_empty() {
        return Err(Error::Config("no member command after --".into()));
    }
    let client = kube::Client::try_default().await?;
    let lease = LeaseClient::new(client, &config.namespace, &config.lease);
    let mut term = signal(SignalKind::terminate()).map_err(|e| Error::Config(e.to_string()))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| Error::Config(e.to_string()))?;
    let mut tick = tokio::time::interval(config.retry_period);
    let mut current: Option<(String, StoreProcess)> = None;
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = interrupt.recv() => break,
            _ = tick.tick() => {}
        }
        let address = match lease.get().await {
            Ok(record) => {
                last_error = None;
                record.and_then(|r| {
                    if r.holder().is_some() {
                        r.address
                    } else {
                        None
                    }
                })
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    warn!(error = %text, "cannot read the Lease; the member keeps its current master");
                    last_error = Some(text);
                }
                continue;
            }
        };
        // A crashed member is restarted toward the current holder.
        if let Some((_, child)) = current.as_mut()
            && let Some(status) = child.exited()
        {
            warn!(%status, "the member exited; restarting it");
            current = None;
        }
        let Some(address) = address else { continue };
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
    }
    if let Some((_, child)) = current.take() {
        child.stop(config.stop_grace).await;
    }
    Ok(())
}
