//! Kubernetes objects read into what the status functions take: a member Pod (its group, its
//! readiness, why it is not running), a Deployment's replica counts, a Pod's readiness, which
//! engine Pods a ModelDeployment's scrape reads. The operator lists the objects; everything it
//! concludes from them is here.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::names::POD_SPEC_HASH;

/// One role's Deployment as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleObservation {
    /// The role's `name` in `spec.roles`.
    pub name: String,
    /// `spec.replicas` wanted.
    pub desired: i32,
    /// Ready replicas.
    pub ready: i32,
    /// Replicas on the current template.
    pub updated: i32,
    /// All replicas.
    pub total: i32,
    /// The Deployment exists and its controller has seen the current spec.
    pub observed: bool,
    /// A take-over role (`command`): no cache settings.
    pub unmanaged: bool,
}

/// A member Pod as the operator sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberPod {
    /// Pod name.
    pub name: String,
    /// Node it runs on (empty while unscheduled).
    pub node: String,
    /// Its IP (empty until it has one).
    pub ip: String,
    /// The member group index (from `app.kubernetes.io/component: member-<i>`).
    pub group: usize,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// It has a deletion timestamp: it is terminating.
    pub terminating: bool,
    /// Its `pod-spec-hash` annotation.
    pub hash: String,
    /// Why it is not running, when Kubernetes says (e.g. `CrashLoopBackOff`, `Unschedulable`),
    /// with the message.
    pub problem: Option<(String, String)>,
    /// The disk-tier survey's termination message (`entries=N path=…`), once it ran.
    pub survey: Option<String>,
    /// The drain a member rollout started on it (its annotations), if any.
    pub drain: Option<DrainRecord>,
    /// Why it is about to lose its node, when it is (its node's state, or its group's edited
    /// template; `crate::observe::node`, `crate::members::maintenance`): drained first, then held.
    pub leaving: Option<crate::observe::node::Leaving>,
}

/// On a member Pod: when the operator started draining its segment, before replacing it or
/// before its node goes (an RFC 3339 time, written before the master is asked, so a drain is
/// bounded even when the answer was lost).
pub const DRAIN_STARTED_ANNOTATION: &str = "kvcache.gpustack.ai/drain-started";

/// On a member Pod: the master's id of the drain job that empties its segment (asked about on
/// re-entry before another is created).
pub const DRAIN_JOB_ANNOTATION: &str = "kvcache.gpustack.ai/drain-job";

/// What a member Pod's annotations say of its drain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainRecord {
    /// When the drain was started (`None`: the annotation is missing or not a time).
    pub started: Option<Timestamp>,
    /// The master's job id, once the master answered the create.
    pub job: Option<String>,
}

/// The leader Deployment's replica counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaderReplicas {
    /// `spec.replicas`.
    pub desired: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.updatedReplicas`.
    pub updated: i32,
    /// `status.replicas` (all Pods, old and new template).
    pub total: i32,
    /// `status.observedGeneration` has caught up with `metadata.generation`.
    pub observed: bool,
}

/// The waiting reasons that mean a container will not start by itself.
const STUCK: [&str; 6] = [
    "CrashLoopBackOff",
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
];

/// Whether the Pod's `Ready` condition is true.
pub(crate) fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A member Pod (`app.kubernetes.io/component: member-<group>`) as the backend status reads it;
/// `None` for any other Pod.
pub(crate) fn member_pod(p: &Pod) -> Option<MemberPod> {
    let labels = p.metadata.labels.as_ref()?;
    let component = labels.get("app.kubernetes.io/component")?;
    let group = component.strip_prefix("member-")?.parse().ok()?;
    let status = p.status.clone().unwrap_or_default();
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            let reason = w.reason.clone()?;
            STUCK
                .contains(&reason.as_str())
                .then(|| (reason, w.message.clone().unwrap_or_default()))
        });
    let unschedulable = status.conditions.iter().flatten().find_map(|c| {
        (c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable"))
        .then(|| {
            (
                "Unschedulable".to_owned(),
                c.message.clone().unwrap_or_default(),
            )
        })
    });
    let annotations = p.metadata.annotations.clone().unwrap_or_default();
    let started = annotations.get(DRAIN_STARTED_ANNOTATION);
    let job = annotations
        .get(DRAIN_JOB_ANNOTATION)
        .filter(|j| !j.is_empty())
        .cloned();
    let drain = (started.is_some() || job.is_some()).then(|| DrainRecord {
        started: started.and_then(|t| t.parse().ok()),
        job,
    });
    let survey = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "tier-survey")
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone());
    Some(MemberPod {
        name: p.metadata.name.clone().unwrap_or_default(),
        node: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        ip: status.pod_ip.clone().unwrap_or_default(),
        group,
        ready: pod_ready(p),
        terminating: p.metadata.deletion_timestamp.is_some(),
        hash: annotations.get(POD_SPEC_HASH).cloned().unwrap_or_default(),
        problem: waiting.or(unschedulable),
        survey,
        drain,
        leaving: None,
    })
}

/// A Deployment's replica counts, and whether its controller has seen the current spec.
pub fn replicas(d: &Deployment) -> LeaderReplicas {
    let status = d.status.clone().unwrap_or_default();
    LeaderReplicas {
        desired: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        ready: status.ready_replicas.unwrap_or(0),
        updated: status.updated_replicas.unwrap_or(0),
        total: status.replicas.unwrap_or(0),
        observed: status.observed_generation.is_some()
            && status.observed_generation == d.metadata.generation,
    }
}

/// The most engine Pods one scrape of a ModelDeployment reads. Each read may wait the client's
/// whole timeout, so a pass of a deployment with many replicas would hold a reconcile slot for
/// minutes; the counters of this many replicas already give its hit ratio (`status.sharedCache`
/// says how many of how many were read). The Pods read are the first by name, the same from
/// pass to pass, so each one's counters have a window to move in.
pub const ENGINE_PODS_PER_PASS: usize = 32;

/// An engine Pod a shared-cache scrape reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnginePod {
    /// Pod name, in the ModelDeployment's namespace.
    pub name: String,
    /// The Pod's uid: a replaced Pod of the same name starts its counters again.
    pub uid: String,
    /// Its address (the engine's `/metrics` is read there).
    pub ip: String,
    /// The port its container names `http`, where the engine serves (a role's own `--port`),
    /// else [`crate::names::SERVING_PORT`].
    pub port: i32,
}

/// The port `pod`'s containers name `http`, else [`crate::names::SERVING_PORT`].
fn http_port(pod: &Pod) -> i32 {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("http"))
        .map_or(crate::names::SERVING_PORT, |p| p.container_port)
}

/// The engine Pods of a ModelDeployment that one scrape reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineSelection {
    /// The Pods to read: at most [`ENGINE_PODS_PER_PASS`], by name.
    pub pods: Vec<EnginePod>,
    /// How many Pods qualified, those left out by the cap included.
    pub ready: usize,
}

/// The uid of the object's controller (its owner reference with `controller: true`).
fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Which engine Pods a scrape of the ModelDeployment whose uid is `owner` reads, by ownership
/// and never by labels (which anyone who may create a Pod in the namespace can set): a Pod whose
/// controller is a ReplicaSet whose controller is a Deployment that `owner` controls, of a role
/// in `managed` (the label values of the roles the operator runs the engine command of, as the
/// Deployment's `app.kubernetes.io/component` label names them). Of those, the Ready ones that
/// are not terminating and have an address; at most [`ENGINE_PODS_PER_PASS`], by name.
pub fn engine_pods(
    owner: &str,
    managed: &BTreeSet<String>,
    deployments: &[Deployment],
    replica_sets: &[ReplicaSet],
    pods: &[Pod],
) -> EngineSelection {
    let uid = |meta: &ObjectMeta| meta.uid.clone().unwrap_or_default();
    let roles: BTreeSet<String> = deployments
        .iter()
        .filter(|d| !owner.is_empty() && controller_uid(&d.metadata) == Some(owner))
        .filter(|d| {
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/component"))
                .is_some_and(|c| managed.contains(c))
        })
        .map(|d| uid(&d.metadata))
        .filter(|u| !u.is_empty())
        .collect();
    let sets: BTreeSet<String> = replica_sets
        .iter()
        .filter(|r| controller_uid(&r.metadata).is_some_and(|c| roles.contains(c)))
        .map(|r| uid(&r.metadata))
        .filter(|u| !u.is_empty())
        .collect();
    let mut chosen: Vec<EnginePod> = pods
        .iter()
        .filter(|p| controller_uid(&p.metadata).is_some_and(|c| sets.contains(c)))
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .filter_map(|p| {
            Some(EnginePod {
                name: p.metadata.name.clone().unwrap_or_default(),
                uid: uid(&p.metadata),
                ip: p
                    .status
                    .as_ref()?
                    .pod_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())?,
                port: http_port(p),
            })
        })
        .collect();
    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    let ready = chosen.len();
    chosen.truncate(ENGINE_PODS_PER_PASS);
    EngineSelection {
        pods: chosen,
        ready,
    }
}

/// A warm backend's etcd as its status shows it: Pods asked for and ready, and the endpoint
/// list the masters, members and engines are given.
pub fn etcd(
    s: &StatefulSet,
    backend: &str,
    namespace: &str,
    leader: &kvcache_api::backend::Leader,
) -> kvcache_api::backend::EtcdStatus {
    kvcache_api::backend::EtcdStatus {
        replicas: s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        ready: s
            .status
            .as_ref()
            .and_then(|st| st.ready_replicas)
            .unwrap_or(0),
        endpoints: crate::names::etcd_endpoints(backend, namespace, leader),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("a Pod")
    }

    #[test]
    fn a_member_pod_says_its_group_readiness_and_why_it_does_not_start() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "m-1", "labels": {"app.kubernetes.io/component": "member-1"},
                         "annotations": {POD_SPEC_HASH: "abc"}},
            "spec": {"nodeName": "n0", "containers": []},
            "status": {"podIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "False"}],
                       "containerStatuses": [{"name": "member", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
                                              "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m"}}}]}
        }));
        let m = member_pod(&p).expect("a member Pod");
        assert_eq!((m.group, m.ready, m.hash.as_str()), (1, false, "abc"));
        assert_eq!(
            m.problem,
            Some(("CrashLoopBackOff".into(), "back-off 5m".into()))
        );
        let leader = pod(serde_json::json!({
            "metadata": {"name": "l", "labels": {"app.kubernetes.io/component": "leader"}}
        }));
        assert_eq!(member_pod(&leader), None);
    }

    #[test]
    fn an_unschedulable_member_pod_says_so_and_a_container_creating_one_does_not() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "m-0", "labels": {"app.kubernetes.io/component": "member-0"}},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"}]}
        }));
        assert_eq!(
            member_pod(&p).and_then(|m| m.problem),
            Some(("Unschedulable".into(), "0/2 nodes".into()))
        );
        let creating = pod(serde_json::json!({
            "metadata": {"name": "m-0", "labels": {"app.kubernetes.io/component": "member-0"}},
            "status": {"containerStatuses": [{"name": "member", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                                              "state": {"waiting": {"reason": "ContainerCreating"}}}]}
        }));
        assert_eq!(member_pod(&creating).and_then(|m| m.problem), None);
    }

    #[test]
    fn a_member_pod_says_the_drain_recorded_on_it() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "m-0", "labels": {"app.kubernetes.io/component": "member-0"},
                         "annotations": {DRAIN_STARTED_ANNOTATION: "2026-12-02T12:00:00Z",
                                         DRAIN_JOB_ANNOTATION: "1-2"}}
        }));
        assert_eq!(
            member_pod(&p).and_then(|m| m.drain),
            Some(DrainRecord {
                started: "2026-12-02T12:00:00Z".parse().ok(),
                job: Some("1-2".into())
            })
        );
        let unreadable = pod(serde_json::json!({
            "metadata": {"name": "m-0", "labels": {"app.kubernetes.io/component": "member-0"},
                         "annotations": {DRAIN_STARTED_ANNOTATION: "yesterday"}}
        }));
        assert_eq!(
            member_pod(&unreadable).and_then(|m| m.drain),
            Some(DrainRecord {
                started: None,
                job: None
            })
        );
        let none = pod(serde_json::json!({
            "metadata": {"name": "m-0", "labels": {"app.kubernetes.io/component": "member-0"}}
        }));
        assert_eq!(member_pod(&none).and_then(|m| m.drain), None);
    }

    /// An object's metadata: `name`, `uid`, labels, and its controller's uid if any.
    fn meta(name: &str, uid: &str, component: &str, controller: Option<&str>) -> serde_json::Value {
        serde_json::json!({
            "name": name, "uid": uid,
            "labels": {"app.kubernetes.io/name": "model-deployment",
                       "app.kubernetes.io/instance": "chat",
                       "app.kubernetes.io/component": component},
            "ownerReferences": controller.map(|c| vec![serde_json::json!(
                {"apiVersion": "v1", "kind": "Owner", "name": "o", "uid": c, "controller": true})])
                .unwrap_or_default()
        })
    }

    fn deployment(name: &str, uid: &str, component: &str, owner: &str) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": meta(name, uid, component, Some(owner)),
            "spec": {"selector": {}, "template": {}}
        }))
        .expect("a Deployment")
    }

    fn replica_set(name: &str, uid: &str, owner: &str) -> ReplicaSet {
        serde_json::from_value(serde_json::json!({
            "metadata": meta(name, uid, "engine", Some(owner)),
            "spec": {"selector": {}}
        }))
        .expect("a ReplicaSet")
    }

    /// A Ready Pod of the engine role with an address, controlled by `owner` if any.
    fn engine_pod(name: &str, owner: Option<&str>) -> Pod {
        pod(serde_json::json!({
            "metadata": meta(name, &format!("uid-{name}"), "engine", owner),
            "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
    }

    fn names(s: &EngineSelection) -> Vec<&str> {
        s.pods.iter().map(|p| p.name.as_str()).collect()
    }

    /// The chain of ownership: the ModelDeployment `md` controls `chat-engine` (managed) and
    /// `chat-sidecar` (a role running its own command); another deployment `other` controls
    /// `other-engine`. Each Deployment has a ReplicaSet.
    fn chain() -> (BTreeSet<String>, Vec<Deployment>, Vec<ReplicaSet>) {
        (
            BTreeSet::from(["engine".to_owned()]),
            vec![
                deployment("chat-engine", "d1", "engine", "md"),
                deployment("chat-sidecar", "d2", "sidecar", "md"),
                deployment("other-engine", "d3", "engine", "other"),
            ],
            vec![
                replica_set("chat-engine-1", "rs1", "d1"),
                replica_set("chat-engine-2", "rs1b", "d1"),
                replica_set("chat-sidecar-1", "rs2", "d2"),
                replica_set("other-engine-1", "rs3", "d3"),
                // A ReplicaSet of the same labels that no Deployment of `md` controls.
                replica_set("stray", "rs4", "someone"),
            ],
        )
    }

    #[test]
    fn an_engine_pod_is_read_only_through_the_deployments_own_replica_sets() {
        let (managed, deployments, sets) = chain();
        // An old ReplicaSet's Pod, mid-rollout: still the deployment's engine; its role serves
        // on its own `--port` (its `http` port), where it is read.
        let mut own_port = engine_pod("chat-engine-2-a", Some("rs1b"));
        own_port.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "engine".into(),
                ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                    name: Some("http".into()),
                    container_port: 9000,
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        });
        let pods = vec![
            engine_pod("chat-engine-1-a", Some("rs1")),
            own_port,
            // Labelled as an engine of `chat`, controlled by nothing: anyone's Pod.
            engine_pod("forged", None),
            // Labelled so and controlled by a ReplicaSet that is not the deployment's.
            engine_pod("stray-a", Some("rs4")),
            // Controlled by the Deployment itself (no ReplicaSet between): not how a
            // Deployment runs Pods.
            engine_pod("direct", Some("d1")),
            // Another deployment's engine.
            engine_pod("other-engine-1-a", Some("rs3")),
            // A role whose command is its own: not an engine the operator counts.
            engine_pod("chat-sidecar-1-a", Some("rs2")),
        ];
        let chosen = engine_pods("md", &managed, &deployments, &sets, &pods);
        assert_eq!(names(&chosen), ["chat-engine-1-a", "chat-engine-2-a"]);
        assert_eq!(chosen.ready, 2);
        assert_eq!(
            chosen.pods[0],
            EnginePod {
                name: "chat-engine-1-a".into(),
                uid: "uid-chat-engine-1-a".into(),
                ip: "10.0.0.9".into(),
                port: crate::names::SERVING_PORT,
            }
        );
        assert_eq!(chosen.pods[1].port, 9000);
        // The other deployment reads its own and never `md`'s.
        let theirs = engine_pods("other", &managed, &deployments, &sets, &pods);
        assert_eq!(names(&theirs), ["other-engine-1-a"]);
        // An owner of no uid (never the case for a stored object) reads nothing.
        assert_eq!(
            engine_pods("", &managed, &deployments, &sets, &pods),
            EngineSelection::default()
        );
    }

    #[test]
    fn an_owner_reference_that_is_not_the_controller_does_not_count() {
        let (managed, deployments, sets) = chain();
        let mut p = engine_pod("chat-engine-1-a", Some("rs1"));
        for o in p.metadata.owner_references.iter_mut().flatten() {
            o.controller = None;
        }
        assert_eq!(
            engine_pods("md", &managed, &deployments, &sets, &[p]),
            EngineSelection::default()
        );
    }

    #[test]
    fn an_engine_pod_not_ready_terminating_or_without_an_address_is_not_read() {
        let (managed, deployments, sets) = chain();
        let mut unready = engine_pod("a", Some("rs1"));
        unready.status = Some(serde_json::from_value(
            serde_json::json!({"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "False"}]}),
        ).expect("a status"));
        let mut terminating = engine_pod("b", Some("rs1"));
        terminating.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        let mut no_ip = engine_pod("c", Some("rs1"));
        if let Some(s) = no_ip.status.as_mut() {
            s.pod_ip = None;
        }
        let pods = [unready, terminating, no_ip, engine_pod("d", Some("rs1"))];
        assert_eq!(
            names(&engine_pods("md", &managed, &deployments, &sets, &pods)),
            ["d"]
        );
    }

    #[test]
    fn a_pass_reads_at_most_its_cap_the_first_by_name_and_counts_the_rest() {
        let (managed, deployments, sets) = chain();
        let pods: Vec<Pod> = (0..ENGINE_PODS_PER_PASS + 5)
            .rev()
            .map(|i| engine_pod(&format!("chat-engine-1-{i:03}"), Some("rs1")))
            .collect();
        let chosen = engine_pods("md", &managed, &deployments, &sets, &pods);
        assert_eq!(chosen.pods.len(), ENGINE_PODS_PER_PASS);
        assert_eq!(chosen.ready, ENGINE_PODS_PER_PASS + 5);
        assert_eq!(chosen.pods[0].name, "chat-engine-1-000");
        assert_eq!(
            chosen.pods[ENGINE_PODS_PER_PASS - 1].name,
            format!("chat-engine-1-{:03}", ENGINE_PODS_PER_PASS - 1)
        );
        let exactly: Vec<Pod> = pods[5..].to_vec();
        let chosen = engine_pods("md", &managed, &deployments, &sets, &exactly);
        assert_eq!(
            (chosen.pods.len(), chosen.ready),
            (ENGINE_PODS_PER_PASS, ENGINE_PODS_PER_PASS)
        );
    }

    #[test]
    fn replicas_are_observed_only_once_the_controller_saw_the_generation() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d", "generation": 3},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": {"observedGeneration": 2, "readyReplicas": 1, "replicas": 2, "updatedReplicas": 1}
        }))
        .expect("a Deployment");
        let r = replicas(&d);
        assert_eq!(
            (r.desired, r.ready, r.updated, r.total, r.observed),
            (2, 1, 1, 2, false)
        );
    }
}
