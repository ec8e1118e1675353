//! `leader` mode: campaign, run the master only while holding the Lease, report readiness.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::Error;
use crate::child::StoreProcess;
use crate::election::{Election, Plan, Timing};
use crate::identity::LeaderIdentity;
use crate::lease::{LeaseClient, LeaseError};
use crate::ready::{self, Named, Readiness};

/// How a leader elector is configured.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// The Lease name (`<backend>-leader`).
    pub lease: String,
    /// Its namespace (the Pod's).
    pub namespace: String,
    /// This elector's identity (the Pod name).
    pub identity: String,
    /// The store address to publish on the Lease (`<pod IP>:50051`).
    pub address: Option<String>,
    /// Election timing.
    pub timing: Timing,
    /// The master's `/health` URL.
    pub child_health_url: String,
    /// Where `/readyz` and `/healthz` are served.
    pub ready_addr: SocketAddr,
    /// How long the master gets to exit on SIGTERM.
    pub stop_grace: Duration,
    /// The master's command line.
    pub command: Vec<String>,
}

/// `<program> --version`, read once before campaigning, so the operator can report the version
/// the running binary claims instead of trusting an image tag.
async fn master_version(program: &str) -> Option<String> {
    let run = tokio::process::Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .ok()?
        .ok()?;
    crate::version_from_banner(&format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Whether the master answers as a serving leader whose segments can be listed.
fn master_serves(agent: &ureq::Agent, health_url: &str) -> bool {
    let Ok(mut response) = agent.get(health_url).call() else {
        return false;
    };
    let Ok(body) = response.body_mut().read_to_string() else {
        return false;
    };
    let Ok(health) = serde_json::from_str::<serde_json::Value>(&body) else {
        return false;
    };
    if health["service_ready"] != true || health["role"] != "leader" {
        return false;
    }
    let segments = health_url.replace("/health", "/get_all_segments");
    agent.get(&segments).call().is_ok()
}

struct Campaign {
    config: LeaderConfig,
    lease: LeaseClient,
    election: Election,
    child: Option<StoreProcess>,
    ready: watch::Sender<Readiness>,
    /// Asks the master's `/health` (every 100 ms while a new master comes up): one client, its
    /// connections kept.
    health: ureq::Agent,
    /// What `/identity` says of leading.
    leading: watch::Sender<bool>,
    last_error: Option<String>,
}

impl Campaign {
    /// `/identity` follows the election: called wherever the role changes (`wrote`,
    /// `stand_by`).
    fn publish_leading(&self) {
        let now = self.election.leading();
        self.leading.send_if_modified(|old| {
            let changed = *old != now;
            *old = now;
            changed
        });
    }

    fn set_ready(&self, r: Readiness) {
        self.ready.send_if_modified(|old| {
            let changed = *old != r;
            *old = r;
            changed
        });
    }

    fn report(&mut self, e: &LeaseError) {
        let text = e.to_string();
        if self.last_error.as_deref() != Some(&text) {
            match e {
                LeaseError::Forbidden { .. } => error!(error = %text, "lease"),
                _ => warn!(error = %text, "lease"),
            }
            self.last_error = Some(text.clone());
        }
        if !self.election.leading() {
            self.set_ready(Readiness::not(format!("standby: {text}")));
        }
    }

    async fn lose(&mut self, why: &str) {
        if let Some(child) = self.child.take() {
            warn!(why, pid = ?child.pid(), "stopping the master at once");
            child.kill().await;
        }
        self.election.stand_by();
        self.publish_leading();
        self.set_ready(Readiness::not(format!("standby: {why}")));
    }

    async fn lead(&mut self) -> Result<(), Error> {
        let child =
            StoreProcess::start(&self.config.command, &[]).map_err(|source| Error::Spawn {
                program: self.config.command.first().cloned().unwrap_or_default(),
                source,
            })?;
        info!(pid = ?child.pid(), program = child.program(), "leading: master started");
        self.child = Some(child);
        self.set_ready(Readiness::not("leading: waiting for the master to serve"));
        Ok(())
    }

    async fn release(&mut self) {
        if !self.election.leading() {
            return;
        }
        let mut record = self.election.observed().cloned().unwrap_or_default();
        record.holder = Some(String::new());
        record.address = None;
        record.duration_seconds = Some(1);
        match self
            .lease
            .write(&record, false, self.config.timing.call_timeout())
            .await
        {
            Ok(_) => info!("Lease released"),
            Err(e) => {
                warn!(error = %e, "could not release the Lease; a standby takes over when it expires")
            }
        }
        self.election.stand_by();
        self.publish_leading();
    }

    /// One pass: read, decide, write. Returns an error only when the elector must exit.
    async fn step(&mut self) -> Result<(), Error> {
        let now = Instant::now();
        match self.lease.get(self.election.call_budget(now)).await {
            Ok(record) => {
                if let Some(r) = &record
                    && self.election.leading()
                    && r.holder() != Some(self.election.identity())
                {
                    self.election.observe(record, now);
                    self.lose("another elector holds the Lease").await;
                    return Ok(());
                }
                self.election.observe(record, now);
            }
            Err(e) => {
                self.election.read_failed(now);
                self.report(&e);
            }
        }
        match self.election.plan(now) {
            Plan::Wait => {
                let holder = self
                    .election
                    .observed()
                    .and_then(|r| r.holder().map(str::to_owned))
                    .unwrap_or_default();
                self.set_ready(Readiness::not(format!(
                    "standby: the Lease is held by {holder}"
                )));
            }
            plan @ (Plan::Acquire | Plan::Renew | Plan::RenewOrStepDown) => {
                let acquire = plan == Plan::Acquire;
                if plan == Plan::RenewOrStepDown {
                    warn!(
                        "no renewal within the renew deadline (the API server failed us, or this elector was paused): one conditional renewal before stopping the master"
                    );
                }
                let record = self.election.claim(
                    self.config.address.as_deref(),
                    Timestamp::now().to_string(),
                    acquire,
                );
                let budget = self.election.call_budget(Instant::now());
                match self.lease.write(&record, acquire, budget).await {
                    Ok(written) => {
                        self.last_error = None;
                        self.election.wrote(written, now);
                        // Members ask `/identity` as soon as they see the write.
                        self.publish_leading();
                        if acquire {
                            info!(identity = self.election.identity(), "acquired the Lease");
                        } else if plan == Plan::RenewOrStepDown {
                            info!(
                                "renewed after the deadline: no standby took the Lease; the master keeps serving"
                            );
                        }
                        if self.child.is_none() {
                            self.lead().await?;
                        }
                    }
                    Err(LeaseError::Conflict) if acquire => {}
                    Err(e) => {
                        // A renewal that failed: retried next pass while within the renew
                        // deadline (a conflict is re-read then); past it, the master stops now.
                        if !matches!(e, LeaseError::Conflict) {
                            self.report(&e);
                        }
                        if self.election.must_step_down(Instant::now()) {
                            self.lose("the Lease could not be renewed within the renew deadline")
                                .await;
                        }
                    }
                }
            }
        }
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.exited()
        {
            self.child = None;
            self.set_ready(Readiness::not("the master exited"));
            self.release().await;
            return Err(Error::ChildExited(status.to_string()));
        }
        self.check_master().await;
        Ok(())
    }

    /// While leading, readiness follows whether the master serves.
    async fn check_master(&mut self) {
        if !self.election.leading() || self.child.is_none() {
            return;
        }
        let url = self.config.child_health_url.clone();
        let agent = self.health.clone();
        let serving = tokio::task::spawn_blocking(move || master_serves(&agent, &url))
            .await
            .unwrap_or(false);
        self.set_ready(if serving {
            Readiness {
                ready: true,
                reason: format!("leading: the master serves ({})", self.election.identity()),
            }
        } else {
            Readiness::not("leading: waiting for the master to serve")
        });
    }
}

/// Runs a leader elector until SIGTERM (exit 0, Lease released) or the master's exit (error).
pub async fn run(config: LeaderConfig) -> Result<(), Error> {
    config.timing.check()?;
    if config.command.is_empty() {
        return Err(Error::NoCommand { role: "master" });
    }
    let client = kube::Client::try_default().await?;
    let version = master_version(&config.command[0]).await;
    match &version {
        Some(v) => info!(version = %v, "the master binary reports its version"),
        None => {
            warn!(program = %config.command[0], "the master binary did not report a version (--version); none is published")
        }
    }
    let lease =
        LeaseClient::new(client, &config.namespace, &config.lease).with_store_version(version);
    let (tx, rx) = watch::channel(Readiness::not("starting"));
    let (leading, leading_rx) = watch::channel(false);
    let addr = config.ready_addr;
    let named = Named {
        who: LeaderIdentity {
            lease: config.lease.clone(),
            namespace: config.namespace.clone(),
            identity: config.identity.clone(),
            leading: false,
        },
        leading: leading_rx,
    };
    let server = tokio::spawn(ready::serve(addr, rx, Some(named)));
    let mut campaign = Campaign {
        election: Election::new(config.identity.clone(), config.timing),
        config,
        lease,
        child: None,
        ready: tx,
        health: ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(800)))
            .max_redirects(0)
            .build()
            .into(),
        leading,
        last_error: None,
    };
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
    let mut tick = tokio::time::interval(campaign.config.timing.retry_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A new leader's master is usually serving within a fraction of a second: look more often
    // than the Lease is renewed until it is, so a handover is not padded by a retry period.
    let mut fast = tokio::time::interval(Duration::from_millis(100));
    fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        tokio::select! {
            _ = term.recv() => break Ok(()),
            _ = interrupt.recv() => break Ok(()),
            _ = fast.tick(), if campaign.election.leading() && !campaign.ready.borrow().ready => {
                campaign.check_master().await;
            }
            _ = tick.tick() => {
                if server.is_finished() {
                    break Err(Error::Serve { addr: addr.to_string(), source: std::io::Error::other("the readiness server stopped") });
                }
                if let Err(e) = campaign.step().await {
                    break Err(e);
                }
            }
        }
    };
    campaign.set_ready(Readiness::not("shutting down"));
    if let Some(child) = campaign.child.take() {
        child.stop(campaign.config.stop_grace).await;
    }
    campaign.release().await;
    server.abort();
    result
}
