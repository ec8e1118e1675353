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

/// Whether this turn asks the elector at the mounted master who it is: on the retry tick while
/// the member stays mounted. Not while the Lease names another address: the member moves
/// there this turn anyway, and the old address, often gone, would only cost the question's
/// timeout.
fn recheck_due(wanted: Option<&Target>, current: Option<&Target>, ticked: bool) -> bool {
    let moving = matches!((wanted, current), (Some(w), Some(c)) if w.address != c.address);
    ticked && !moving && current.is_some()
}

/// Who stops the mounted member, by a recheck's verdict: only a master that answers as another
/// backend's leader (an address freed by a failover and given to another backend). One that
/// does not answer, or answers as this backend's standby, is left to the Lease.
fn stopped_by(verdict: &Verdict) -> Option<&LeaderIdentity> {
    match verdict {
        Verdict::Foreign(who) => Some(who),
        Verdict::NotHolder(_) | Verdict::Ours | Verdict::Unverified => None,
    }
}

/// Where the member mounts this turn: the address the Lease publishes, when the member is not
/// mounted there (none mounted, or mounted at an old address). A released Lease (no holder)
/// publishes nothing and keeps the member where it is.
fn mount_toward<'a>(wanted: Option<&'a Target>, current: Option<&Target>) -> Option<&'a Target> {
    wanted.filter(|w| current.is_none_or(|c| c.address != w.address))
}

/// Whether a refusal to mount at `target` is news: each target and verdict is logged once,
/// and only the two refusals (a mount allowed is logged as the member starting).
fn newly_refused(target: &Target, verdict: &Verdict, logged: Option<&(Target, Verdict)>) -> bool {
    !verdict.may_mount() && logged != Some(&(target.clone(), verdict.clone()))
}

/// Logs a refusal to mount at `target` once per target and verdict.
fn refuse(target: &Target, verdict: &Verdict, logged: &mut Option<(Target, Verdict)>) {
    if !newly_refused(target, verdict, logged.as_ref()) {
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
    *logged = Some((target.clone(), verdict.clone()));
}

/// On the turns [`recheck_due`] names, asks the elector at the mounted master who it is, and
/// stops the member (remembering the refusal in `refused`) when that master now answers as
/// another backend's leader.
async fn recheck(
    agent: &ureq::Agent,
    config: &MemberConfig,
    wanted: Option<&Target>,
    current: &mut Option<(Target, StoreProcess)>,
    ticked: bool,
    refused: &mut Option<(Target, Verdict)>,
) {
    if recheck_due(wanted, current.as_ref().map(|(t, _)| t), ticked)
        && let Some((target, _)) = current.as_ref()
    {
        let verdict = verify(agent, config, target).await;
        if let Some(who) = stopped_by(&verdict)
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
            *refused = Some((target, verdict));
        }
    }
}

/// The client that asks electors `/identity` (1 s to connect and to answer; any status is an
/// answer).
fn identity_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(1)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// Starts the member command with its master address (`target`) in `config.master_env`.
fn start_member(config: &MemberConfig, target: &Target) -> Result<StoreProcess, Error> {
    StoreProcess::start(
        &config.command,
        &[(config.master_env.clone(), target.address.clone())],
    )
    .map_err(|source| Error::Spawn {
        program: config.command.first().cloned().unwrap_or_default(),
        source,
    })
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
    let agent = identity_agent();
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
        // A member stays only on its own backend's master.
        recheck(
            &agent,
            &config,
            wanted.as_ref(),
            &mut current,
            ticked,
            &mut refused,
        )
        .await;
        let Some(target) = mount_toward(wanted.as_ref(), current.as_ref().map(|(t, _)| t)).cloned()
        else {
            continue;
        };
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
        let child = start_member(&config, &target)?;
        let verified = verdict == Verdict::Ours;
        info!(master = %target.address, holder = %target.holder, verified, pid = ?child.pid(), "member started");
        current = Some((target, child));
    };
    if let Some((_, child)) = current.take() {
        child.stop(config.stop_grace).await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(address: &str, holder: &str) -> Target {
        Target {
            address: address.into(),
            holder: holder.into(),
        }
    }

    fn who(lease: &str, identity: &str, leading: bool) -> LeaderIdentity {
        LeaderIdentity {
            lease: lease.into(),
            namespace: "gpustack-system".into(),
            identity: identity.into(),
            leading,
        }
    }

    #[test]
    fn the_mounted_master_is_asked_each_tick_while_the_member_stays_and_never_while_it_moves() {
        let a = at("10.0.0.5:50051", "leader-a");
        let b = at("10.0.0.9:50051", "leader-b");
        assert!(recheck_due(Some(&a), Some(&a), true), "staying: asked");
        assert!(
            !recheck_due(Some(&a), Some(&a), false),
            "not on a Lease event"
        );
        assert!(
            !recheck_due(Some(&b), Some(&a), true),
            "moving to b: not asked"
        );
        assert!(
            recheck_due(None, Some(&a), true),
            "a released Lease: still asked"
        );
        assert!(
            !recheck_due(Some(&a), None, true),
            "nothing mounted: nothing to ask"
        );
    }

    #[test]
    fn only_another_backends_leader_stops_a_mounted_member() {
        let other = who("other-leader", "x", true);
        assert_eq!(stopped_by(&Verdict::Foreign(other.clone())), Some(&other));
        assert_eq!(
            stopped_by(&Verdict::NotHolder(who("ours-leader", "y", false))),
            None
        );
        assert_eq!(stopped_by(&Verdict::Unverified), None);
        assert_eq!(stopped_by(&Verdict::Ours), None);
    }

    #[test]
    fn the_member_mounts_where_the_lease_points_unless_it_is_there() {
        let a = at("10.0.0.5:50051", "leader-a");
        let b = at("10.0.0.9:50051", "leader-b");
        assert_eq!(mount_toward(Some(&a), None), Some(&a));
        assert_eq!(mount_toward(Some(&b), Some(&a)), Some(&b));
        assert_eq!(mount_toward(Some(&a), Some(&a)), None);
        // A new holder at the same address (a restart in place) keeps the member.
        assert_eq!(
            mount_toward(Some(&at("10.0.0.5:50051", "leader-a2")), Some(&a)),
            None
        );
        assert_eq!(mount_toward(None, Some(&a)), None, "a released Lease");
        assert_eq!(mount_toward(None, None), None);
    }

    #[test]
    fn each_refusal_is_logged_once_per_target_and_verdict() {
        let a = at("10.0.0.5:50051", "leader-a");
        let foreign = Verdict::Foreign(who("other-leader", "x", true));
        let standby = Verdict::NotHolder(who("ours-leader", "y", false));
        assert!(newly_refused(&a, &foreign, None));
        assert!(!newly_refused(
            &a,
            &foreign,
            Some(&(a.clone(), foreign.clone()))
        ));
        assert!(newly_refused(
            &a,
            &standby,
            Some(&(a.clone(), foreign.clone()))
        ));
        let b = at("10.0.0.9:50051", "leader-b");
        assert!(newly_refused(
            &b,
            &foreign,
            Some(&(a.clone(), foreign.clone()))
        ));
        assert!(
            !newly_refused(&a, &Verdict::Ours, None),
            "a mount is no refusal"
        );
        assert!(!newly_refused(&a, &Verdict::Unverified, None));
    }
}
