//! The disruption budgets of a backend's store workloads (docs/high-availability.md#disruption-budgets):
//! what a voluntary eviction (a `kubectl drain`, the cluster autoscaler, a descheduler) may take
//! of each at once. Each budget has its workload's name, labels, owner and Pod selector.
//!
//! A budget counts a Pod as healthy while it is Ready (the API server's eviction check,
//! Kubernetes `pkg/registry/core/pod/storage/eviction.go`), and each workload's sizing follows
//! from that:
//! - the leader: only the serving master is Ready (standbys are deliberately not, `leader.rs`),
//!   so `minAvailable: 1` where it runs standbys: a standby may be evicted while a master
//!   serves, never while none does, and the serving master is not evicted. A `maxUnavailable`
//!   would count the standbys as already down: at three Pods it would refuse every eviction.
//! - the warm etcd: `maxUnavailable` of the members its quorum can lose, `(n - 1) / 2`.
//! - a member group: its DaemonSet has no `scale` subresource, so the disruption controller
//!   cannot size a `maxUnavailable` for it (it would refuse every eviction); an integer
//!   `minAvailable` of the members it runs less one, from the DaemonSet's
//!   `status.desiredNumberScheduled` as the pass read it (`crate::plan::backend`).
//!
//! No budget where the workload runs one Pod: it could never allow an eviction, and would hold
//! every drain of that node forever; the backend's `DisruptionBudget` condition states that
//! exposure instead (`crate::status::backend`).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::backend::Leader;

/// How many leader Pods the backend runs, as `leader.rs` renders its Deployment: `replicas`
/// under an election, one without.
pub(crate) fn leader_pods(l: &Leader) -> i32 {
    if l.elects() || l.warm() {
        l.replicas.max(1)
    } else {
        1
    }
}

/// The leader's budget at `pods` Pods: one serving master kept (`None` at one Pod).
pub(crate) fn leader_min_available(pods: i32) -> Option<i32> {
    (pods > 1).then_some(1)
}

/// The warm etcd's budget at `pods` members: as many as its quorum can lose (`None` below
/// three, where it can lose none).
pub(crate) fn etcd_max_unavailable(pods: i32) -> Option<i32> {
    let spare = (pods - 1) / 2;
    (spare >= 1).then_some(spare)
}

/// A member group's budget at `scheduled` members: all but one kept (`None` at one member, or
/// while the DaemonSet has not said how many it runs).
pub(crate) fn member_min_available(scheduled: Option<i32>) -> Option<i32> {
    scheduled.filter(|n| *n > 1).map(|n| n - 1)
}

/// The bound of one budget.
enum Bound {
    MinAvailable(i32),
    MaxUnavailable(i32),
}

/// The budget of the workload with `meta` and `selector`.
fn budget(meta: &ObjectMeta, selector: &LabelSelector, bound: Bound) -> PodDisruptionBudget {
    let (min_available, max_unavailable) = match bound {
        Bound::MinAvailable(n) => (Some(IntOrString::Int(n)), None),
        Bound::MaxUnavailable(n) => (None, Some(IntOrString::Int(n))),
    };
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            owner_references: meta.owner_references.clone(),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(selector.clone()),
            min_available,
            max_unavailable,
            ..Default::default()
        }),
        status: None,
    }
}

/// The budgets of a backend's workloads as they stand (a leader held at one Pod has none);
/// `scheduled` holds each member group's `desiredNumberScheduled` by index (empty where it was
/// not read: no member budget).
pub fn budgets(
    deployment: Option<&Deployment>,
    etcd: Option<&StatefulSet>,
    daemon_sets: &[DaemonSet],
    scheduled: &[Option<i32>],
) -> Vec<PodDisruptionBudget> {
    let mut out = Vec::new();
    if let Some(d) = deployment
        && let Some(spec) = &d.spec
        && let Some(n) = leader_min_available(spec.replicas.unwrap_or(1))
    {
        out.push(budget(&d.metadata, &spec.selector, Bound::MinAvailable(n)));
    }
    if let Some(s) = etcd
        && let Some(spec) = &s.spec
        && let Some(n) = etcd_max_unavailable(spec.replicas.unwrap_or(1))
    {
        out.push(budget(
            &s.metadata,
            &spec.selector,
            Bound::MaxUnavailable(n),
        ));
    }
    for (i, ds) in daemon_sets.iter().enumerate() {
        if let Some(spec) = &ds.spec
            && let Some(n) = member_min_available(scheduled.get(i).copied().flatten())
        {
            out.push(budget(&ds.metadata, &spec.selector, Bound::MinAvailable(n)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::backend::ElectionBackend;

    #[test]
    fn the_leader_has_a_budget_only_with_standbys() {
        assert_eq!(leader_min_available(1), None);
        assert_eq!(leader_min_available(2), Some(1));
        assert_eq!(leader_min_available(3), Some(1));
    }

    #[test]
    fn the_etcd_may_lose_what_its_quorum_can() {
        assert_eq!(etcd_max_unavailable(1), None);
        assert_eq!(etcd_max_unavailable(2), None);
        assert_eq!(etcd_max_unavailable(3), Some(1));
        assert_eq!(etcd_max_unavailable(5), Some(2));
    }

    #[test]
    fn a_member_group_keeps_all_but_one() {
        assert_eq!(member_min_available(None), None);
        assert_eq!(member_min_available(Some(0)), None);
        assert_eq!(member_min_available(Some(1)), None);
        assert_eq!(member_min_available(Some(2)), Some(1));
        assert_eq!(member_min_available(Some(3)), Some(2));
    }

    /// A backend of one member group rendered with `leader`, its group on `scheduled` nodes.
    fn rendered(
        leader: serde_json::Value,
        scheduled: Option<i32>,
    ) -> (super::super::BackendObjects, Vec<PodDisruptionBudget>) {
        let b: kvcache_api::KVCacheBackend = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "b", "uid": "u"},
            "spec": {"image": "store:1", "connection": {"managed": {
                "leader": leader,
                "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}],
            }}},
        }))
        .expect("a backend");
        let settings = kvcache_api::Settings::default();
        let objects = super::super::render(&super::super::BackendInputs {
            backend: &b,
            store_image: "store:1",
            namespace: "ns",
            elector_image: settings.elector_image(),
            etcd_image: settings.etcd_image(),
            bound_namespaces: &[],
            policy: None,
            access: &super::super::StoreAccess::default(),
        })
        .expect("rendered");
        let pdbs = objects.budgets(&[scheduled]);
        (objects, pdbs)
    }

    fn selector(p: &PodDisruptionBudget) -> Option<&LabelSelector> {
        p.spec.as_ref().and_then(|s| s.selector.as_ref())
    }

    #[test]
    fn each_budget_selects_its_workloads_pods_under_its_name() {
        let (objects, pdbs) = rendered(
            serde_json::json!({"replicas": 2, "electionBackend": "Etcd"}),
            Some(2),
        );
        let d = objects.deployment.as_ref().expect("a leader");
        let s = objects.etcd.as_ref().expect("an etcd");
        let ds = &objects.daemon_sets[0];
        let workloads = [
            (&d.metadata, d.spec.as_ref().map(|s| &s.selector)),
            (&s.metadata, s.spec.as_ref().map(|s| &s.selector)),
            (&ds.metadata, ds.spec.as_ref().map(|s| &s.selector)),
        ];
        assert_eq!(pdbs.len(), workloads.len());
        for (p, (meta, sel)) in pdbs.iter().zip(workloads) {
            assert_eq!(p.metadata.name, meta.name);
            assert_eq!(p.metadata.labels, meta.labels);
            assert_eq!(p.metadata.owner_references, meta.owner_references);
            assert!(p.metadata.owner_references.is_some());
            assert_eq!(selector(p), sel);
        }
        let bound = |p: &PodDisruptionBudget| {
            let s = p.spec.clone().unwrap_or_default();
            (s.min_available, s.max_unavailable)
        };
        assert_eq!(bound(&pdbs[0]), (Some(IntOrString::Int(1)), None));
        assert_eq!(bound(&pdbs[1]), (None, Some(IntOrString::Int(1))));
        assert_eq!(bound(&pdbs[2]), (Some(IntOrString::Int(1)), None));
        // The render alone knows no group's nodes: the leader's and the etcd's.
        assert_eq!(objects.pdbs, pdbs[..2]);
    }

    #[test]
    fn one_pod_workloads_have_no_budget_and_the_leader_pods_are_the_rendered_ones() {
        for (leader, pods) in [
            (
                serde_json::json!({"replicas": 1, "electionBackend": "Etcd"}),
                1,
            ),
            (
                serde_json::json!({"replicas": 3, "electionBackend": "None"}),
                1,
            ),
            (
                serde_json::json!({"replicas": 3, "electionBackend": "Kubernetes"}),
                3,
            ),
        ] {
            let l: Leader = serde_json::from_value(leader.clone()).expect("a leader");
            let (objects, pdbs) = rendered(leader, Some(1));
            let replicas = objects
                .deployment
                .and_then(|d| d.spec)
                .and_then(|s| s.replicas);
            assert_eq!(replicas, Some(leader_pods(&l)));
            assert_eq!(leader_pods(&l), pods);
            assert_eq!(pdbs.len(), usize::from(pods > 1), "{pdbs:?}");
        }
    }

    #[test]
    fn leader_pods_follow_the_election() {
        let leader = |replicas, election_backend| Leader {
            replicas,
            election_backend,
            ..Leader::default()
        };
        assert_eq!(leader_pods(&leader(3, ElectionBackend::None)), 1);
        assert_eq!(leader_pods(&leader(2, ElectionBackend::Kubernetes)), 2);
        assert_eq!(leader_pods(&leader(2, ElectionBackend::Etcd)), 2);
        assert_eq!(leader_pods(&leader(1, ElectionBackend::Etcd)), 1);
    }
}
