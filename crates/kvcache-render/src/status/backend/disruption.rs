//! `DisruptionBudget` (docs/high-availability.md#disruption-budgets): whether every store
//! workload has a disruption budget, or which runs one Pod that a node drain takes with no
//! budget to hold it, and what that costs.

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::conditions::DISRUPTION_BUDGET;
use kvcache_api::backend::{ElectionBackend, Leader};
use kvcache_api::condition::Cond;

use crate::objects::backend::disruption::{
    etcd_max_unavailable, leader_min_available, leader_pods,
};
use crate::objects::backend::leader_name;

/// `DisruptionBudget` of a managed backend (`None` for an external one): `True/Budgeted` when
/// the leader runs standbys (and a warm backend's etcd a quorum of three), `False/SingleLeader`
/// when its one leader Pod has no budget, with what a drain of its node does and the fix.
pub(super) fn disruption_budget(b: &KVCacheBackend) -> Option<Cond> {
    let managed = b.spec.connection.managed.as_ref()?;
    let l = &managed.leader;
    let backend = b.metadata.name.as_deref().unwrap_or_default();
    let leader = leader_name(backend);
    let pods = leader_pods(l);
    let etcd = l.etcd_replicas();
    if leader_min_available(pods).is_some() && (etcd == 0 || etcd_max_unavailable(etcd).is_some()) {
        let etcd_part = if etcd > 0 {
            format!(
                ", etcd {backend}-etcd loses at most {} of its {etcd} members at a time (its quorum kept)",
                etcd_max_unavailable(etcd).unwrap_or_default()
            )
        } else {
            String::new()
        };
        return Some(Cond::yes(
            DISRUPTION_BUDGET,
            "Budgeted",
            format!(
                "an eviction (a node drain, the cluster autoscaler) takes a standby of {leader} only while a master serves and never the serving master (a drain of its node waits: delete that Pod to fail over){etcd_part}, and one member at a time of each member group on more than one node"
            ),
        ));
    }
    Some(Cond::no(
        DISRUPTION_BUDGET,
        "SingleLeader",
        single(l, &leader),
    ))
}

/// What a drain of the one leader Pod's node does, and what to set instead.
fn single(l: &Leader, leader: &str) -> String {
    let head = format!(
        "leader {leader} runs one Pod, which no disruption budget guards (one would hold every drain of its node forever): a drain of that node restarts the master"
    );
    match l.election_backend {
        ElectionBackend::Etcd => format!(
            "{head}, and the etcd's one member there with it; the keys are kept in the etcd, but no master serves until both are back. Standbys and a three-member etcd are chosen when a warm backend is created: create one with leader.replicas: 2"
        ),
        ElectionBackend::Kubernetes => format!(
            "{head} and empties the cache (every key is lost). Set leader.replicas: 2 for a standby that takes over (the cache still empties on a failover), or create a backend with electionBackend: Etcd and leader.replicas: 2, whose failover keeps the keys"
        ),
        ElectionBackend::None => format!(
            "{head} and empties the cache (every key is lost). Set electionBackend: Kubernetes and leader.replicas: 2 for a standby that takes over (the cache still empties on a failover), or create a backend with electionBackend: Etcd and leader.replicas: 2, whose failover keeps the keys"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::condition::Status;

    fn backend(replicas: i32, election: &str) -> KVCacheBackend {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "b"},
            "spec": {"connection": {"managed": {
                "leader": {"replicas": replicas, "electionBackend": election},
                "members": [],
            }}},
        }))
        .expect("a backend")
    }

    fn judged(replicas: i32, election: &str) -> Cond {
        disruption_budget(&backend(replicas, election)).expect("managed")
    }

    #[test]
    fn standbys_are_budgeted() {
        for election in ["Kubernetes", "Etcd"] {
            let c = judged(2, election);
            assert_eq!(
                (c.status, c.reason),
                (Status::True, "Budgeted"),
                "{election}"
            );
        }
        assert!(judged(3, "Etcd").message.contains("at most 1 of its 3"));
    }

    #[test]
    fn one_leader_pod_is_an_exposure_with_its_fix() {
        for (replicas, election, says) in [
            (1, "Kubernetes", "empties the cache"),
            (1, "Etcd", "keys are kept in the etcd"),
            (
                3,
                "None",
                "electionBackend: Kubernetes and leader.replicas: 2",
            ),
        ] {
            let c = judged(replicas, election);
            assert_eq!((c.status, c.reason), (Status::False, "SingleLeader"));
            assert!(c.message.contains("b-leader runs one Pod"), "{}", c.message);
            assert!(c.message.contains(says), "{election}: {}", c.message);
        }
    }
}
