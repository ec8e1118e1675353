//! Whether a master serves, asked every [`EVERY`] in two ways. Through the leader Service as a
//! client finds it ([`Target::Service`]): a GET of the master's `/health` through the API
//! server's Service proxy (`/api/v1/namespaces/<ns>/services/<backend>-leader:admin/proxy/health`),
//! which the API server sends to a Ready endpoint of the Service (the serving master's Pod;
//! standbys are not Ready). And Pod by Pod ([`Target::Pods`]): every leader Pod's `/health`
//! through the Pod proxy, the masters' own word. A probe is answered when a GET returns within
//! [`ASK`] a body whose `service_ready` is true (`kvcache_render::observe::store::Health`, the
//! operator's own reading). The longest time no master served is read from the probes
//! afterwards ([`outage`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kvcache_e2e::{Error, pods};
use kvcache_render::objects::backend::ADMIN_PORT;
use kvcache_render::observe::store::Health;

/// How often a probe starts (one at a time: a slow one delays the next).
pub(super) const EVERY: Duration = Duration::from_millis(200);
/// How long one probe may take before it counts as unanswered.
const ASK: Duration = Duration::from_secs(2);
/// How long one Pod's answer may take within a probe of every Pod.
const ASK_POD: Duration = Duration::from_millis(1500);

/// One probe: when it started, and why it went unanswered (`None`: a serving master
/// answered).
#[derive(Clone, Debug)]
struct Sample {
    at: Instant,
    unanswered: Option<String>,
}

/// A running probe of one backend's leader Service; stopped when dropped.
pub(super) struct Probe {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a probe asks.
#[derive(Clone, Debug)]
pub(super) enum Target {
    /// The leader Service `name` in `namespace`: what a client dials.
    Service { namespace: String, name: String },
    /// Every Pod `selector` picks in `namespace` (terminating ones too), each on its own
    /// address through the API server's Pod proxy: answered when one reports `service_ready`
    /// (the masters' own word, whether or not the Service sends clients to it).
    Pods { namespace: String, selector: String },
}

impl Probe {
    /// Starts probing `target`.
    pub(super) fn start(client: kube::Client, target: Target) -> Probe {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let shared = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let at = Instant::now();
                let asked = match &target {
                    Target::Service { namespace, name } => {
                        let path = format!(
                            "/api/v1/namespaces/{namespace}/services/{name}:admin/proxy/health"
                        );
                        tokio::time::timeout(ASK, ask(&client, &path)).await
                    }
                    Target::Pods {
                        namespace,
                        selector,
                    } => tokio::time::timeout(ASK, ask_pods(&client, namespace, selector)).await,
                };
                let unanswered = match asked {
                    Ok(Ok(())) => None,
                    Ok(Err(why)) => Some(why),
                    Err(_) => Some(format!("no answer within {ASK:?}")),
                };
                shared
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Sample { at, unanswered });
            }
        });
        Probe { samples, task }
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until a probe was answered (the probe itself works before the change starts).
    pub(super) async fn answered(&self, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tick.tick().await;
            let seen = self.samples();
            if seen.iter().any(|s| s.unanswered.is_none()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Wait {
                    what: format!(
                        "a serving master answering /health through the leader Service (within {within:?})"
                    ),
                    reason: format!("{} probes, none answered", seen.len()),
                });
            }
        }
    }

    /// The outage seen from `from` (the edit) to now.
    pub(super) fn outage(&self, from: Instant) -> Outage {
        let now = Instant::now();
        let seen = self.samples();
        let samples: Vec<(Duration, bool)> = seen
            .iter()
            .map(|s| (signed(s.at, from), s.unanswered.is_none()))
            .collect();
        let mut o = outage(&samples, signed(now, from));
        for why in seen
            .iter()
            .filter(|s| s.at > from)
            .filter_map(|s| s.unanswered.clone())
        {
            *o.reasons.entry(why).or_default() += 1;
        }
        o
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `at - from`, zero when `at` came first (a probe before the edit sits at zero).
fn signed(at: Instant, from: Instant) -> Duration {
    at.saturating_duration_since(from)
}

/// One probe: answered by a serving master, or why not (the API server's error, such as no
/// Ready endpoint; an unreadable body; `service_ready` false).
async fn ask(client: &kube::Client, path: &str) -> Result<(), String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let body = client
        .request_text(req)
        .await
        .map_err(|e| short(&e.to_string()))?;
    let health = Health::parse(path, &body).map_err(|e| short(&e.to_string()))?;
    if health.service_ready {
        Ok(())
    } else {
        Err(format!(
            "service_ready false (role {:?}, ha_state {:?})",
            health.role, health.ha_state
        ))
    }
}

/// Every Pod `selector` picks, asked at once, each within [`ASK_POD`]: answered when one
/// reports `service_ready`, else each Pod's reason (sorted, without Pod names, so that equal
/// moments count together).
async fn ask_pods(client: &kube::Client, namespace: &str, selector: &str) -> Result<(), String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| short(&e.to_string()))?;
    let asks = listed.iter().map(|p| async move {
        let read = tokio::time::timeout(
            ASK_POD,
            pods::proxy_get(
                client,
                namespace,
                pods::name_of(p),
                ADMIN_PORT as u16,
                "health",
            ),
        )
        .await;
        match read {
            Err(_) => Err(format!("no answer within {ASK_POD:?}")),
            Ok(Err(e)) => Err(short(&e.to_string())),
            Ok(Ok(body)) => match Health::parse("health", &body) {
                Ok(h) if h.service_ready => Ok(()),
                Ok(h) => Err(format!("service_ready false (role {:?})", h.role)),
                Err(e) => Err(short(&e.to_string())),
            },
        }
    });
    let answers = futures::future::join_all(asks).await;
    if answers.iter().any(Result::is_ok) {
        return Ok(());
    }
    let mut why: Vec<String> = answers.into_iter().filter_map(Result::err).collect();
    why.sort();
    Err(format!("{} Pods: {}", why.len(), why.join(", ")))
}

/// A reason cut to its first 100 characters (an API server's error may quote a whole page).
fn short(text: &str) -> String {
    text.chars().take(100).collect()
}

/// What the probes of one change saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Outage {
    /// Probes started after the edit.
    pub(super) probes: usize,
    /// Of those, unanswered.
    pub(super) unanswered: usize,
    /// The longest time no master served: from the start of the last probe answered before a
    /// run of unanswered ones (the edit, when none was answered after it yet) to the start of
    /// the first answered after them (the end of the window, when none was). Zero when every
    /// probe was answered.
    pub(super) longest: Duration,
    /// The longest time between two probes' starts: the figure's resolution.
    pub(super) spacing: Duration,
    /// Whether the window ended in a run of unanswered probes.
    pub(super) open_at_end: bool,
    /// Why probes went unanswered, with how many each.
    pub(super) reasons: BTreeMap<String, usize>,
}

/// Reads the probes `(time since the edit, answered)`, in order, over a window that ends at
/// `end` (since the edit); probes at zero started at or before the edit.
fn outage(samples: &[(Duration, bool)], end: Duration) -> Outage {
    let after: Vec<(Duration, bool)> = samples
        .iter()
        .copied()
        .filter(|(at, _)| !at.is_zero())
        .collect();
    let mut last_served = Duration::ZERO;
    let mut failing = false;
    let mut longest = Duration::ZERO;
    for &(at, served) in &after {
        if served {
            if failing {
                longest = longest.max(at - last_served);
            }
            last_served = at;
            failing = false;
        } else {
            failing = true;
        }
    }
    if failing {
        longest = longest.max(end.saturating_sub(last_served));
    }
    let spacing = after
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or_default();
    Outage {
        probes: after.len(),
        unanswered: after.iter().filter(|(_, s)| !s).count(),
        longest,
        spacing,
        open_at_end: failing,
        reasons: BTreeMap::new(),
    }
}

impl Outage {
    /// The table's cell.
    pub(super) fn cell(&self) -> String {
        if self.unanswered == 0 {
            return format!(
                "0 s (all {} probes answered, at most {:.1} s apart)",
                self.probes,
                self.spacing.as_secs_f64()
            );
        }
        format!(
            "{:.1} s ({} of {} probes unanswered{})",
            self.longest.as_secs_f64(),
            self.unanswered,
            self.probes,
            if self.open_at_end {
                ", still none at the end"
            } else {
                ""
            }
        )
    }

    /// Why probes went unanswered, for the notes (empty when none was).
    pub(super) fn why(&self) -> String {
        self.reasons
            .iter()
            .map(|(why, n)| format!("{n} x {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn every_probe_answered_is_no_outage() {
        let o = outage(&[(s(0), true), (s(200), true), (s(450), true)], s(500));
        assert_eq!(o.longest, Duration::ZERO);
        assert_eq!((o.probes, o.unanswered, o.spacing), (2, 0, s(250)));
    }

    #[test]
    fn an_outage_runs_from_the_last_answer_to_the_next() {
        let o = outage(
            &[
                (s(200), true),
                (s(400), false),
                (s(2400), false),
                (s(2600), true),
                (s(2800), false),
                (s(3000), true),
            ],
            s(3100),
        );
        assert_eq!(o.longest, s(2400));
        assert_eq!(o.unanswered, 3);
        assert!(!o.open_at_end);
    }

    #[test]
    fn an_outage_from_the_edit_and_one_still_open_count() {
        let from_edit = outage(&[(s(0), true), (s(300), false), (s(900), true)], s(1000));
        assert_eq!(from_edit.longest, s(900));
        let open = outage(&[(s(100), true), (s(300), false)], s(5100));
        assert_eq!(open.longest, s(5000));
        assert!(open.open_at_end);
    }
}
