//! Enforcement checked, not assumed (docs/isolation.md#enforcement-checked): after a backend's
//! NetworkPolicies change, a short-lived Pod in the operator's namespace, which no Binding
//! admits, dials the serving master's RPC port. Refused (or dropped) means something enforces
//! the policies; connected means nothing does. One Pod per backend per change of its
//! policies (keyed by their fingerprint, `policies_fingerprint`), deleted once its result is
//! read; the result is kept in `status.isolationProbe`.
//!
//! Pure: the operator lists the backend's probe Pods, calls [`decide`], creates or deletes
//! what it says and writes the record; [`Isolation`] is what `NetworkIsolated` is computed from.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, Pod, PodSpec, ResourceRequirements, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::{IsolationProbe, ProbeResult};

use super::pod::{
    RPC_PORT, owner, pull_policy, pull_secrets, restricted_container, restricted_pod,
};
use crate::names::{self, label_value};
use crate::observe::read::pod_ready;

/// On a probe Pod: the backend it probes for (its name as a label value). The backend's pass
/// lists its probe Pods by it, and the operator watches Pods that carry it.
pub const PROBE_LABEL: &str = "kvcache.gpustack.ai/isolation-probe";

/// On a probe Pod: the fingerprint of the policies it checks.
pub(crate) const POLICIES_ANNOTATION: &str = "kvcache.gpustack.ai/policies";

/// On a probe Pod: the address it dials (`<Pod IP>:50051`).
pub(crate) const TARGET_ANNOTATION: &str = "kvcache.gpustack.ai/probe-target";

/// The probe's exit code when it connected.
pub(crate) const EXIT_CONNECTED: i32 = 0;

/// The probe's exit code when the connection was refused, reset or timed out (distinct from
/// Python's 1 for an uncaught error and 2 for a usage error, which are no answer).
pub(crate) const EXIT_REFUSED: i32 = 3;

/// How long the probe waits for the connection: an enforcer that drops rather than rejects is
/// seen as a timeout.
pub(crate) const CONNECT_TIMEOUT_SECONDS: u32 = 5;

/// A probe Pod that has not ended this long after its creation (unschedulable, its image not
/// pulled) gives no answer: it is deleted and the result is `Inconclusive`.
pub(crate) const PROBE_DEADLINE: Duration = Duration::from_secs(120);

/// An `Inconclusive` result is tried again this long after it was read (one Pod each time).
pub(crate) const RETRY_INCONCLUSIVE: Duration = Duration::from_secs(300);

/// How soon to look again while a probe Pod runs (its end also wakes the backend: the
/// operator watches Pods labelled [`PROBE_LABEL`]).
pub(crate) const PROBE_POLL: Duration = Duration::from_secs(5);

/// The probe: Python from the store image, no store code. argv: host, port, timeout.
const SCRIPT: &str = r#"import socket, sys
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def end(code, message):
    try:
        with open("/dev/termination-log", "w") as f:
            f.write(message)
    except OSError:
        pass
    print(message)
    sys.exit(code)
try:
    socket.create_connection((host, port), timeout=timeout).close()
except socket.timeout:
    end(3, "no answer within %gs (dropped)" % timeout)
except OSError as e:
    end(3, "refused: %s" % (e.strerror or e))
end(0, "connected")
"#;

/// The fingerprint of a backend's NetworkPolicies as rendered (their names and specs, in
/// order): what a probe result is kept for. `None` when it renders none.
pub(crate) fn policies_fingerprint(policies: &[&NetworkPolicy]) -> Option<String> {
    if policies.is_empty() {
        return None;
    }
    let text: String = policies
        .iter()
        .map(|p| {
            format!(
                "{}\n{}\n",
                p.metadata.name.as_deref().unwrap_or_default(),
                serde_json::to_string(&p.spec).unwrap_or_default()
            )
        })
        .collect();
    Some(names::hash(&text, 16))
}

/// What to dial: the ready leader Pod's RPC address (the serving master: standbys are not
/// ready), the first by name when several are; `None` while none is ready.
pub fn target(backend: &str, store_pods: &[Pod]) -> Option<String> {
    let instance = label_value(backend);
    let mut ready: Vec<(&str, &str)> = store_pods
        .iter()
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
            label("app.kubernetes.io/instance") == Some(instance.as_str())
                && label("app.kubernetes.io/component") == Some("leader")
                && p.metadata.deletion_timestamp.is_none()
                && pod_ready(p)
        })
        .filter_map(|p| {
            Some((
                p.metadata.name.as_deref()?,
                p.status.as_ref()?.pod_ip.as_deref()?,
            ))
        })
        .collect();
    ready.sort();
    ready.first().map(|(_, ip)| format!("{ip}:{RPC_PORT}"))
}

/// A probe Pod as the operator listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePod {
    /// Its name.
    pub name: String,
    /// The fingerprint it checks (`POLICIES_ANNOTATION`).
    pub policies: String,
    /// What it dials (`TARGET_ANNOTATION`).
    pub target: String,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// Being deleted.
    pub deleting: bool,
    /// How it ended, if it did.
    pub outcome: Outcome,
}

/// Where a probe Pod stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not ended yet.
    Running,
    /// Its container ended with this exit code and termination message.
    Exited {
        /// The exit code.
        code: i32,
        /// The termination message (what the probe printed).
        message: String,
    },
    /// The Pod failed without its container ending (evicted, past its deadline), and why.
    Failed(String),
}

/// Reads a listed probe Pod.
pub(crate) fn read_probe_pod(p: &Pod) -> ProbePod {
    let annotation = |k: &str| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .cloned()
            .unwrap_or_default()
    };
    let status = p.status.clone().unwrap_or_default();
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.clone());
    let outcome = match (terminated, status.phase.as_deref()) {
        (Some(t), _) => Outcome::Exited {
            code: t.exit_code,
            message: t.message.or(t.reason).unwrap_or_default().trim().to_owned(),
        },
        (None, Some("Failed")) => Outcome::Failed(
            status
                .message
                .or(status.reason)
                .unwrap_or_else(|| "the Pod failed".into()),
        ),
        _ => Outcome::Running,
    };
    ProbePod {
        name: p.metadata.name.clone().unwrap_or_default(),
        policies: annotation(POLICIES_ANNOTATION),
        target: annotation(TARGET_ANNOTATION),
        created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleting: p.metadata.deletion_timestamp.is_some(),
        outcome,
    }
}

/// What one pass knows to decide the probe.
#[derive(Clone, Debug)]
pub struct ProbeInput<'a> {
    /// Whether the operator probes (`--isolation-probe`, on by default).
    pub enabled: bool,
    /// The backend.
    pub backend: &'a KVCacheBackend,
    /// The operator's namespace, where the probe runs.
    pub namespace: &'a str,
    /// The namespaces the backend's policies admit (its Bindings').
    pub bound_namespaces: &'a [String],
    /// `policies_fingerprint` of what this pass renders; `None`: nothing rendered.
    pub policies: Option<&'a str>,
    /// [`target`].
    pub target: Option<&'a str>,
    /// The store image (it has Python), and the pull policy its Pods use.
    pub image: Option<&'a str>,
    /// The record in the status.
    pub recorded: Option<&'a IsolationProbe>,
    /// The backend's probe Pods (`read_probe_pod`).
    pub pods: &'a [ProbePod],
    /// The time of this pass.
    pub now: Timestamp,
}

/// What `NetworkIsolated` is computed from (beside the host-network groups).
#[derive(Clone, Debug, PartialEq)]
pub enum Isolation {
    /// The probe is off (`--isolation-probe=false`).
    Off,
    /// No probe can tell: the operator's own namespace is bound to the backend, so its Pods
    /// are admitted.
    OwnNamespaceBound,
    /// The current policies have no result yet: a probe is under way or waits for a serving
    /// master (`previous`: the last result, of other policies or inconclusive).
    Probing {
        /// The last record, if any.
        previous: Option<IsolationProbe>,
    },
    /// The result for the current policies.
    Probed(IsolationProbe),
}

/// What the pass does about the probe.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeDecision {
    /// A probe Pod to create.
    pub create: Option<Pod>,
    /// Probe Pods to delete (read, stale, or past their deadline).
    pub delete: Vec<String>,
    /// The record to write (`None`: keep the stored one).
    pub record: Option<IsolationProbe>,
    /// What the condition says; `None` while the backend renders no policies.
    pub isolation: Option<Isolation>,
    /// How soon to look again.
    pub recheck: Option<Duration>,
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// The result a probe Pod's end means.
fn result_of(p: &ProbePod) -> Option<(ProbeResult, String)> {
    match &p.outcome {
        Outcome::Running => None,
        Outcome::Exited { code, message } if *code == EXIT_CONNECTED => {
            Some((ProbeResult::NotEnforced, message.clone()))
        }
        Outcome::Exited { code, message } if *code == EXIT_REFUSED => {
            Some((ProbeResult::Enforced, message.clone()))
        }
        Outcome::Exited { code, message } => Some((
            ProbeResult::Inconclusive,
            format!("the probe ended with code {code}: {message}"),
        )),
        Outcome::Failed(why) => Some((ProbeResult::Inconclusive, why.clone())),
    }
}

/// Decides the probe for one pass: read the result of a probe Pod that ended (and delete it),
/// delete a stale one, start one when the current policies have no result (or an inconclusive
/// one past `RETRY_INCONCLUSIVE`) and a serving master can be dialled.
pub fn decide(input: &ProbeInput<'_>) -> ProbeDecision {
    let everything = || input.pods.iter().map(|p| p.name.clone()).collect();
    let mut out = ProbeDecision {
        create: None,
        delete: Vec::new(),
        record: None,
        isolation: None,
        recheck: None,
    };
    let Some(policies) = input.policies else {
        out.delete = everything();
        return out;
    };
    if !input.enabled {
        out.delete = everything();
        out.isolation = Some(Isolation::Off);
        return out;
    }
    if input.bound_namespaces.iter().any(|n| n == input.namespace) {
        out.delete = everything();
        out.isolation = Some(Isolation::OwnNamespaceBound);
        return out;
    }
    let mut record = input.recorded.cloned();
    let mut in_flight = false;
    for p in input.pods.iter().filter(|p| !p.deleting) {
        let stale = p.policies != policies;
        match result_of(p) {
            Some((result, message)) => {
                if !stale {
                    record = Some(IsolationProbe {
                        policies: p.policies.clone(),
                        target: p.target.clone(),
                        pod: format!("{}/{}", input.namespace, p.name),
                        result,
                        message,
                        probed_at: Time(input.now),
                    });
                    out.record = record.clone();
                }
                out.delete.push(p.name.clone());
            }
            None if stale => out.delete.push(p.name.clone()),
            None if p
                .created
                .is_some_and(|c| elapsed(c, input.now) >= PROBE_DEADLINE) =>
            {
                record = Some(IsolationProbe {
                    policies: p.policies.clone(),
                    target: p.target.clone(),
                    pod: format!("{}/{}", input.namespace, p.name),
                    result: ProbeResult::Inconclusive,
                    message: format!(
                        "the probe Pod did not end within {}s of its creation (unschedulable, or its image not pulled?)",
                        PROBE_DEADLINE.as_secs()
                    ),
                    probed_at: Time(input.now),
                });
                out.record = record.clone();
                out.delete.push(p.name.clone());
            }
            None => in_flight = true,
        }
    }
    let current = record.as_ref().filter(|r| r.policies == policies);
    let retry_in = current
        .filter(|r| r.result == ProbeResult::Inconclusive)
        .map(|r| RETRY_INCONCLUSIVE.saturating_sub(elapsed(r.probed_at.0, input.now)));
    let needed = current.is_none() || retry_in == Some(Duration::ZERO);
    out.isolation = Some(match current {
        Some(r) if !needed => Isolation::Probed(r.clone()),
        _ => Isolation::Probing {
            previous: record.clone(),
        },
    });
    if in_flight {
        out.recheck = Some(PROBE_POLL);
    } else if needed {
        if let (Some(target), Some(image)) = (input.target, input.image) {
            out.create = Some(probe_pod(input, policies, target, image));
            out.recheck = Some(PROBE_POLL);
        }
    } else {
        out.recheck = retry_in;
    }
    out
}

/// The probe Pod: in the operator's namespace, labelled as neither the backend's Pods nor the
/// operator's (no policy admits it), under the restricted Pod Security Standard, owned by the
/// backend (it goes with it), one container of the store image running [`SCRIPT`]; it never
/// restarts and is given [`PROBE_DEADLINE`] in all.
fn probe_pod(input: &ProbeInput<'_>, policies: &str, target: &str, image: &str) -> Pod {
    let b = input.backend;
    let backend = b.metadata.name.as_deref().unwrap_or_default();
    let (host, port) = target.rsplit_once(':').unwrap_or((target, ""));
    let q = |v: &str| K8sQuantity(v.into());
    Pod {
        metadata: ObjectMeta {
            name: Some(probe_name(backend, policies)),
            namespace: Some(input.namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/name".to_owned(),
                    "kvcache-isolation-probe".to_owned(),
                ),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "kvcache-operator".to_owned(),
                ),
                (PROBE_LABEL.to_owned(), label_value(backend)),
            ])),
            annotations: Some(BTreeMap::from([
                (POLICIES_ANNOTATION.to_owned(), policies.to_owned()),
                (TARGET_ANNOTATION.to_owned(), target.to_owned()),
            ])),
            owner_references: owner(b),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(PROBE_DEADLINE.as_secs() as i64),
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(restricted_pod()),
            image_pull_secrets: pull_secrets(b),
            containers: vec![Container {
                name: "probe".into(),
                image: Some(image.to_owned()),
                image_pull_policy: Some(pull_policy(b.spec.image_pull_policy, image)),
                command: Some(vec![
                    "python3".into(),
                    "-c".into(),
                    SCRIPT.into(),
                    host.to_owned(),
                    port.to_owned(),
                    CONNECT_TIMEOUT_SECONDS.to_string(),
                ]),
                env: Some(vec![EnvVar {
                    name: "PYTHONDONTWRITEBYTECODE".into(),
                    value: Some("1".into()),
                    ..Default::default()
                }]),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_owned(), q("10m")),
                        ("memory".to_owned(), q("32Mi")),
                    ])),
                    limits: Some(BTreeMap::from([
                        ("cpu".to_owned(), q("100m")),
                        ("memory".to_owned(), q("64Mi")),
                    ])),
                    ..Default::default()
                }),
                security_context: Some(restricted_container()),
                volume_mounts: Some(vec![VolumeMount {
                    name: "tmp".into(),
                    mount_path: "/tmp".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "tmp".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// `<backend>-probe-<first 8 of the fingerprint>`: one name per change of the policies, so a
/// new probe never waits for the old one's deletion.
pub(crate) fn probe_name(backend: &str, policies: &str) -> String {
    names::object(
        backend,
        &format!("probe-{}", &policies[..policies.len().min(8)]),
    )
}

#[cfg(test)]
mod tests;
