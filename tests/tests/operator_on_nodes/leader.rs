//! Leader replicas and the election: three replicas read three desired and one ready and a
//! failover keeps the phase honest, scaling from one to three keeps the serving Pod and the
//! member templates, changing the election backend restarts what it must, and a Lease-addressed
//! member never mounts on another backend's master.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::{Client, ResourceExt};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::Error;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{condition, has_condition, phase};
use kvcache_e2e::walkthrough::backend_pods;

use crate::{
    MIB, NAMESPACE, WAIT, apply, backend, capacity, cluster, remove_backend, wait_backend,
    wait_backend_ready,
};

/// The uids of a set of Pods, sorted.
fn uids(p: &[Pod]) -> Vec<String> {
    let mut u: Vec<String> = p.iter().map(|p| p.uid().unwrap_or_default()).collect();
    u.sort();
    u
}

/// Applies the demo-size backend `name` changed by `edit`, waits until it is Ready with both
/// members' 512Mi, and returns its Ready leader and member Pods.
async fn ready_backend(
    client: &Client,
    name: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> Result<(Vec<Pod>, Vec<Pod>), Error> {
    apply(client, &backend(name, edit)).await?;
    wait_backend_ready(client, name, 512 * MIB).await?;
    let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let leaders = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
    let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
    Ok((leaders, members))
}

#[test]
fn three_leader_replicas_read_three_desired_one_ready_and_a_failover_keeps_the_phase_honest() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-ha";
        apply(
            &client,
            &backend(name, |v| {
                v["spec"]["connection"]["managed"]["leader"]["replicas"] = 3.into();
            }),
        )
        .await?;
        let b = wait_backend(&client, name, "Ready, ElectionObserved=True", |b| {
            phase(b) == Some(BackendPhase::Ready)
                && capacity(b) == Some(512 * MIB)
                && has_condition(b, "ElectionObserved=True")
        })
        .await?;
        let message = condition(&b, "LeaderAvailable")
            .expect("LeaderAvailable")
            .message
            .clone();
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let leaders = pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "3 leader Pods, 1 Ready",
            WAIT,
            |p| p.len() == 3 && p.iter().filter(|p| pods::is_ready(p)).count() == 1,
        )
        .await?;
        let serving = leaders
            .iter()
            .find(|p| pods::is_ready(p))
            .expect("a Ready leader");

        // Every status the backend passes through from the failover until it is Ready again.
        let api: Api<KVCacheBackend> = Api::all(client.clone());
        let seen = tokio::spawn({
            let api = api.clone();
            let name = name.to_owned();
            async move {
                use futures::StreamExt;
                let mut seen = Vec::new();
                let stream = kube::runtime::watcher::watch_object(api, &name);
                let mut stream = Box::pin(stream);
                let mut gone = false;
                while let Some(Ok(Some(b))) = stream.next().await {
                    let p = phase(&b);
                    gone |= p != Some(BackendPhase::Ready);
                    seen.push((p, capacity(&b)));
                    if gone && p == Some(BackendPhase::Ready) && capacity(&b) == Some(512 * MIB) {
                        break;
                    }
                }
                seen
            }
        });
        store
            .delete(name_of(serving), &DeleteParams::default())
            .await?;
        let seen = tokio::time::timeout(WAIT, seen)
            .await
            .map_err(|_| Error::Wait {
                what: format!("{name}: Ready again after the leader Pod was deleted"),
                reason: "the watch did not see it".into(),
            })?
            .expect("the watch task");
        // The gap shows: a phase other than Ready, and no capacity while no leader serves.
        assert!(
            seen.iter()
                .any(|(p, c)| *p != Some(BackendPhase::Ready) && c.is_none()),
            "a gap with no capacity: {seen:?} (LeaderAvailable before: {message})"
        );
        assert!(
            seen.iter()
                .all(|(p, c)| *p != Some(BackendPhase::Ready) || c.is_some()),
            "Ready never without capacity: {seen:?}"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn scaling_the_leader_from_one_to_three_keeps_the_first_leader_pod_and_the_member_templates() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "claim-scale";
        let (first, members) = ready_backend(&client, name, |_| {}).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
        let member_set = format!("{name}-member-0");
        let before = daemonsets.get(&member_set).await?;

        // One edit: three leader replicas.
        apply(
            &client,
            &backend(name, |v| {
                v["spec"]["connection"]["managed"]["leader"]["replicas"] = 3.into();
            }),
        )
        .await?;
        let leaders = pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "3 leader Pods, 1 Ready",
            WAIT,
            |p| p.len() == 3 && p.iter().filter(|p| pods::is_ready(p)).count() == 1,
        )
        .await?;
        // The first leader Pod still serves (the Lease and accounts were there at one replica),
        // not restarted.
        let serving = leaders.iter().find(|p| pods::is_ready(p)).expect("Ready");
        assert_eq!(serving.uid(), first[0].uid(), "the first leader Pod serves");
        let restarts = serving
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum::<i32>());
        assert_eq!(restarts, Some(0));
        // The member template is the one from before, and so are its Pods.
        let after = daemonsets.get(&member_set).await?;
        assert_eq!(
            after.spec.as_ref().map(|s| &s.template),
            before.spec.as_ref().map(|s| &s.template)
        );
        assert_eq!(after.metadata.generation, before.metadata.generation);
        let now = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        assert_eq!(uids(&now), uids(&members), "the same member Pods");
        wait_backend(
            &client,
            name,
            "Ready with 512Mi, ElectionObserved=True, RolloutComplete=True",
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && capacity(b) == Some(512 * MIB)
                    && has_condition(b, "ElectionObserved=True")
                    && has_condition(b, "RolloutComplete=True")
            },
        )
        .await?;
        // 3 desired / 1 ready is the finished state: RolloutComplete answers it, since the
        // Deployment's own progress deadline (which needs every replica available) is off.
        let leader_set: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
        let d = leader_set.get(&format!("{name}-leader")).await?;
        assert_eq!(
            d.spec.and_then(|s| s.progress_deadline_seconds),
            Some(i32::MAX)
        );
        remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn changing_the_election_backend_restarts_the_leader_and_lease_addressed_member_templates() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "claim-election";
        // Members that find the master through the Lease (their template carries the elector).
        let lease_addressed = |v: &mut serde_json::Value| {
            v["spec"]["connection"]["managed"]["leader"]["memberAddressing"] = "Lease".into();
        };
        let (leader, members) = ready_backend(&client, name, lease_addressed).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
        let leader_set = format!("{name}-leader");
        let before = deployments.get(&leader_set).await?;

        // electionBackend: None. The leader's template loses the elector and its account, the
        // members' loses the Lease lookup: both roll.
        apply(
            &client,
            &backend(name, |v| {
                lease_addressed(v);
                v["spec"]["connection"]["managed"]["leader"]["electionBackend"] = "None".into();
            }),
        )
        .await?;
        let gone_leader = leader[0].uid();
        let new_leader = pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "one Ready leader Pod, a new one",
            WAIT,
            |p| p.len() == 1 && pods::is_ready(&p[0]) && p[0].uid() != gone_leader,
        )
        .await?;
        let old = uids(&members);
        let new_members = pods::wait_pods(
            &store,
            &backend_pods(name, "member-0"),
            "2 Ready member Pods, none of the earlier ones",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().all(pods::is_ready)
                    && uids(p).iter().all(|u| !old.contains(u))
            },
        )
        .await?;
        let after = deployments.get(&leader_set).await?;
        assert_ne!(
            after.spec.as_ref().map(|s| &s.template),
            before.spec.as_ref().map(|s| &s.template)
        );
        let spec = new_leader[0].spec.as_ref().expect("a spec");
        assert!(
            spec.init_containers
                .as_ref()
                .is_none_or(|c| c.iter().all(|c| c.name != "elector-install")),
            "no elector in the new leader Pod"
        );
        for m in &new_members {
            let env = m
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "member"))
                .and_then(|c| c.env.clone())
                .unwrap_or_default();
            assert!(
                env.iter().any(|e| e.name == "MOONCAKE_MASTER"),
                "members now dial the Service: {}",
                name_of(m)
            );
        }
        wait_backend(
            &client,
            name,
            "Ready again with 512Mi, no ElectionObserved",
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && capacity(b) == Some(512 * MIB)
                    && condition(b, "ElectionObserved").is_none()
            },
        )
        .await?;
        remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_leader_template_change_under_election_costs_one_failover() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-one-failover";
        let two = |v: &mut serde_json::Value| {
            v["spec"]["connection"]["managed"]["leader"]["replicas"] = 2.into();
        };
        apply(&client, &backend(name, two)).await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), NAMESPACE);
        let lease = kvcache_render::objects::backend::leader_name(name);
        let holder = |l: &k8s_openapi::api::coordination::v1::Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty())
        };
        let first = holder(&leases.get(&lease).await?).expect("a holder before the change");
        // Every holder the Lease names from now on, in order, as a watch sees them.
        let watched = {
            use futures::StreamExt;
            let stream = kube::runtime::watcher::watcher(
                leases.clone(),
                kube::runtime::watcher::Config::default().fields(&format!("metadata.name={lease}")),
            );
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
            let into = seen.clone();
            let task = tokio::spawn(async move {
                let mut stream =
                    std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(stream));
                while let Some(Ok(l)) = stream.next().await {
                    if let Some(h) = holder(&l) {
                        let mut s = into.lock().unwrap_or_else(|p| p.into_inner());
                        if s.last() != Some(&h) {
                            s.push(h);
                        }
                    }
                }
            });
            (seen, task)
        };
        // A change of the leader's template (its environment): every old replica is replaced.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
        let before = deployments.get(&format!("{name}-leader")).await?;
        apply(
            &client,
            &backend(name, |v| {
                two(v);
                v["spec"]["connection"]["managed"]["leader"]["extraEnv"] =
                    serde_json::json!([{"name": "GLOG_v", "value": "0"}]);
            }),
        )
        .await?;
        let generation = before.metadata.generation.unwrap_or_default();
        kvcache_e2e::cluster::wait_object(
            &deployments,
            &format!("{name}-leader"),
            "the leader Deployment rolled: 2 updated replicas, no old one",
            WAIT,
            move |d| {
                let s = d.status.clone().unwrap_or_default();
                d.metadata.generation > Some(generation)
                    && s.observed_generation == d.metadata.generation
                    && s.updated_replicas == Some(2)
                    && s.replicas == Some(2)
            },
        )
        .await?;
        // The old replicas gone (the serving one stops its master first), a new one holds the
        // Lease, and the backend serves again.
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let replaced = pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "2 leader Pods of the new template, 1 Ready",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().filter(|p| pods::is_ready(p)).count() == 1
                    && p.iter().all(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec.as_ref().is_some_and(|s| {
                                s.containers
                                    .iter()
                                    .any(|c| c.env.iter().flatten().any(|e| e.name == "GLOG_v"))
                            })
                    })
            },
        )
        .await?;
        let gone = first.clone();
        kvcache_e2e::cluster::wait_object(&leases, &lease, "a new Lease holder", WAIT, move |l| {
            holder(l).is_some_and(|h| h != gone)
        })
        .await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        let (seen, task) = watched;
        task.abort();
        let mut holders: Vec<String> = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if holders.first() != Some(&first) {
            holders.insert(0, first.clone());
        }
        println!("Lease holders through the rollout: {holders:?}");
        // The rolling update deletes every old replica at once. The old leader stops its master
        // and releases the Lease; a Pod of the new template takes it. An old standby whose own
        // SIGTERM arrives after that release (its kubelet later than the leader's, seen once
        // under load) may take the released Lease first and hand it on at its SIGTERM: one more
        // handover within seconds, never two masters (every write is conditional). So: the
        // first holder the old leader, the last one of the new template, at most one old
        // standby between.
        let new_template: Vec<String> = replaced
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let last = holders.last().expect("a holder");
        assert!(
            new_template.contains(last),
            "the Lease ends on a Pod of the new template {new_template:?}, saw {holders:?}"
        );
        assert!(
            (2..=3).contains(&holders.len())
                && holders[1..holders.len() - 1]
                    .iter()
                    .all(|h| !new_template.contains(h) && *h != first),
            "one failover to the new template, at most one old standby between: saw {holders:?}"
        );
        remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The JSON log lines of a Pod's container (lines the store prints itself are skipped).
async fn json_log(
    store: &Api<Pod>,
    pod: &str,
    container: &str,
) -> Result<Vec<serde_json::Value>, Error> {
    Ok(pods::logs(store, pod, Some(container))
        .await?
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect())
}

/// Whether a member elector's log line says `message` (its start) about master `address`.
fn says(line: &serde_json::Value, message: &str, address: &str) -> bool {
    line["fields"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with(message))
        && line["fields"]["master"] == address
}

#[test]
fn a_lease_addressed_member_never_mounts_on_another_backends_master_published_at_its_leader_address()
 {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let lease_addressed = |v: &mut serde_json::Value| {
            v["spec"]["connection"]["managed"]["leader"]["memberAddressing"] = "Lease".into();
        };
        let (own, other) = ("dram-own-master", "dram-other-master");
        let (_, members) = ready_backend(&client, own, lease_addressed).await?;
        ready_backend(&client, other, lease_addressed).await?;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), NAMESPACE);
        let published = |l: &k8s_openapi::api::coordination::v1::Lease| {
            l.annotations()
                .get(kvcache_elector::lease::ADDRESS_ANNOTATION)
                .cloned()
        };
        let own_lease = kvcache_render::objects::backend::leader_name(own);
        let own_address = published(&leases.get(&own_lease).await?).expect("own address");
        let foreign = published(
            &leases
                .get(&kvcache_render::objects::backend::leader_name(other))
                .await?,
        )
        .expect("the other backend's address");

        // The other backend's master published on this backend's Lease, as a stale address
        // reused by another backend's new leader would be. Its own leader puts its address
        // back at its next renewal; the members see both, in order.
        leases
            .patch(
                &own_lease,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                    kvcache_elector::lease::ADDRESS_ANNOTATION: foreign
                }}})),
            )
            .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        for m in &members {
            let deadline = std::time::Instant::now() + WAIT;
            loop {
                let log = json_log(&store, name_of(m), "member").await?;
                if log.iter().any(|l| says(l, "not mounting", &foreign)) {
                    assert!(
                        !log.iter().any(|l| says(l, "member started", &foreign)),
                        "{}: a member started toward {foreign}: {log:#?}",
                        name_of(m)
                    );
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{}: no refusal to mount on {foreign} within {WAIT:?}: {log:#?}",
                    name_of(m)
                );
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
        // Both backends serve with their own members only: the same member Pods, never
        // restarted, on their own master's address.
        let gone = foreign.clone();
        kvcache_e2e::cluster::wait_object(
            &leases,
            &own_lease,
            "the own leader's address back on its Lease",
            WAIT,
            move |l| published(l).is_some_and(|a| a != gone),
        )
        .await?;
        wait_backend_ready(&client, own, 512 * MIB).await?;
        wait_backend_ready(&client, other, 512 * MIB).await?;
        let now = pods::wait_ready(&store, &backend_pods(own, "member-0"), 2, WAIT).await?;
        assert_eq!(uids(&now), uids(&members), "the same member Pods");
        for m in &now {
            let restarts: i32 = m
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or_default();
            assert_eq!(restarts, 0, "{}: no container restarted", name_of(m));
            let log = json_log(&store, name_of(m), "member").await?;
            let started: Vec<&serde_json::Value> = log
                .iter()
                .filter(|l| l["fields"]["message"] == "member started")
                .collect();
            assert!(
                started.len() == 1 && started[0]["fields"]["master"] == own_address.as_str(),
                "{}: one member start, toward {own_address}: {started:#?}",
                name_of(m)
            );
        }
        // A backend is Ready once its master reports the capacity, which can come before its
        // member Pods pass their readiness probe (`MembersMounted=Unknown/NoReadyMembers` until
        // then): wait for the verdict rather than read it once. A foreign member keeps it False.
        for backend in [own, other] {
            wait_backend(
                &client,
                backend,
                "MembersMounted=True: its own members mounted, nothing foreign",
                |b| has_condition(b, "MembersMounted=True"),
            )
            .await?;
        }
        remove_backend(&client, own).await?;
        remove_backend(&client, other).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
