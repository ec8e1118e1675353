//! `member` mode: follow the Lease holder and keep the member pointed at it.
//!
//! The member watches the one Lease (a watch with a `metadata.name` field selector, which RBAC
//! can pin to that name), so a new holder's address arrives as an event rather than on the next
//! poll. Before it mounts at an address, and every retry period while it stays, it asks the
//! elector there who it is (`crate::identity`): a member never mounts on another backend's
//! master, and one whose master address now answers as another backend's leader is stopped.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::Error;
use crate::child::StoreProcess;
use crate::identity::{self, Answer, LeaderIdentity, Verdict};
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
    /// The port of the leader elector's readiness server, where it answers `/identity`.
    pub leader_identity_port: u16,
}

/// The master a member follows: the address the Lease publishes and the holder that
/// published it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    address: String,
    holder: String,
}

/// The address the Lease's holder publishes, with the holder, if it has one.
fn holder_target(lease: &Lease) -> Option<Target> {
    let record = to_record(lease);
    let holder = record.holder()?.to_owned();
    Some(Target {
        address: record.address?,
        holder,
    })
}

/// Asks the elector beside the master at `address` who it is, with `agent` (1 s to connect
/// and to answer).
async fn ask(agent: &ureq::Agent, address: &str, port: u16) -> Answer {
    let Some(url) = identity::url(address, port) else {
        return Answer::Nothing;
    };
    let agent = agent.clone();
    tokio::task::spawn_blocking(move || match agent.get(&url).call() {
        Ok(r) if r.status() == 404 => Answer::NoRoute,
        Ok(mut r) if r.status().is_success() => r
            .body_mut()
            .read_to_string()
            .ok()
            .and_then(|text| serde_json::from_str::<LeaderIdentity>(&text).ok())
            .map_or(Answer::Nothing, Answer::Named),
        _ => Answer::Nothing,
    })
    .await
    .unwrap_or(Answer::Nothing)
}

/// Whether the master at `target` is this backend's holder's.
async fn verify(agent: &ureq::Agent, config: &MemberConfig, target: &Target) -> Verdict {
    let answer = ask(agent, &target.address, config.leader_identity_port).await;
    identity::judge(&config.lease, &config.namespace, &target.holder, &answer)
}

/// Logs a refusal to mount at `target` once per target and verdict.
fn refuse(target: &Target, verdict: &Verdict, logged: &mut Option<(Target, Verdict)>) {
    let now = Some((target.clone(), verdict.clone()));
    if *logged == now {
        return;
    }
    match verdict {
        Verdict::Foreign(who) => warn!(
            master = %target.address,
            answered_lease = %format!("{}/{}", who.namespace, who.lease),
            answered_identity = %who.identity,
            "not mounting: the master at this address belongs to another backend (its elector campaigns for another Lease)"
        ),
        Verdict::NotHolder(who) => info!(
            master = %target.address,
            holder = %target.holder,
            answered_identity = %who.identity,
            leading = who.leading,
            "not mounting yet: the elector at this address is not the Lease holder"
        ),
        Verdict::Ours | Verdict::Unverified => return,
    }
    *logged = now;
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
    let mut wanted: Option<Target> = None;
    let mut current: Option<(Target, StoreProcess)> = None;
    let mut last_error: Option<String> = None;
    let mut refused: Option<(Target, Verdict)> = None;
    // One client for every `/identity` question (one a retry period while mounted).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(1)))
        .http_status_as_error(false)
        .build()
        .into();
    let result = loop {
        let ticked = tokio::select! {
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
                    if let Some(target) = holder_target(&l) {
                        wanted = Some(target);
                    }
                    false
                }
                Some(Ok(_)) => continue,
            },
            _ = check.tick() => true,
        };
        // A crashed member is restarted toward the current holder.
        if let Some((_, child)) = current.as_mut()
            && let Some(status) = child.exited()
        {
            warn!(%status, "the member exited; restarting it");
            current = None;
        }
        // A member stays only on its own backend's master: an address freed by a failover and
        // given to another backend's leader is left at once.
        // (Not while the Lease names another address: the member moves there below anyway,
        // and the old address, often gone, would only cost the check's timeout.)
        let moving = match (&wanted, &current) {
            (Some(w), Some((c, _))) => w.address != c.address,
            _ => false,
        };
        if ticked
            && !moving
            && let Some((target, _)) = current.as_ref()
        {
            let verdict = verify(&agent, &config, target).await;
            if let Verdict::Foreign(who) = &verdict
                && let Some((target, child)) = current.take()
            {
                warn!(
                    master = %target.address,
                    answered_lease = %format!("{}/{}", who.namespace, who.lease),
                    "stopping the member: the master at its address now belongs to another backend"
                );
                // That master is alive: the member unmounts from it rather than leave a dead
                // segment in its metadata.
                child.stop(config.stop_grace).await;
                refused = Some((target, verdict));
            }
        }
        let Some(target) = wanted.clone() else {
            continue;
        };
        if current
            .as_ref()
            .is_some_and(|(t, _)| t.address == target.address)
        {
            continue;
        }
        let verdict = verify(&agent, &config, &target).await;
        if !verdict.may_mount() {
            refuse(&target, &verdict, &mut refused);
            continue;
        }
        refused = None;
        if let Some((old, child)) = current.take() {
            // The old master is gone (it lost the Lease), so there is nothing to unmount from:
            // a quick kill lets the member mount on the new leader at once.
            info!(from = %old.address, to = %target.address, "the leader moved; restarting the member toward it");
            child.kill().await;
        }
        let child = StoreProcess::start(
            &config.command,
            &[(config.master_env.clone(), target.address.clone())],
        )
        .map_err(|source| Error::Spawn {
            program: config.command.first().cloned().unwrap_or_default(),
            source,
        })?;
        let verified = verdict == Verdict::Ours;
        info!(master = %target.address, holder = %target.holder, verified, pid = ?child.pid(), "member started");
        current = Some((target, child));
    };
    if let Some((_, child)) = current.take() {
        child.stop(config.stop_grace).await;
    }
    result
}
