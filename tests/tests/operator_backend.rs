//! The KVCacheBackend controller (`kvcache-operator run`) against the real API server and a
//! real Mooncake store. Until the harness has real nodes, the store runs as processes on
//! loopback and the operator reads it through `--store-address-override`; no Pod runs, so what
//! needs running member Pods (a named missing member, member recreation) waits for the nodes.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_api::{KVCacheBackend, KVCachePool};
use kvcache_e2e::cluster::wait_object;
use kvcache_e2e::operator::{Operator, SELECTOR_LABEL};
use kvcache_e2e::status::{describe, has_condition, phase, wait_event};
use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions, metric_sum};
use kvcache_e2e::{paths, shared};
use kvcache_render::objects::backend::OWNER_LABEL;

const SEGMENT: u64 = 64 << 20;
const WAIT: Duration = Duration::from_secs(45);

fn backend(ns: &str, name: &str, extra: &str) -> KVCacheBackend {
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}, labels: {{{SELECTOR_LABEL}: {ns}}}}}\nspec:\n{extra}  connection:\n    managed:\n      leader: {{}}\n      members:\n        - medium: DRAM\n          capacityPerMember: 64Mi\n          nodeSelector: {{kvcache: dram}}\n"
    ))
    .expect("backend manifest")
}

async fn create(client: &Client, b: &KVCacheBackend) {
    Api::<KVCacheBackend>::all(client.clone())
        .patch(
            &b.name_any(),
            &PatchParams::apply("kvcache-e2e").force(),
            &Patch::Apply(b),
        )
        .await
        .expect("backend applied");
}

/// Waits (on a watch) until the backend's status satisfies `ok`; fails naming `what` and the
/// last status seen.
async fn wait_backend(
    client: &Client,
    name: &str,
    what: &str,
    ok: impl Fn(&KVCacheBackend) -> bool,
) -> KVCacheBackend {
    let api: Api<KVCacheBackend> = Api::all(client.clone());
    wait_object(&api, name, what, WAIT, ok)
        .await
        .unwrap_or_else(|e| panic!("KVCacheBackend {e}"))
}

fn capacity(b: &KVCacheBackend) -> Option<String> {
    b.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .map(|c| c.total.as_str().to_owned())
}

async fn operator_namespace(client: &Client, prefix: &str) -> String {
    shared()
        .namespace(client, prefix)
        .await
        .expect("operator namespace")
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_comes_from_the_store_and_follows_it() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = operator_namespace(&client, "op-capacity").await;
    let dir = paths::scratch("op-capacity").expect("dir");
    let (d, kc, ns2) = (
        dir.clone(),
        cluster.control_plane.kubeconfig.clone(),
        ns.clone(),
    );
    let (master, members, operator) = tokio::task::spawn_blocking(move || {
        let master = Master::start(
            &d,
            MasterOptions {
                client_ttl: Some(3),
                ..Default::default()
            },
        )
        .expect("master");
        let opts = MemberOptions::new(master.address(), SEGMENT);
        let members = vec![
            Member::start(&d, &opts).expect("member 1"),
            Member::start(&d, &opts).expect("member 2"),
        ];
        master
            .wait_capacity(2 * SEGMENT, WAIT)
            .expect("both members mounted");
        let operator = Operator::builder(&kc, &ns2)
            .scoped(true)
            .overrides(&[format!("capacity-store=127.0.0.1:{}", master.metrics_port)])
            .start(&d)
            .expect("operator");
        (master, members, operator)
    })
    .await
    .expect("setup thread");
    let mut master = master;
    let mut members = members;

    create(&client, &backend(&ns, "capacity-store", "")).await;
    let b = wait_backend(&client, "capacity-store", "Ready with 128Mi", |b| {
        phase(b) == Some(BackendPhase::Ready) && capacity(b).as_deref() == Some("128Mi")
    })
    .await;
    let status = b.status.clone().expect("status");
    assert_eq!(
        status.endpoint.as_deref(),
        Some(format!("capacity-store-leader.{ns}.svc:50051").as_str())
    );
    assert_eq!(status.members.len(), 2, "one row per registered segment");
    assert!(
        has_condition(&b, "LeaderAvailable=True/Serving"),
        "{}",
        describe(&b)
    );
    assert!(
        has_condition(&b, "ElectionObserved=Unknown"),
        "no elector runs without nodes, the Lease has no holder: {}",
        describe(&b)
    );

    // The rendered objects carry the backend's ownership label and owner reference.
    let uid = b.uid().expect("uid");
    let owned = ListParams::default().labels(&format!("{OWNER_LABEL}={uid}"));
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns)
        .list(&owned)
        .await
        .expect("deployments");
    assert_eq!(deployments.items.len(), 1);
    let leader = &deployments.items[0];
    assert_eq!(leader.name_any(), "capacity-store-leader");
    assert_eq!(
        leader.owner_references().first().map(|o| o.uid.as_str()),
        Some(uid.as_str())
    );
    let daemons = Api::<DaemonSet>::namespaced(client.clone(), &ns)
        .list(&owned)
        .await
        .expect("daemonsets");
    assert_eq!(daemons.items.len(), 1);

    // A member leaves: the figure follows the store, not the spec.
    let gone = members.pop().expect("a member");
    drop(gone);
    wait_backend(
        &client,
        "capacity-store",
        "capacity 64Mi after a member left",
        |b| capacity(b).as_deref() == Some("64Mi"),
    )
    .await;

    // The master dies: no capacity while nothing serves (absent, not zero), then it returns.
    master.proc.kill();
    let b = wait_backend(
        &client,
        "capacity-store",
        "no capacity while the master is down",
        |b| {
            capacity(b).is_none()
                && matches!(
                    phase(b),
                    Some(BackendPhase::Error | BackendPhase::Provisioning)
                )
        },
    )
    .await;
    assert!(
        has_condition(&b, "LeaderAvailable=False"),
        "{}",
        describe(&b)
    );
    let m = tokio::task::spawn_blocking(move || {
        master.restart().expect("master restarts");
        master
    })
    .await
    .expect("restart thread");
    wait_backend(
        &client,
        "capacity-store",
        "Ready again after the restart",
        |b| phase(b) == Some(BackendPhase::Ready) && capacity(b).as_deref() == Some("64Mi"),
    )
    .await;

    // Events a user sees in `kubectl describe`: recorded by the reconciles whose status was
    // seen, and listed until they are there rather than once.
    for want in ["BackendReady", "CapacityChanged"] {
        wait_event(&client, "capacity-store", want, "", WAIT)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // A reconcile is counted when it ends, after the status it wrote can be seen.
    let mut operator = operator;
    tokio::task::block_in_place(|| {
        operator.wait_metrics("a reconcile of the backend controller counted", WAIT, |t| {
            metric_sum(
                t,
                "kvcache_operator_reconciles_total",
                &[("controller", "kvcachebackend")],
            )
            .is_some_and(|n| n > 0.0)
        })
    })
    .unwrap_or_else(|e| panic!("{e}"));
    drop((m, members, operator));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setting_change_rolls_only_backends_without_their_own_image() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = operator_namespace(&client, "op-setting").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let setting = |image: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some("gpustack-settings".into()),
            ..Default::default()
        },
        data: Some([("kv-cache-backend-image".to_owned(), image.to_owned())].into()),
        ..Default::default()
    };
    maps.create(&PostParams::default(), &setting("example.local/store:a"))
        .await
        .expect("settings");
    let dir = paths::scratch("op-setting").expect("dir");
    let (kc, ns2) = (cluster.control_plane.kubeconfig.clone(), ns.clone());
    let operator = tokio::task::spawn_blocking(move || {
        Operator::builder(&kc, &ns2)
            .scoped(true)
            .start(&dir)
            .expect("operator")
    })
    .await
    .expect("thread");
    create(&client, &backend(&ns, "follows-setting", "")).await;
    create(
        &client,
        &backend(&ns, "pinned-image", "  image: example.local/store:pinned\n"),
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let image_of = |d: &Deployment| {
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.containers.first())
            .and_then(|c| c.image.clone())
    };
    let wait_image = |name: &'static str, want: &'static str| {
        let api = deployments.clone();
        async move {
            let cond = move |d: Option<&Deployment>| {
                d.and_then(|d| {
                    d.spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .and_then(|p| p.containers.first())
                        .and_then(|c| c.image.clone())
                })
                .as_deref()
                    == Some(want)
            };
            tokio::time::timeout(WAIT, await_condition(api, name, cond))
                .await
                .unwrap_or_else(|_| panic!("waited {WAIT:?} for Deployment {name} to run {want}"))
                .expect("watch");
        }
    };
    wait_image("follows-setting-leader", "example.local/store:a").await;
    wait_image("pinned-image-leader", "example.local/store:pinned").await;
    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let hash = |d: &DaemonSet| {
        d.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("kvcache.gpustack.ai/pod-spec-hash").cloned())
    };
    let exists = |name: &'static str| {
        let api = daemons.clone();
        async move {
            tokio::time::timeout(
                WAIT,
                await_condition(api, name, |d: Option<&DaemonSet>| d.is_some()),
            )
            .await
            .unwrap_or_else(|_| panic!("waited {WAIT:?} for DaemonSet {name}"))
            .expect("watch")
            .expect("exists")
        }
    };
    let pinned_before = exists("pinned-image-member-0").await;
    let follows_before = exists("follows-setting-member-0").await;

    maps.patch(
        "gpustack-settings",
        &PatchParams::apply("kvcache-e2e").force(),
        &Patch::Apply(&setting("example.local/store:b")),
    )
    .await
    .expect("setting changed");
    wait_image("follows-setting-leader", "example.local/store:b").await;
    // Its members roll: the DaemonSet (applied after the leader) gets a new fingerprint.
    let before_hash = hash(&follows_before);
    let follows_after = tokio::time::timeout(
        WAIT,
        await_condition(
            daemons.clone(),
            "follows-setting-member-0",
            move |d: Option<&DaemonSet>| {
                d.and_then(|d| {
                    d.spec
                        .as_ref()
                        .and_then(|s| s.template.metadata.as_ref())
                        .and_then(|m| m.annotations.as_ref())
                        .and_then(|a| a.get("kvcache.gpustack.ai/pod-spec-hash").cloned())
                })
                .is_some_and(|h| Some(h) != before_hash)
            },
        ),
    )
    .await
    .expect("waited for the following member DaemonSet's new fingerprint")
    .expect("watch")
    .expect("exists");
    let pinned_after = daemons.get("pinned-image-member-0").await.expect("pinned");
    assert_eq!(
        hash(&pinned_before),
        hash(&pinned_after),
        "a pinned backend does not roll"
    );
    assert_eq!(
        pinned_before.metadata.generation, pinned_after.metadata.generation,
        "the pinned DaemonSet was not rewritten"
    );
    let pinned_leader = deployments
        .get("pinned-image-leader")
        .await
        .expect("leader");
    assert_eq!(
        image_of(&pinned_leader).as_deref(),
        Some("example.local/store:pinned")
    );

    // A widened nodeSelector changes no fingerprint; an edit that changes the Pod does.
    let widened = backend(&ns, "follows-setting", "").clone();
    let mut widened = widened;
    if let Some(m) = widened.spec.connection.managed.as_mut() {
        m.members[0].node_selector.clear();
    }
    create(&client, &widened).await;
    let ds_cond = |want_change: bool, before: Option<String>| {
        move |d: Option<&DaemonSet>| {
            let Some(d) = d else { return false };
            let selector_gone = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .is_some_and(|p| p.node_selector.as_ref().is_none_or(|n| n.is_empty()));
            let h = d
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get("kvcache.gpustack.ai/pod-spec-hash").cloned());
            selector_gone && (h != before) == want_change
        }
    };
    tokio::time::timeout(
        WAIT,
        await_condition(
            daemons.clone(),
            "follows-setting-member-0",
            ds_cond(false, hash(&follows_after)),
        ),
    )
    .await
    .expect("the widened selector is applied without a new fingerprint")
    .expect("watch");
    drop(operator);
}

/// The RBAC objects of `deploy/operator.yaml`, rendered for `ns`.
async fn install_rbac(client: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let pp = PatchParams::apply("kvcache-e2e").force();
    for doc in kvcache_render::install::operator(ns, "example.local/operator:1").expect("renders") {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        macro_rules! put {
            ($t:ty, $api:expr) => {{
                let o: $t = serde_yaml::from_value(doc.clone()).expect("object");
                $api.patch(&o.name_any(), &pp, &Patch::Apply(&o))
                    .await
                    .unwrap_or_else(|e| panic!("{kind}: {e}"));
            }};
        }
        match kind.as_str() {
            "ServiceAccount" => put!(
                ServiceAccount,
                Api::<ServiceAccount>::namespaced(client.clone(), ns)
            ),
            "ClusterRole" => put!(ClusterRole, Api::<ClusterRole>::all(client.clone())),
            "ClusterRoleBinding" => put!(
                ClusterRoleBinding,
                Api::<ClusterRoleBinding>::all(client.clone())
            ),
            "Role" => put!(Role, Api::<Role>::namespaced(client.clone(), ns)),
            "RoleBinding" => put!(
                RoleBinding,
                Api::<RoleBinding>::namespaced(client.clone(), ns)
            ),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deletion_waits_for_the_pool_and_a_restart_converges_without_duplicates() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = operator_namespace(&client, "op-delete").await;
    let dir = paths::scratch("op-delete").expect("dir");
    // This operator runs as the installation's ServiceAccount with exactly the installation's
    // RBAC: everything below must work within it.
    install_rbac(&client, &ns).await;
    let kc = cluster
        .control_plane
        .user_kubeconfig(
            &format!("system:serviceaccount:{ns}:kvcache-operator"),
            "system:serviceaccounts",
        )
        .expect("the operator's identity");
    let ns2 = ns.clone();
    let mut operator = tokio::task::spawn_blocking(move || {
        Operator::builder(&kc, &ns2)
            .scoped(true)
            .start(&dir)
            .expect("operator")
    })
    .await
    .expect("thread");
    let two_groups = format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: held-store, labels: {{{SELECTOR_LABEL}: {ns}}}}}\nspec:\n  image: example.local/store:1\n  connection:\n    managed:\n      leader: {{}}\n      members:\n        - {{medium: DRAM, capacityPerMember: 64Mi}}\n        - {{medium: DRAM, capacityPerMember: 32Mi}}\n"
    );
    let b: KVCacheBackend = serde_yaml::from_str(&two_groups).expect("backend");
    create(&client, &b).await;
    let b = wait_backend(
        &client,
        "held-store",
        "its finalizer and first status",
        |b| {
            b.finalizers()
                .iter()
                .any(|f| f == "kvcache.gpustack.ai/teardown")
                && b.status.is_some()
        },
    )
    .await;
    let uid = b.uid().expect("uid");
    let owned = ListParams::default().labels(&format!("{OWNER_LABEL}={uid}"));
    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let count = |api: Api<DaemonSet>, want: usize| {
        let owned = owned.clone();
        async move {
            for _ in 0..450 {
                if api.list(&owned).await.expect("list").items.len() == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("waited 45s for {want} member DaemonSets of held-store");
        }
    };
    count(daemons.clone(), 2).await;

    // The last group removed: its DaemonSet is pruned, found by the ownership label.
    let one_group: KVCacheBackend = serde_yaml::from_str(
        &two_groups.replace("        - {medium: DRAM, capacityPerMember: 32Mi}\n", ""),
    )
    .expect("backend");
    create(&client, &one_group).await;
    count(daemons.clone(), 1).await;

    // A restarted operator converges on the same objects: nothing duplicated, nothing lost.
    let member_names = || async {
        daemons
            .list(&owned)
            .await
            .expect("list")
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<String>>()
    };
    let before = member_names().await;
    let mut op = tokio::task::spawn_blocking(move || {
        operator.restart().expect("operator restarts");
        operator
    })
    .await
    .expect("thread");
    // An edit after the restart: the new process must observe its generation.
    let edited: KVCacheBackend = serde_yaml::from_str(
        &two_groups
            .replace("        - {medium: DRAM, capacityPerMember: 32Mi}\n", "")
            .replace(
                "{medium: DRAM, capacityPerMember: 64Mi}",
                "{medium: DRAM, capacityPerMember: 64Mi, nodeSelector: {kvcache: 'true'}}",
            ),
    )
    .expect("backend");
    create(&client, &edited).await;
    let generation = Api::<KVCacheBackend>::all(client.clone())
        .get("held-store")
        .await
        .expect("backend")
        .metadata
        .generation;
    wait_backend(
        &client,
        "held-store",
        "the restarted operator observing the edit",
        |b| b.status.as_ref().and_then(|s| s.observed_generation) == generation,
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert_eq!(deployments.list(&owned).await.expect("list").items.len(), 1);
    assert_eq!(before, member_names().await);

    // A pool on it holds the deletion, and the status names the pool.
    let pool: KVCachePool = serde_yaml::from_str(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: holds-the-store}\nspec: {backends: [held-store], quota: {total: 1Gi}}\n",
    )
    .expect("pool");
    let pools: Api<KVCachePool> = Api::all(client.clone());
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("pool");
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    backends
        .delete("held-store", &DeleteParams::default())
        .await
        .expect("delete requested");
    let b = wait_backend(&client, "held-store", "Deleting, naming the pool", |b| {
        phase(b) == Some(BackendPhase::Deleting)
            && b.status
                .as_ref()
                .and_then(|s| s.phase_message.as_deref())
                .is_some_and(|m| m.contains("KVCachePool holds-the-store"))
    })
    .await;
    assert!(
        has_condition(&b, "Deletable=False/InUse"),
        "{}",
        describe(&b)
    );
    assert_eq!(
        deployments.list(&owned).await.expect("list").items.len(),
        1,
        "the workloads keep running while held"
    );
    pools
        .delete("holds-the-store", &DeleteParams::default())
        .await
        .expect("pool deleted");
    tokio::time::timeout(
        Duration::from_secs(90),
        await_condition(
            backends.clone(),
            "held-store",
            kube::runtime::conditions::is_deleted(&uid),
        ),
    )
    .await
    .expect("the backend goes once the pool is gone")
    .expect("watch");
    assert!(
        deployments
            .list(&owned)
            .await
            .expect("list")
            .items
            .is_empty(),
        "the leader went first"
    );
    assert!(daemons.list(&owned).await.expect("list").items.is_empty());
    op.stop(Duration::from_secs(5));
}
