//! Disruption budgets (docs/high-availability.md#disruption-budgets), held by the API server's
//! eviction subresource (policy/v1 Eviction, what `kubectl drain` and the cluster autoscaler
//! call): a warm backend with two leader Pods, a three-member etcd and a member on each node
//! gives a standby up while a master serves and never the serving master; the etcd's and the
//! member group's budgets are sized one at a time; its budgets go with it.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams};
use kube::core::Status;
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::Error;
use kvcache_e2e::cluster::{block_on, client_from, wait_deleted, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::walkthrough::backend_pods;

use crate::{NAMESPACE, WAIT, apply, backend, cluster, remove_backend, wait_backend};

/// How the API server answered an eviction: `Ok` granted, else the HTTP code of its refusal.
fn answer(r: Result<Status, kube::Error>) -> Result<(), u16> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(s.code),
        Err(e) => panic!("the eviction got no answer from the API server: {e}"),
    }
}

/// Waits until the budget `name` was computed for the generation written and `ok` holds of
/// its status; returns it.
async fn budget(
    api: &Api<PodDisruptionBudget>,
    name: &str,
    what: &str,
    ok: impl Fn(&k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus) -> bool,
) -> Result<PodDisruptionBudget, Error> {
    wait_object(api, name, what, WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            s.observed_generation.is_some()
                && s.observed_generation == p.metadata.generation
                && ok(s)
        })
    })
    .await
}

/// Evicts `pod` and answers as [`answer`] does.
async fn evict(store: &Api<Pod>, pod: &Pod) -> Result<(), u16> {
    answer(store.evict(name_of(pod), &EvictParams::default()).await)
}

#[test]
fn evictions_take_a_standby_never_the_serving_master_and_the_budgets_go_with_the_backend() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client: Client = client_from(&kc).await?;
        let name = "dram-budgets";
        // Three etcd members (standbys asked for), at most two on a node.
        local_volumes(&client, &cluster.nodes, name, 2).await?;
        apply(
            &client,
            &backend(name, |v| {
                v["spec"]["connection"]["managed"]["leader"] = serde_json::json!({
                    "replicas": 2,
                    "electionBackend": "Etcd",
                    "multiTenancy": false,
                    "etcd": {"storageClassName": LOCAL_CLASS, "storageSize": "64Mi"},
                });
            }),
        )
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NAMESPACE);
        let b = wait_backend(&client, name, "Ready, its etcd in quorum", |b| {
            phase(b) == Some(BackendPhase::Ready) && has_condition(b, "EtcdAvailable=True")
        })
        .await?;
        assert!(
            has_condition(&b, "DisruptionBudget=True/Budgeted"),
            "{}",
            describe(&b)
        );
        let leader = format!("{name}-leader");
        let etcd = format!("{name}-etcd");
        let member = format!("{name}-member-0");
        let leader_pdb = budget(&pdbs, &leader, "the serving master kept of 2", |s| {
            s.expected_pods == 2 && s.current_healthy == 1 && s.desired_healthy == 1
        })
        .await?;
        let etcd_pdb = budget(&pdbs, &etcd, "1 of 3 etcd members allowed", |s| {
            s.expected_pods == 3 && s.disruptions_allowed == 1
        })
        .await?;
        let member_pdb = budget(&pdbs, &member, "1 of 2 members allowed", |s| {
            s.expected_pods == 2 && s.disruptions_allowed == 1
        })
        .await?;

        // The leader: the standby may go while the master serves; the serving master may not.
        let leaders = pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "2 leader Pods, 1 Ready",
            WAIT,
            |p| p.len() == 2 && p.iter().filter(|p| pods::is_ready(p)).count() == 1,
        )
        .await?;
        let (serving, standby): (Vec<&Pod>, Vec<&Pod>) =
            leaders.iter().partition(|p| pods::is_ready(p));
        assert_eq!(
            evict(&store, standby[0]).await,
            Ok(()),
            "the standby is evicted"
        );
        assert_eq!(
            evict(&store, serving[0]).await,
            Err(429),
            "the serving master is not evicted while its standby is replaced"
        );

        // The etcd's and the members' budgets are computed as sized above (1 of 3, 1 of 2).
        // Their evictions are not asserted: in three runs the API server granted every etcd
        // eviction in a row, counting only the last against the budget, though each Pod read
        // Ready just before (the note of 2026-12-06 has the figures; issue 51 stays open on it).

        // The budgets go with the backend.
        remove_backend(&client, name).await?;
        for p in [&leader_pdb, &etcd_pdb, &member_pdb] {
            wait_deleted(
                &pdbs,
                &p.name_any(),
                &p.uid().unwrap_or_default(),
                "the budget gone with its backend",
                WAIT,
            )
            .await?;
        }
        let left = pdbs
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("app.kubernetes.io/instance={name}")),
            )
            .await?;
        assert!(
            left.items.is_empty(),
            "no budget of the backend left: {:?}",
            left.items
        );
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
