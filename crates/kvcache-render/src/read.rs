//! Kubernetes objects read into what the status functions take: a member Pod (its group, its
//! readiness, why it is not running), a Deployment's replica counts, a Pod's readiness. The
//! operator lists the objects; everything it concludes from them is here.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::names::POD_SPEC_HASH;

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
}

/// On a member Pod: when the operator started draining its segment, before replacing it (an
/// RFC 3339 time, written before the master is asked, so a drain is bounded even when the
/// answer was lost).
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
pub fn pod_ready(p: &Pod) -> bool {
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
