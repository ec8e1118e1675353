//! Disruption budgets (docs/high-availability.md#disruption-budgets), held by the API server's
//! eviction subresource (policy/v1 Eviction, what `kubectl drain` and the cluster autoscaler
//! call): a warm backend with two leader Pods, a three-member etcd and a member on each node
//! gives a standby up while a master serves and never the serving master, one etcd member at a
//! time and one member of a group at a time; its budgets go with it.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams};
use kube::core::Status;
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::Error;
use kvcache_e2e::cluster::{block_on, client_without_retry, wait_deleted, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::walkthrough::backend_pods;

use crate::{NAMESPACE, WAIT, apply, backend, cluster, remove_backend, wait_backend};

/// How the API server answered an eviction: `Ok` granted, else the code and message of its
/// refusal. A refusal may come as an error or as a `Failure` Status in a 201 answer (more than
/// one budget selecting the Pod: `pkg/registry/core/pod/storage/eviction.go` of Kubernetes
/// returns that Status as its result), so only a `Success` Status is a grant.
fn answer(r: Result<Status, kube::Error>) -> Result<(), (u16, String)> {
    match r {
        Ok(s) if s.is_success() => Ok(()),
        Ok(s) => Err((s.code, s.message)),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
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

/// Evicts the budget `pdb`'s Pods one after another without waiting, each Ready when asked: the
/// budget refuses one with 429 before all of them went, having let at most `allowed` of them go
/// (the API server counts a granted eviction out in the same write). Then waits until the
/// budget gives its disruptions back, the evicted Pods replaced.
async fn refused_before_all_go(
    store: &Api<Pod>,
    pdbs: &Api<PodDisruptionBudget>,
    pdb: &str,
    pods: &[Pod],
    allowed: usize,
) -> Result<(), Error> {
    let mut answers = Vec::new();
    let mut trace = Vec::new();
    for p in pods {
        let now = store.get(name_of(p)).await?;
        let answer = evict(store, &now).await;
        let after = pdbs.get(pdb).await?.status.unwrap_or_default();
        trace.push(format!(
            "{} (Ready {}) -> {answer:?}; {pdb}: {} allowed, {} healthy of {} desired, disrupted {:?}",
            name_of(p),
            pods::is_ready(&now),
            after.disruptions_allowed,
            after.current_healthy,
            after.desired_healthy,
            after.disrupted_pods.as_ref().map(|d| d.keys().collect::<Vec<_>>()),
        ));
        let refused = answer.is_err();
        answers.push(answer);
        if refused {
            break;
        }
    }
    println!("{pdb}: evictions:\n  {}", trace.join("\n  "));
    let granted = answers.iter().filter(|a| a.is_ok()).count();
    assert!(
        matches!(answers.last(), Some(Err((429, _)))),
        "{pdb} refuses an eviction with 429 before all {} Pods go:\n  {}",
        pods.len(),
        trace.join("\n  ")
    );
    assert!(
        granted <= allowed,
        "{pdb} let {granted} Pods go, at most {allowed}:\n  {}",
        trace.join("\n  ")
    );
    budget(
        pdbs,
        pdb,
        "its disruptions given back, the evicted Pods replaced",
        |s| s.disruptions_allowed == i32::try_from(allowed).unwrap_or(i32::MAX),
    )
    .await?;
    Ok(())
}

/// Evicts `pod` and answers as [`answer`] does.
async fn evict(store: &Api<Pod>, pod: &Pod) -> Result<(), (u16, String)> {
    answer(store.evict(name_of(pod), &EvictParams::default()).await)
}

#[test]
fn evictions_take_a_standby_one_etcd_member_and_one_member_at_a_time_and_the_budgets_go_with_the_backend()
 {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        // Without kube's retry of 429: a refused eviction must read as refused.
        let client: Client = client_without_retry(&kc).await?;
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
        let standby_answer = evict(&store, standby[0]).await;
        assert_eq!(standby_answer, Ok(()), "the standby is evicted");
        let serving_answer = evict(&store, serving[0]).await;
        assert!(
            matches!(serving_answer, Err((429, _))),
            "the serving master is not evicted while its standby is replaced: {serving_answer:?}"
        );

        // The etcd: one member at a time.
        let members = pods::wait_ready(&store, &backend_pods(name, "etcd"), 3, WAIT).await?;
        refused_before_all_go(&store, &pdbs, &etcd, &members, 1).await?;

        // A member group on both nodes: one member at a time.
        let group = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        assert_ne!(
            group[0].spec.as_ref().and_then(|s| s.node_name.clone()),
            group[1].spec.as_ref().and_then(|s| s.node_name.clone()),
            "a member on each node"
        );
        refused_before_all_go(&store, &pdbs, &member, &group, 1).await?;

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
