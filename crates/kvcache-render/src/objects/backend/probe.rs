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

use super::{RPC_PORT, owner, pull_policy, pull_secrets, restricted_container, restricted_pod};
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
mod tests {
    use super::*;

    fn backend() -> KVCacheBackend {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "mooncake-dram", "uid": "u-1"},
            "spec": {"connection": {"managed": {"leader": {},
                "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
        }))
        .expect("a backend")
    }

    const NS: &str = "gpustack-system";
    const NOW: &str = "2026-12-06T10:00:00Z";

    fn at(t: &str) -> Timestamp {
        t.parse().expect("a time")
    }

    fn input<'a>(
        b: &'a KVCacheBackend,
        recorded: Option<&'a IsolationProbe>,
        pods: &'a [ProbePod],
        now: &str,
    ) -> ProbeInput<'a> {
        ProbeInput {
            enabled: true,
            backend: b,
            namespace: NS,
            bound_namespaces: &[],
            policies: Some("f00dfeedcafe0123"),
            target: Some("10.244.0.7:50051"),
            image: Some("kvcacheai/mooncake:v0.3.13.post1"),
            recorded,
            pods,
            now: at(now),
        }
    }

    fn running(policies: &str, created: &str) -> ProbePod {
        ProbePod {
            name: format!("mooncake-dram-probe-{}", &policies[..8]),
            policies: policies.into(),
            target: "10.244.0.7:50051".into(),
            created: Some(at(created)),
            deleting: false,
            outcome: Outcome::Running,
        }
    }

    fn exited(code: i32, message: &str) -> ProbePod {
        ProbePod {
            outcome: Outcome::Exited {
                code,
                message: message.into(),
            },
            ..running("f00dfeedcafe0123", NOW)
        }
    }

    fn record(result: ProbeResult, policies: &str, at_: &str) -> IsolationProbe {
        IsolationProbe {
            policies: policies.into(),
            target: "10.244.0.7:50051".into(),
            pod: format!("{NS}/mooncake-dram-probe-{}", &policies[..8]),
            result,
            message: String::new(),
            probed_at: Time(at(at_)),
        }
    }

    #[test]
    fn policies_without_a_result_start_one_probe_pod_outside_every_admitted_selector() {
        let b = backend();
        let d = decide(&input(&b, None, &[], NOW));
        assert!(d.delete.is_empty() && d.record.is_none());
        assert_eq!(d.isolation, Some(Isolation::Probing { previous: None }));
        assert_eq!(d.recheck, Some(PROBE_POLL));
        let pod = d.create.expect("a probe Pod");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("mooncake-dram-probe-f00dfeed")
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some(NS));
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        // Neither the backend's own Pods (name kv-cache-backend) nor the operator's (name
        // kvcache-operator): no policy admits it.
        assert_eq!(
            labels.get("app.kubernetes.io/name").map(String::as_str),
            Some("kvcache-isolation-probe")
        );
        assert!(!labels.contains_key("app.kubernetes.io/instance"));
        assert_eq!(
            labels.get(PROBE_LABEL).map(String::as_str),
            Some("mooncake-dram")
        );
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(POLICIES_ANNOTATION).map(String::as_str),
            Some("f00dfeedcafe0123")
        );
        let spec = pod.spec.expect("a spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let argv = spec.containers[0].command.clone().unwrap_or_default();
        assert_eq!(argv[argv.len() - 3..], ["10.244.0.7", "50051", "5"]);
        assert_eq!(
            pod.metadata.owner_references.map(|o| o[0].name.clone()),
            Some("mooncake-dram".to_owned())
        );
    }

    #[test]
    fn a_running_probe_is_awaited_and_one_past_its_deadline_gives_no_answer() {
        let b = backend();
        let pods = [running("f00dfeedcafe0123", "2026-12-06T09:59:00Z")];
        let d = decide(&input(&b, None, &pods, NOW));
        assert_eq!((d.create, d.delete.len()), (None, 0));
        assert_eq!(d.recheck, Some(PROBE_POLL));
        let late = decide(&input(&b, None, &pods, "2026-12-06T10:01:01Z"));
        assert_eq!(late.delete, ["mooncake-dram-probe-f00dfeed"]);
        let r = late.record.expect("a record");
        assert_eq!(r.result, ProbeResult::Inconclusive);
        assert!(
            r.message.contains("did not end within 120s"),
            "{}",
            r.message
        );
        assert!(
            late.create.is_none(),
            "tried again only after the retry delay"
        );
        assert_eq!(late.isolation, Some(Isolation::Probed(r)));
        assert_eq!(late.recheck, Some(RETRY_INCONCLUSIVE));
    }

    #[test]
    fn the_exit_code_is_the_result_read_once_and_the_pod_deleted() {
        let b = backend();
        for (code, result) in [
            (EXIT_REFUSED, ProbeResult::Enforced),
            (EXIT_CONNECTED, ProbeResult::NotEnforced),
            // Python's own exit on an uncaught error: no answer, never "refused".
            (1, ProbeResult::Inconclusive),
        ] {
            let pods = [exited(code, "refused: Connection refused")];
            let d = decide(&input(&b, None, &pods, NOW));
            let r = d.record.clone().expect("a record");
            assert_eq!(r.result, result, "exit {code}");
            assert_eq!(r.target, "10.244.0.7:50051");
            assert_eq!(r.pod, "gpustack-system/mooncake-dram-probe-f00dfeed");
            assert_eq!(d.delete, ["mooncake-dram-probe-f00dfeed"]);
            assert!(d.create.is_none(), "exit {code}: one Pod per change");
            assert_eq!(d.isolation, Some(Isolation::Probed(r)));
        }
    }

    #[test]
    fn a_result_for_the_current_policies_holds_until_they_change() {
        let b = backend();
        let done = record(
            ProbeResult::Enforced,
            "f00dfeedcafe0123",
            "2026-12-01T00:00:00Z",
        );
        let d = decide(&input(&b, Some(&done), &[], NOW));
        assert_eq!(d.create, None);
        assert_eq!(d.isolation, Some(Isolation::Probed(done.clone())));
        assert_eq!(d.recheck, None);
        // A Binding made: other policies. The old result is no longer theirs, and a probe Pod
        // of the old ones still running goes.
        let pods = [running("0123456789abcdef", "2026-12-06T09:59:50Z")];
        let changed = decide(&ProbeInput {
            policies: Some("badc0ffee0ddf00d"),
            ..input(&b, Some(&done), &pods, NOW)
        });
        assert_eq!(changed.delete, ["mooncake-dram-probe-01234567"]);
        assert_eq!(
            changed.create.and_then(|p| p.metadata.name),
            Some("mooncake-dram-probe-badc0ffe".to_owned())
        );
        assert_eq!(
            changed.isolation,
            Some(Isolation::Probing {
                previous: Some(done)
            })
        );
    }

    #[test]
    fn an_inconclusive_result_is_tried_again_after_the_retry_delay() {
        let b = backend();
        let failed = record(ProbeResult::Inconclusive, "f00dfeedcafe0123", NOW);
        let soon = decide(&input(&b, Some(&failed), &[], "2026-12-06T10:04:00Z"));
        assert!(soon.create.is_none());
        assert_eq!(soon.recheck, Some(Duration::from_secs(60)));
        let later = decide(&input(&b, Some(&failed), &[], "2026-12-06T10:05:00Z"));
        assert!(later.create.is_some());
        assert_eq!(
            later.isolation,
            Some(Isolation::Probing {
                previous: Some(failed)
            })
        );
    }

    #[test]
    fn off_own_namespace_bound_or_no_serving_master_starts_nothing() {
        let b = backend();
        let pods = [running("f00dfeedcafe0123", NOW)];
        let off = decide(&ProbeInput {
            enabled: false,
            ..input(&b, None, &pods, NOW)
        });
        assert_eq!(
            (off.create, off.delete.clone(), off.isolation),
            (None, vec![pods[0].name.clone()], Some(Isolation::Off))
        );
        let bound = [NS.to_owned()];
        let own = decide(&ProbeInput {
            bound_namespaces: &bound,
            ..input(&b, None, &pods, NOW)
        });
        assert_eq!(own.isolation, Some(Isolation::OwnNamespaceBound));
        assert!(own.create.is_none());
        let waiting = decide(&ProbeInput {
            target: None,
            ..input(&b, None, &[], NOW)
        });
        assert!(waiting.create.is_none());
        assert_eq!(
            waiting.isolation,
            Some(Isolation::Probing { previous: None })
        );
        let nothing = decide(&ProbeInput {
            policies: None,
            ..input(&b, None, &pods, NOW)
        });
        assert_eq!((nothing.isolation, nothing.delete.len()), (None, 1));
    }

    #[test]
    fn a_listed_pod_reads_as_its_outcome() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "mooncake-dram-probe-f00dfeed",
                         "creationTimestamp": "2026-12-06T10:00:00Z",
                         "annotations": {POLICIES_ANNOTATION: "f00dfeedcafe0123",
                                         TARGET_ANNOTATION: "10.244.0.7:50051"}},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 3, "message": "refused: Connection refused\n"}}
            }]}
        }))
        .expect("a Pod");
        let p = read_probe_pod(&pod);
        assert_eq!(p.policies, "f00dfeedcafe0123");
        assert_eq!(p.target, "10.244.0.7:50051");
        assert_eq!(
            p.outcome,
            Outcome::Exited {
                code: 3,
                message: "refused: Connection refused".into()
            }
        );
        let evicted: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Failed", "reason": "DeadlineExceeded",
                       "message": "Pod was active on the node longer than the specified deadline"}
        }))
        .expect("a Pod");
        assert_eq!(
            read_probe_pod(&evicted).outcome,
            Outcome::Failed("Pod was active on the node longer than the specified deadline".into())
        );
    }

    #[test]
    fn the_target_is_this_backends_ready_leader_and_the_fingerprint_follows_the_policies() {
        let leader = |instance: &str, name: &str, ip: &str, ready: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {
                    "app.kubernetes.io/name": "kv-cache-backend",
                    "app.kubernetes.io/instance": instance,
                    "app.kubernetes.io/component": "leader"}},
                "status": {"podIP": ip, "conditions": [
                    {"type": "Ready", "status": if ready { "True" } else { "False" }}]}
            }))
            .expect("a Pod")
        };
        let pods = [
            leader("other", "other-leader-a", "10.0.0.1", true),
            leader("mooncake-dram", "mooncake-dram-leader-b", "10.0.0.3", false),
            leader("mooncake-dram", "mooncake-dram-leader-a", "10.0.0.2", true),
        ];
        assert_eq!(
            target("mooncake-dram", &pods).as_deref(),
            Some("10.0.0.2:50051")
        );
        assert_eq!(target("mooncake-dram", &pods[..2]), None);
        let policy = |ns: &str| -> NetworkPolicy {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "mooncake-dram-leader"},
                "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
                    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}]}}]}]}
            }))
            .expect("a policy")
        };
        let (a, b) = (policy("team-a"), policy("team-b"));
        assert_eq!(policies_fingerprint(&[]), None);
        assert_eq!(policies_fingerprint(&[&a]), policies_fingerprint(&[&a]));
        assert_ne!(policies_fingerprint(&[&a]), policies_fingerprint(&[&b]));
    }
}
