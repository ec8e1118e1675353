//! The operator against store Pods on real nodes: `kvcache-operator run` (as from a Pod: in a
//! node's network, resolving the leader Service's DNS name through the cluster DNS) reconciles
//! demo-size backends whose leader and members the kubelets run from the local images.
//! One operator and one two-node cluster per test binary; each test has its own backend.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::ListParams;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCacheBackend, KVCachePool};
use kvcache_e2e::cluster::{block_on, client_from, crds_dir, install_crds, wait_object};
use kvcache_e2e::nodes::{self, NodeCluster};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::walkthrough::{self, backend_pods};
use kvcache_e2e::{Error, paths};
use kvcache_render::backend::OWNER_LABEL;

const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;
/// Where the operator runs the store workloads.
const NAMESPACE: &str = "gpustack-system";

/// The cluster with the CRDs and one operator (every controller).
fn cluster() -> &'static NodeCluster {
    operator();
    nodes::shared()
}

/// The binary's one operator (started with the cluster).
fn operator() -> &'static Mutex<Operator> {
    static OPERATOR: OnceLock<Result<Mutex<Operator>, String>> = OnceLock::new();
    let cluster = nodes::shared();
    let op = OPERATOR.get_or_init(|| {
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            install_crds(&client, &crds_dir()).await?;
            walkthrough::ensure_namespace(&client, NAMESPACE).await
        })
        .map_err(|e| e.to_string())?;
        let dir = paths::scratch("operator-on-nodes").map_err(|e| e.to_string())?;
        Operator::start_on_nodes(&cluster.nodes, NAMESPACE, &dir)
            .map(Mutex::new)
            .map_err(|e| e.to_string())
    });
    match op {
        Ok(op) => op,
        Err(e) => panic!("the operator could not start on the nodes: {e}"),
    }
}

/// The image the tests' backends name themselves, so that only the setting test's backend
/// follows the cluster setting (the render's default, as a user would write it).
const PINNED_IMAGE: &str = kvcache_api::settings::DEFAULT_BACKEND_IMAGE;

/// The walkthrough's backend at demo size under `name`, with its image pinned, changed by
/// `edit`.
fn backend(name: &str, edit: impl Fn(&mut serde_json::Value)) -> KVCacheBackend {
    let text =
        std::fs::read_to_string(walkthrough::examples("walkthrough").join("01-backend.yaml"))
            .expect("the walkthrough's backend");
    let mut v: serde_json::Value = serde_yaml::from_str(&text).expect("YAML");
    v["metadata"]["name"] = name.into();
    v["spec"]["image"] = PINNED_IMAGE.into();
    v["spec"]["connection"]["managed"]["members"][0]["capacityPerMember"] =
        walkthrough::DEMO_CAPACITY_PER_MEMBER.into();
    edit(&mut v);
    serde_json::from_value(v).expect("a KVCacheBackend")
}

async fn apply(client: &Client, b: &KVCacheBackend) -> Result<(), Error> {
    Api::<KVCacheBackend>::all(client.clone())
        .patch(
            &b.name_any(),
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(b),
        )
        .await?;
    Ok(())
}

async fn wait_backend(
    client: &Client,
    name: &str,
    what: &str,
    ok: impl Fn(&KVCacheBackend) -> bool,
) -> Result<KVCacheBackend, Error> {
    let api: Api<KVCacheBackend> = Api::all(client.clone());
    wait_object(&api, name, what, WAIT, ok).await
}

fn capacity(b: &KVCacheBackend) -> Option<u64> {
    b.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| parse_bytes(&c.total.0).ok())
}

fn phase(b: &KVCacheBackend) -> Option<BackendPhase> {
    b.status.as_ref().and_then(|s| s.phase)
}

/// A condition's status, reason and message.
fn condition(b: &KVCacheBackend, t: &str) -> Option<(String, String, String)> {
    b.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

fn signal(pids: &[i32], sig: nix::sys::signal::Signal) {
    for pid in pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), sig);
    }
}

#[test]
fn the_walkthrough_backend_is_ready_with_what_its_members_mounted_and_degraded_names_a_stopped_member()
 {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-ready";
        apply(&client, &backend(name, |_| {})).await?;
        let b = wait_backend(&client, name, "Ready with 512Mi from two members", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let status = b.status.expect("a status");
        assert_eq!(status.members.len(), 2, "{:?}", status.members);
        assert_eq!(status.store_version.as_deref(), Some("0.3.13.post1"));
        assert_eq!(
            status.endpoint.as_deref(),
            Some(format!("{name}-leader.{NAMESPACE}.svc:50051").as_str())
        );

        // One member stops (its processes frozen; the Pod stays Ready, the master drops its
        // segment after the client TTL): Degraded, naming that member.
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        let stopped = &members[0];
        let pids = pods::host_pids(stopped);
        signal(&pids, nix::sys::signal::Signal::SIGSTOP);
        let degraded = wait_backend(
            &client,
            name,
            "Degraded, MembersMounted=False naming the stopped member",
            |b| {
                phase(b) == Some(BackendPhase::Degraded)
                    && condition(b, "MembersMounted")
                        .is_some_and(|(s, _, m)| s == "False" && m.contains(name_of(stopped)))
            },
        )
        .await;
        signal(&pids, nix::sys::signal::Signal::SIGCONT);
        let degraded = degraded?;
        assert_eq!(
            capacity(&degraded),
            Some(256 * MIB),
            "the store's own figure"
        );

        // It continues, remounts on its heartbeat: Ready again with both.
        wait_backend(&client, name, "Ready again with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn three_leader_replicas_read_three_desired_one_ready_and_a_failover_keeps_the_phase_honest() {
    let _turn = FAILOVER.lock().unwrap_or_else(|p| p.into_inner());
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
                && condition(b, "ElectionObserved").is_some_and(|(s, _, _)| s == "True")
        })
        .await?;
        let (_, _, message) = condition(&b, "LeaderAvailable").expect("LeaderAvailable");
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
fn a_member_fingerprint_change_recreates_exactly_its_pods_and_a_wider_selector_none() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-roll";
        apply(&client, &backend(name, |_| {})).await?;
        wait_backend(&client, name, "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let selector = backend_pods(name, "member-0");
        let before: Vec<String> = pods::wait_ready(&store, &selector, 2, WAIT)
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect();

        // Another node selector that selects the same nodes: no member Pod is recreated.
        apply(
            &client,
            &backend(name, |v| {
                v["spec"]["connection"]["managed"]["members"][0]["nodeSelector"] =
                    serde_json::json!({"kvcache": "true"});
            }),
        )
        .await?;
        wait_backend(&client, name, "the edit observed", |b| {
            b.status.as_ref().and_then(|s| s.observed_generation) == b.metadata.generation
        })
        .await?;
        let after: Vec<String> = pods::wait_ready(&store, &selector, 2, WAIT)
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect();
        assert_eq!(before, after, "a selector change recreates no member Pod");

        // Less capacity per member: the fingerprint moves, both Pods are replaced and the
        // store reports the new figure.
        apply(
            &client,
            &backend(name, |v| {
                let g = &mut v["spec"]["connection"]["managed"]["members"][0];
                g["nodeSelector"] = serde_json::json!({"kvcache": "true"});
                g["capacityPerMember"] = "128Mi".into();
            }),
        )
        .await?;
        // Both member Pods replaced (the operator deletes exactly the stale ones)...
        let replaced = pods::wait_pods(
            &store,
            &selector,
            "2 Ready member Pods, none of the earlier ones",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().all(|p| {
                        pods::is_ready(p) && !before.contains(&p.uid().unwrap_or_default())
                    })
            },
        )
        .await?;
        assert_eq!(replaced.len(), 2);
        // ... and the store's figure is theirs: 2 x 128 MiB in two member rows.
        wait_backend(
            &client,
            name,
            "Ready with 256Mi from the replaced members",
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && capacity(b) == Some(256 * MIB)
                    && b.status.as_ref().is_some_and(|s| s.members.len() == 2)
            },
        )
        .await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The store image by another name that carries the same master (the engine stand-in is layered
/// on the store image): what the setting is changed to.
const OTHER_STORE_IMAGE: &str = "localhost/kvcache/engine:mooncake-0.3.13.post1";

fn image_of(p: &Pod) -> Option<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
}

#[test]
fn a_setting_change_rolls_the_pods_of_backends_without_their_own_image_only() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let (follows, pinned) = ("dram-follows", "dram-pinned");
        apply(
            &client,
            &backend(follows, |v| {
                // The walkthrough's own choice: no image, the cluster setting decides.
                if let Some(spec) = v["spec"].as_object_mut() {
                    spec.remove("image");
                }
            }),
        )
        .await?;
        apply(&client, &backend(pinned, |_| {})).await?;
        for name in [follows, pinned] {
            wait_backend(&client, name, "Ready with 512Mi", |b| {
                phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
            })
            .await?;
        }
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let uids = |p: &[Pod]| {
            p.iter()
                .map(|p| p.uid().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        let pinned_before =
            pods::wait_ready(&store, &backend_pods(pinned, "member-0"), 2, WAIT).await?;

        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
        let setting = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": kvcache_api::settings::SETTINGS_CONFIG_MAP},
            "data": {"kv-cache-backend-image": OTHER_STORE_IMAGE},
        });
        maps.patch(
            kvcache_api::settings::SETTINGS_CONFIG_MAP,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&setting),
        )
        .await?;
        // The unpinned backend's leader and members run the new image, and it is Ready again.
        for component in ["leader", "member-0"] {
            let want = if component == "leader" { 1 } else { 2 };
            pods::wait_pods(
                &store,
                &backend_pods(follows, component),
                &format!("{want} Ready on {OTHER_STORE_IMAGE}"),
                WAIT,
                |p| {
                    p.len() == want
                        && p.iter().all(|p| {
                            pods::is_ready(p) && image_of(p).as_deref() == Some(OTHER_STORE_IMAGE)
                        })
                },
            )
            .await?;
        }
        wait_backend(&client, follows, "Ready with 512Mi on the new image", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        // The pinned one: the same member Pods, on its own image.
        let pinned_after =
            pods::wait_ready(&store, &backend_pods(pinned, "member-0"), 2, WAIT).await?;
        assert_eq!(uids(&pinned_before), uids(&pinned_after));
        assert!(
            pinned_after
                .iter()
                .all(|p| image_of(p).as_deref() == Some(PINNED_IMAGE))
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_backend_a_pool_uses_stays_deleting_naming_it_and_goes_with_its_pods_after() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-held";
        apply(&client, &backend(name, |_| {})).await?;
        wait_backend(&client, name, "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let pool: KVCachePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
            "metadata": {"name": "holds-dram-held"},
            "spec": {"backends": [name], "quota": {"total": "256Mi"}},
        }))
        .expect("a pool");
        let pools: Api<KVCachePool> = Api::all(client.clone());
        pools
            .patch(
                "holds-dram-held",
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(&pool),
            )
            .await?;
        wait_backend(&client, name, "usedBy naming the pool", |b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.used_by.iter().any(|u| u.name == "holds-dram-held"))
        })
        .await?;

        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        backends.delete(name, &DeleteParams::default()).await?;
        let held = wait_backend(&client, name, "Deleting, naming the pool", |b| {
            phase(b) == Some(BackendPhase::Deleting)
                && condition(b, "Deletable")
                    .is_some_and(|(s, _, m)| s == "False" && m.contains("holds-dram-held"))
        })
        .await?;
        assert!(held.metadata.deletion_timestamp.is_some());
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;

        // The pool goes: so does the backend, with its workloads and their Pods.
        pools
            .delete("holds-dram-held", &DeleteParams::default())
            .await?;
        tokio::time::timeout(
            WAIT,
            kube::runtime::wait::await_condition(
                backends.clone(),
                name,
                kube::runtime::wait::conditions::is_deleted(&held.uid().unwrap_or_default()),
            ),
        )
        .await
        .map_err(|_| Error::Wait {
            what: format!("{name}: gone once its pool is"),
            reason: "still there".into(),
        })?
        .map_err(|e| Error::Wait {
            what: format!("{name}: gone once its pool is"),
            reason: e.to_string(),
        })?;
        for component in ["leader", "member-0"] {
            pods::wait_pods(
                &store,
                &backend_pods(name, component),
                "no Pods left",
                WAIT,
                |p| p.is_empty(),
            )
            .await?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_operator_restarted_mid_way_converges_with_no_duplicate_or_orphan() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let name = "dram-restart";
    let kc2 = kc.clone();
    block_on(async move {
        let client = client_from(&kc2).await?;
        apply(&client, &backend(name, |_| {})).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // Restarted while it renders the new backend.
    operator()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .restart()
        .unwrap_or_else(|e| panic!("the operator restarts: {e}"));
    block_on(async move {
        let client = client_from(&kc).await?;
        let b = wait_backend(&client, name, "Ready with 512Mi after the restart", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let owned =
            ListParams::default().labels(&format!("{OWNER_LABEL}={}", b.uid().unwrap_or_default()));
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
        let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
        let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
        assert_eq!(
            deployments.list(&owned).await?.items.len(),
            1,
            "one leader Deployment"
        );
        assert_eq!(
            daemons.list(&owned).await?.items.len(),
            1,
            "one member DaemonSet"
        );
        assert_eq!(
            services.list(&owned).await?.items.len(),
            1,
            "one leader Service"
        );
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
        pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A condition's status and reason in any status with a `conditions` list.
fn has_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
    status: &str,
    reason: &str,
) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == t && c.status == status && c.reason == reason)
}

/// The walkthrough's role asks for one GPU per replica and the nodes offer two in all: the
/// tests that run it take turns.
static GPUS: Mutex<()> = Mutex::new(());

/// Deletes a ModelDeployment and waits until its Pods are gone (their GPUs free).
async fn remove_model(client: &Client, ns: &str, name: &str) -> Result<(), Error> {
    walkthrough::remove_model(client, ns, name, WAIT).await
}

#[test]
fn the_walkthrough_applied_in_creation_order_converges_on_real_pods() {
    use kvcache_api::{KVCachePoolBinding, ModelDeployment};
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-in-order")?;
        let manifests = walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |_| true)?;
        // Each file in turn, as `kubectl apply -f 00-… -f 01-… …` would.
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }

        // The store: Ready with what its two members mounted.
        wait_backend(&client, "mooncake-dram", "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        // The Binding: granted what the master recut (its ceiling is 8Gi, the store 512Mi).
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-a");
        // The master recuts as members mount: a grant read while one of the two had mounted is
        // 256Mi, and the pool reads the ledger again on its interval (15 s), so wait for the
        // figure of both.
        let binding = wait_object(&bindings, "team-a", "QuotaGranted=True/Recut at 512Mi (8Gi asked of 512Mi)", WAIT, |b| {
            b.status.as_ref().is_some_and(|s| {
                has_condition(&s.conditions, "QuotaGranted", "True", "Recut")
                    && s.effective_quota.as_ref().and_then(|q| parse_bytes(&q.0).ok()) == Some(512 * MIB)
            })
        })
        .await?;
        let granted = parse_bytes(&binding.status.as_ref().and_then(|s| s.effective_quota.clone()).expect("a figure").0).expect("bytes");
        assert_eq!(granted, 512 * MIB, "the only tenant: the master recuts its 8Gi to all 512Mi");
        // The master's own ledger says the same.
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        let out = pods::exec(&store, name_of(&members[0]), None, &[
            "python3", "-c",
            "import sys, json, urllib.request; d = json.load(urllib.request.urlopen(sys.argv[1], timeout=3)); print([t['effective_quota_bytes'] for t in d['data'] if t['tenant_id'] == 'default'][0])",
            &format!("http://mooncake-dram-leader.{NAMESPACE}.svc:9003/api/v1/tenant_quotas"),
        ]).await?;
        assert_eq!(out.stdout.trim(), granted.to_string(), "{out:?}");

        // The workload: its Pods (the stand-in as vLLM) write under tenant default, and the
        // deployment reports the cache attached from what the store charged.
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-a");
        wait_object(&models, "qwen-chat", "CacheAttached=True/CacheActive, InstanceTypesResolved=True", WAIT, |m| {
            m.status.as_ref().is_some_and(|s| {
                has_condition(&s.conditions, "CacheAttached", "True", "CacheActive")
                    && has_condition(&s.conditions, "InstanceTypesResolved", "True", "Resolved")
            })
        })
        .await?;
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-a");
        for e in pods::wait_ready(&team, &walkthrough::role_pods("qwen-chat", "server"), 2, WAIT).await? {
            let log = pods::wait_log(&team, name_of(&e), None, "get key=", WAIT).await?;
            assert!(log.contains("tenant default") && log.contains("exist=1"), "{log}");
        }
        remove_model(&client, "team-a", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_walkthrough_applied_in_reverse_order_reports_what_is_missing_then_converges() {
    use kvcache_api::{KVCachePoolBinding, ModelDeployment};
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-reversed")?;
        // Its own names, beside the creation-order run: backend, pool, namespace and Binding.
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                match v["kind"].as_str() {
                    Some("Namespace") => v["metadata"]["name"] = "team-b".into(),
                    Some("KVCacheBackend") => v["metadata"]["name"] = "mooncake-rev".into(),
                    Some("KVCachePool") => {
                        v["metadata"]["name"] = "shared-rev".into();
                        v["spec"]["backends"] = serde_json::json!(["mooncake-rev"]);
                    }
                    Some("KVCachePoolBinding") => {
                        v["metadata"]["name"] = "team-b".into();
                        v["metadata"]["namespace"] = "team-b".into();
                        v["spec"]["poolRef"]["name"] = "shared-rev".into();
                    }
                    Some("ModelDeployment") => {
                        v["metadata"]["namespace"] = "team-b".into();
                        v["spec"]["kvCache"]["poolRef"]["name"] = "team-b".into();
                        v["spec"]["roles"][0]["instanceType"] = "gpu-a10-24g-rev".into();
                    }
                    Some("InstanceType") => v["metadata"]["name"] = "gpu-a10-24g-rev".into(),
                    _ => {}
                }
                true
            })?;
        let mut files = walkthrough::manifest_files(&manifests)?;
        files.reverse();
        let apply_file = |f: std::path::PathBuf| {
            let client = client.clone();
            async move { walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await }
        };
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-b");
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-b");
        let pools: Api<KVCachePool> = Api::all(client.clone());
        // 05 the ModelDeployment: no InstanceType and no Binding yet.
        apply_file(files[0].clone()).await?;
        wait_object(
            &models,
            "qwen-chat",
            "BindingNotFound and InstanceTypeNotFound",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    has_condition(
                        &s.conditions,
                        "DomainRegistered",
                        "False",
                        "BindingNotFound",
                    ) && has_condition(
                        &s.conditions,
                        "InstanceTypesResolved",
                        "False",
                        "InstanceTypeNotFound",
                    )
                })
            },
        )
        .await?;
        // 04 the InstanceType.
        apply_file(files[1].clone()).await?;
        wait_object(
            &models,
            "qwen-chat",
            "InstanceTypesResolved=True",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "InstanceTypesResolved", "True", "Resolved")
                })
            },
        )
        .await?;
        // 03 the Binding: no pool yet.
        apply_file(files[2].clone()).await?;
        wait_object(
            &bindings,
            "team-b",
            "QuotaObserved=False/PoolNotFound",
            WAIT,
            |b| {
                b.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "QuotaObserved", "False", "PoolNotFound")
                })
            },
        )
        .await?;
        // 02 the pool: no backend yet.
        apply_file(files[3].clone()).await?;
        wait_object(
            &pools,
            "shared-rev",
            "BackendResolved=False/BackendNotFound",
            WAIT,
            |p| {
                p.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "BackendResolved", "False", "BackendNotFound")
                })
            },
        )
        .await?;
        // 01 the backend (00 the namespace exists already): everything converges.
        apply_file(files[4].clone()).await?;
        apply_file(files[5].clone()).await?;
        wait_backend(&client, "mooncake-rev", "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        wait_object(&bindings, "team-b", "QuotaGranted=True", WAIT, |b| {
            b.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "QuotaGranted" && c.status == "True")
            })
        })
        .await?;
        wait_object(
            &models,
            "qwen-chat",
            "CacheAttached=True/CacheActive",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "CacheAttached", "True", "CacheActive")
                })
            },
        )
        .await?;
        remove_model(&client, "team-b", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_sglang_deployment_on_another_store_line_is_refused_and_no_pod_starts() {
    use kvcache_api::ModelDeployment;
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-sglang")?;
        // The walkthrough with SGLang 0.5.18 (its runner carries the 0.3.12.post1 client) against
        // the 0.3.13.post1 store, under names of its own.
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "sgl");
                if v["kind"] == "ModelDeployment" {
                    v["spec"]["engine"] =
                        serde_json::json!({"name": "SGLang", "version": "0.5.18"});
                }
                true
            })?;
        let mut objects = Vec::new();
        for f in walkthrough::manifest_files(&manifests)? {
            objects.extend(walkthrough::read_objects(&f)?);
        }
        walkthrough::apply(&client, &objects).await?;
        wait_backend(
            &client,
            "mooncake-sgl",
            "Ready with the store's version observed",
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && b.status.as_ref().and_then(|s| s.store_version.as_deref())
                        == Some("0.3.13.post1")
            },
        )
        .await?;
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-sgl");
        let refused = wait_object(
            &models,
            "qwen-chat",
            "a False condition StoreVersionMismatch",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.status == "False" && c.reason == "StoreVersionMismatch")
                })
            },
        )
        .await?;
        let message = refused
            .status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.reason == "StoreVersionMismatch")
            })
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            message.contains("0.3.13") && message.contains("0.3.12"),
            "{message}"
        );
        // Nothing runs with a connector that would fail every write.
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-sgl");
        let running = team.list(&ListParams::default()).await?.items;
        assert!(
            running.is_empty(),
            "no Pod starts: {}",
            pods::describe(&running)
        );
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "team-sgl");
        assert!(
            deployments
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The walkthrough's objects under names of their own (`tag`): namespace and Binding
/// `team-<tag>`, backend `mooncake-<tag>` (image pinned), pool `shared-<tag>`.
fn walkthrough_as(v: &mut serde_json::Value, tag: &str) {
    let team = format!("team-{tag}");
    match v["kind"].as_str() {
        Some("Namespace") => v["metadata"]["name"] = team.into(),
        Some("KVCacheBackend") => {
            v["metadata"]["name"] = format!("mooncake-{tag}").into();
            v["spec"]["image"] = PINNED_IMAGE.into();
        }
        Some("KVCachePool") => {
            v["metadata"]["name"] = format!("shared-{tag}").into();
            v["spec"]["backends"] = serde_json::json!([format!("mooncake-{tag}")]);
        }
        Some("KVCachePoolBinding") => {
            v["metadata"]["name"] = team.clone().into();
            v["metadata"]["namespace"] = team.into();
            v["spec"]["poolRef"]["name"] = format!("shared-{tag}").into();
        }
        Some("ModelDeployment") => {
            v["metadata"]["namespace"] = team.clone().into();
            v["spec"]["kvCache"]["poolRef"]["name"] = team.into();
        }
        _ => {}
    }
}

/// A failover restarts a master; the tests that cause one take turns (see the store_on_nodes
/// note on a member seen mounting on another backend's master during a failover).
static FAILOVER: Mutex<()> = Mutex::new(());

fn binding_has(b: &kvcache_api::KVCachePoolBinding, t: &str, status: &str, reason: &str) -> bool {
    b.status
        .as_ref()
        .is_some_and(|s| has_condition(&s.conditions, t, status, reason))
}

fn effective(b: &kvcache_api::KVCachePoolBinding) -> Option<u64> {
    b.status
        .as_ref()
        .and_then(|s| s.effective_quota.as_ref())
        .and_then(|q| parse_bytes(&q.0).ok())
}

/// Deletes the walkthrough objects of `tag` (Binding, pool, backend), without waiting: their
/// finalizers release them in order.
async fn remove_walkthrough(client: &Client, tag: &str) -> Result<(), Error> {
    let team = format!("team-{tag}");
    Api::<kvcache_api::KVCachePoolBinding>::namespaced(client.clone(), &team)
        .delete(&team, &DeleteParams::default())
        .await?;
    Api::<KVCachePool>::all(client.clone())
        .delete(&format!("shared-{tag}"), &DeleteParams::default())
        .await?;
    Api::<KVCacheBackend>::all(client.clone())
        .delete(&format!("mooncake-{tag}"), &DeleteParams::default())
        .await?;
    Ok(())
}

#[test]
fn a_ceiling_edit_reaches_the_running_master_and_a_leader_restart_shows_the_empty_window() {
    use kvcache_api::KVCachePoolBinding;
    let _turn = FAILOVER.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-ledger")?;
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "led");
                !matches!(v["kind"].as_str(), Some("ModelDeployment" | "InstanceType"))
            })?;
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }
        wait_backend(&client, "mooncake-led", "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-led");
        wait_object(&bindings, "team-led", "QuotaGranted=True/Recut of 512Mi", WAIT, |b| {
            binding_has(b, "QuotaGranted", "True", "Recut") && effective(b) == Some(512 * MIB)
        })
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let leader = pods::wait_ready(&store, &backend_pods("mooncake-led", "leader"), 1, WAIT).await?;
        let leader_uid = leader[0].uid();

        // A ceiling below capacity: granted as asked, by the running master.
        bindings
            .patch(
                "team-led",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"quota": {"ceiling": "128Mi"}}})),
            )
            .await?;
        wait_object(&bindings, "team-led", "QuotaGranted=True/Granted 128Mi", WAIT, |b| {
            binding_has(b, "QuotaGranted", "True", "Granted") && effective(b) == Some(128 * MIB)
        })
        .await?;
        let members = pods::wait_ready(&store, &backend_pods("mooncake-led", "member-0"), 2, WAIT).await?;
        let out = pods::exec(&store, name_of(&members[0]), None, &[
            "python3", "-c",
            "import sys, json, urllib.request; d = json.load(urllib.request.urlopen(sys.argv[1], timeout=3)); print([t['effective_quota_bytes'] for t in d['data'] if t['tenant_id'] == 'default'][0])",
            &format!("http://mooncake-led-leader.{NAMESPACE}.svc:9003/api/v1/tenant_quotas"),
        ]).await?;
        assert_eq!(out.stdout.trim(), (128 * MIB).to_string(), "the master's own ledger: {out:?}");
        let now = pods::wait_ready(&store, &backend_pods("mooncake-led", "leader"), 1, WAIT).await?;
        assert_eq!(now[0].uid(), leader_uid, "the same leader Pod");
        let restarts = now[0]
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum::<i32>());
        assert_eq!(restarts, Some(0), "no container restarted for the edit");

        // A leader restart: the new master starts empty. The members are held still meanwhile,
        // so that the window lasts until they are let go.
        let pids: Vec<i32> = members.iter().flat_map(pods::host_pids).collect();
        signal(&pids, nix::sys::signal::Signal::SIGSTOP);
        store.delete(name_of(&leader[0]), &DeleteParams::default()).await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        let window = async {
            wait_object(&pools, "shared-led", "CapacityAllocatable=False/NothingToAllocate", WAIT, |p| {
                p.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "CapacityAllocatable", "False", "NothingToAllocate")
                })
            })
            .await?;
            wait_object(&bindings, "team-led", "QuotaGranted=False/ZeroGranted", WAIT, |b| {
                binding_has(b, "QuotaGranted", "False", "ZeroGranted")
            })
            .await
        }
        .await;
        signal(&pids, nix::sys::signal::Signal::SIGCONT);
        window?;
        // It clears by itself once the members mount on the new master.
        wait_object(&pools, "shared-led", "CapacityAllocatable=True", WAIT, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == "CapacityAllocatable" && c.status == "True")
            })
        })
        .await?;
        wait_object(&bindings, "team-led", "QuotaGranted=True/Granted 128Mi again", WAIT, |b| {
            binding_has(b, "QuotaGranted", "True", "Granted") && effective(b) == Some(128 * MIB)
        })
        .await?;
        remove_walkthrough(&client, "led").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn without_multi_tenancy_the_binding_is_unenforced_the_engine_writes_and_a_pool_name_never_attaches()
 {
    use kvcache_api::{KVCachePoolBinding, ModelDeployment};
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-plain")?;
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "plain");
                if v["kind"] == "KVCacheBackend" {
                    v["spec"]["connection"]["managed"]["leader"]["multiTenancy"] = false.into();
                }
                true
            })?;
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }
        wait_backend(&client, "mooncake-plain", "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-plain");
        let b = wait_object(
            &bindings,
            "team-plain",
            "QuotaGranted=True/Unenforced",
            WAIT,
            |b| binding_has(b, "QuotaGranted", "True", "Unenforced"),
        )
        .await?;
        assert_eq!(effective(&b), None, "no figure without a ledger");
        let pools: Api<KVCachePool> = Api::all(client.clone());
        let p = pools.get("shared-plain").await?;
        assert!(
            p.status.as_ref().is_some_and(|s| has_condition(
                &s.conditions,
                "QuotaLedgerAvailable",
                "False",
                "MultiTenancyDisabled"
            )),
            "{:?}",
            p.status
        );
        // The engine stand-in writes and reads back all the same (into the store's one tenant).
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-plain");
        for e in pods::wait_ready(
            &team,
            &walkthrough::role_pods("qwen-chat", "server"),
            2,
            WAIT,
        )
        .await?
        {
            let log = pods::wait_log(&team, name_of(&e), None, "get key=", WAIT).await?;
            assert!(log.contains(" rc=0") && log.contains("exist=1"), "{log}");
        }
        // Observed, never inferred: without a ledger the store reports no charge per domain.
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-plain");
        wait_object(
            &models,
            "qwen-chat",
            "CacheAttached=Unknown/NoObservationAvailable",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    has_condition(
                        &s.conditions,
                        "CacheAttached",
                        "Unknown",
                        "NoObservationAvailable",
                    )
                })
            },
        )
        .await?;
        remove_model(&client, "team-plain", "qwen-chat").await?;

        // The pool's name is not a Binding: it never attaches, and nothing is rendered.
        let mut by_pool = walkthrough::read_objects(
            &walkthrough::manifest_files(&manifests)?
                .into_iter()
                .find(|f| f.to_string_lossy().contains("modeldeployment"))
                .expect("the ModelDeployment manifest"),
        )?;
        for o in &mut by_pool {
            o.metadata.name = Some("qwen-by-pool".into());
            o.data["spec"]["kvCache"]["poolRef"]["name"] = "shared-plain".into();
        }
        walkthrough::apply(&client, &by_pool).await?;
        let m = wait_object(
            &models,
            "qwen-by-pool",
            "DomainRegistered=False/BindingNotFound",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    has_condition(
                        &s.conditions,
                        "DomainRegistered",
                        "False",
                        "BindingNotFound",
                    )
                })
            },
        )
        .await?;
        let message = m
            .status
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "DomainRegistered")
            })
            .map(|c| c.message)
            .unwrap_or_default();
        assert!(message.contains("a Binding in this namespace"), "{message}");
        assert!(
            Api::<Deployment>::namespaced(client.clone(), "team-plain")
                .get_opt("qwen-by-pool-server")
                .await?
                .is_none(),
            "nothing is rendered without a Binding"
        );
        models
            .delete("qwen-by-pool", &DeleteParams::default())
            .await?;
        remove_walkthrough(&client, "plain").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_deployment_labelled_for_injection_gets_the_store_settings_and_its_pods_write_under_the_binding()
 {
    use kvcache_api::KVCachePoolBinding;
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let webhook = operator()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .webhook
        .clone()
        .expect("the operator serves its webhook");
    block_on(async move {
        let client = client_from(&kc).await?;
        // The Pod webhooks only: our kinds stay judged by the schema in this binary.
        kvcache_e2e::operator::register_webhooks(&client, NAMESPACE, &webhook, false).await?;
        let dir = paths::scratch("walkthrough-injected")?;
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "inj");
                if v["kind"] == "KVCachePoolBinding" {
                    v["spec"]["domain"]["name"] = "chat".into();
                }
                !matches!(v["kind"].as_str(), Some("ModelDeployment" | "InstanceType"))
            })?;
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-inj");
        wait_object(&bindings, "team-inj", "QuotaGranted=True", WAIT, |b| {
            b.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "QuotaGranted" && c.status == "True"))
        })
        .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        wait_object(&pools, "shared-inj", "a client endpoint and the ledger read", WAIT, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.client_endpoint.is_some()
                    && s.conditions.iter().any(|c| c.type_ == "QuotaLedgerAvailable" && c.status == "True")
            })
        })
        .await?;
        // Any workload, not a ModelDeployment: the engine stand-in as vLLM, opted in by label.
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": "team-inj"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "chat"}},
                "template": {
                    "metadata": {
                        "labels": {"app": "chat", "kvcache.gpustack.ai/inject": "true"},
                        "annotations": {"kvcache.gpustack.ai/binding": "team-inj", "kvcache.gpustack.ai/engine": "vLLM"}
                    },
                    "spec": {"containers": [{
                        "name": "engine",
                        "image": "docker.io/gpustack/runner:cpu-vllm0.29.0",
                        "imagePullPolicy": "Never",
                        "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"],
                        "resources": {"requests": {"cpu": walkthrough::DEMO_ROLE_CPU, "memory": walkthrough::DEMO_ROLE_MEMORY},
                                      "limits": {"memory": walkthrough::DEMO_ROLE_MEMORY}},
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}
                    }]}
                }
            }
        }))
        .map_err(|e| Error::Invalid { path: "chat".into(), what: "Deployment", reason: e.to_string() })?;
        Api::<Deployment>::namespaced(client.clone(), "team-inj")
            .patch("chat", &PatchParams::apply(walkthrough::MANAGER).force(), &Patch::Apply(&deployment))
            .await?;
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-inj");
        let ready = pods::wait_ready(&team, "app=chat", 1, WAIT).await?;
        let p = &ready[0];
        let record: serde_json::Value = serde_json::from_str(
            p.metadata.annotations.as_ref().and_then(|a| a.get("kvcache.gpustack.ai/injected")).expect("the record"),
        )
        .map_err(|e| Error::Invalid { path: name_of(p).into(), what: "record", reason: e.to_string() })?;
        assert_eq!(record["binding"], "team-inj");
        assert_eq!(record["domain"], "chat");
        assert_eq!(record["tenantInjected"], true);
        let log = pods::wait_log(&team, name_of(p), None, "get key=", WAIT).await?;
        assert!(log.contains("tenant chat") && log.contains(" rc=0") && log.contains("exist=1"), "{log}");
        // The store charges the Binding's domain: its usage shows on the Binding.
        wait_object(&bindings, "team-inj", "usage charged to the domain", WAIT, |b| {
            b.status
                .as_ref()
                .and_then(|s| s.usage.as_ref())
                .and_then(|q| parse_bytes(&q.0).ok())
                .is_some_and(|u| u > 0)
        })
        .await?;
        Api::<Deployment>::namespaced(client.clone(), "team-inj")
            .delete("chat", &DeleteParams::default())
            .await?;
        pods::wait_pods(&team, "app=chat", "no Pods left", WAIT, |p| p.is_empty()).await?;
        remove_walkthrough(&client, "inj").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The uids of a set of Pods, sorted.
fn uids(p: &[Pod]) -> Vec<String> {
    let mut u: Vec<String> = p.iter().map(|p| p.uid().unwrap_or_default()).collect();
    u.sort();
    u
}

/// Deletes a test's backend (without waiting: its finalizer releases it and its Pods go).
async fn remove_backend(client: &Client, name: &str) -> Result<(), Error> {
    Api::<KVCacheBackend>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Applies the demo-size backend `name` changed by `edit`, waits until it is Ready with both
/// members' 512Mi, and returns its Ready leader and member Pods.
async fn ready_backend(
    client: &Client,
    name: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> Result<(Vec<Pod>, Vec<Pod>), Error> {
    apply(client, &backend(name, edit)).await?;
    wait_backend(client, name, "Ready with 512Mi", |b| {
        phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
    })
    .await?;
    let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let leaders = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
    let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
    Ok((leaders, members))
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
                    && condition(b, "ElectionObserved").is_some_and(|(s, _, _)| s == "True")
                    && condition(b, "RolloutComplete").is_some_and(|(s, _, _)| s == "True")
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
    let _turn = FAILOVER.lock().unwrap_or_else(|p| p.into_inner());
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

/// A pool on `backend` with `total`, and one Binding per `(namespace, domain, ceiling)` (named
/// after its namespace; `None`: the domain's name left out, so `default`).
async fn pool_with_bindings(
    client: &Client,
    backend: &str,
    total: &str,
    bindings: &[(&str, Option<&str>, &str)],
) -> Result<(), Error> {
    let pool: KVCachePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
        "metadata": {"name": backend},
        "spec": {"backends": [backend], "quota": {"total": total}},
    }))
    .expect("a pool");
    let pp = PatchParams::apply(walkthrough::MANAGER).force();
    Api::<KVCachePool>::all(client.clone())
        .patch(backend, &pp, &Patch::Apply(&pool))
        .await?;
    for (ns, domain, ceiling) in bindings {
        walkthrough::ensure_namespace(client, ns).await?;
        let mut d = serde_json::json!({"blockSize": 64, "dtype": "bfloat16"});
        if let Some(n) = domain {
            d["name"] = (*n).into();
        }
        let b: kvcache_api::KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": ns, "namespace": ns},
            "spec": {"poolRef": {"name": backend}, "quota": {"ceiling": ceiling}, "domain": d},
        }))
        .expect("a Binding");
        Api::<kvcache_api::KVCachePoolBinding>::namespaced(client.clone(), ns)
            .patch(ns, &pp, &Patch::Apply(&b))
            .await?;
    }
    Ok(())
}

/// Waits until the Binding in `ns` reads `QuotaGranted=True/<reason>` with `bytes` effective.
async fn wait_granted(
    client: &Client,
    ns: &str,
    reason: &str,
    bytes: u64,
) -> Result<kvcache_api::KVCachePoolBinding, Error> {
    let bindings: Api<kvcache_api::KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
    wait_object(
        &bindings,
        ns,
        &format!("QuotaGranted=True/{reason} with {bytes} bytes effective"),
        WAIT,
        |b| binding_has(b, "QuotaGranted", "True", reason) && effective(b) == Some(bytes),
    )
    .await
}

/// Deletes the Bindings, the pool and the backend of a quota test, without waiting.
async fn remove_pool_and_backend(
    client: &Client,
    backend: &str,
    namespaces: &[&str],
) -> Result<(), Error> {
    for ns in namespaces {
        Api::<kvcache_api::KVCachePoolBinding>::namespaced(client.clone(), ns)
            .delete(ns, &DeleteParams::default())
            .await?;
    }
    Api::<KVCachePool>::all(client.clone())
        .delete(backend, &DeleteParams::default())
        .await?;
    remove_backend(client, backend).await
}

#[test]
fn a_quota_ceiling_is_not_a_reservation_and_going_over_it_does_not_fail_a_write() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "claim-quota";
        apply(&client, &backend(name, |_| {})).await?;
        // Ceilings adding up to more than the pool's total (496Mi of 256Mi): both admitted.
        pool_with_bindings(
            &client,
            name,
            "256Mi",
            &[
                ("quota-roomy", Some("roomy"), "480Mi"),
                ("quota-tight", Some("tight"), "16Mi"),
            ],
        )
        .await?;
        wait_backend(&client, name, "Ready with 512Mi", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(512 * MIB)
        })
        .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        wait_object(
            &pools,
            name,
            "QuotaWithinTotal=False/Oversubscribed, still Ready",
            WAIT,
            |p| {
                p.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "QuotaWithinTotal", "False", "Oversubscribed")
                        && s.phase == Some(kvcache_api::pool::PoolPhase::Ready)
                })
            },
        )
        .await?;
        // Each is granted its whole ceiling: the store has 512Mi and nothing is set aside.
        wait_granted(&client, "quota-roomy", "Granted", 480 * MIB).await?;
        wait_granted(&client, "quota-tight", "Granted", 16 * MIB).await?;

        // Eight 4 MiB writes into the 16Mi grant: every write succeeds; the store keeps what
        // the grant holds, dropping the domain's own older objects.
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        let member = name_of(&members[0]);
        let master = format!("{name}-leader.{NAMESPACE}.svc:50051");
        let mut codes = Vec::new();
        for i in 0..8 {
            let key = format!("over-{i}");
            codes.push(
                pods::store_put(&store, member, &master, &key, Some("tight"), 4 << 20).await?,
            );
        }
        assert_eq!(codes, vec![0; 8], "no write fails");
        let mut held = 0;
        for i in 0..8 {
            let key = format!("over-{i}");
            match pods::store_get(&store, member, &master, &key, Some("tight")).await? {
                kvcache_e2e::store::Lookup::Hit(n) => held += n as u64,
                kvcache_e2e::store::Lookup::Miss => {}
            }
        }
        assert!(
            held > 0 && held <= 16 * MIB,
            "the store holds at most the grant: {held}"
        );
        // The Binding reports the charge, is not over quota, and stays granted.
        let bindings: Api<kvcache_api::KVCachePoolBinding> =
            Api::namespaced(client.clone(), "quota-tight");
        let b = wait_object(
            &bindings,
            "quota-tight",
            "usage read back from the master, overQuota false",
            WAIT,
            |b| {
                b.status.as_ref().is_some_and(|s| {
                    s.usage
                        .as_ref()
                        .and_then(|q| parse_bytes(&q.0).ok())
                        .is_some_and(|u| u > 0)
                        && s.over_quota != Some(true)
                }) && binding_has(b, "QuotaGranted", "True", "Granted")
            },
        )
        .await?;
        let usage = b
            .status
            .and_then(|s| s.usage)
            .map(|q| parse_bytes(&q.0).expect("bytes"));
        assert!(usage.is_some_and(|u| u <= 16 * MIB), "{usage:?}");
        remove_pool_and_backend(&client, name, &["quota-roomy", "quota-tight"]).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_tenant_absent_from_the_ledger_is_refused_by_the_master_until_a_default_binding_exists() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "claim-tenant";
        apply(&client, &backend(name, |_| {})).await?;
        pool_with_bindings(
            &client,
            name,
            "512Mi",
            &[("tenant-chat", Some("chat"), "64Mi")],
        )
        .await?;
        wait_granted(&client, "tenant-chat", "Granted", 64 * MIB).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        let member = name_of(&members[0]);
        let master = format!("{name}-leader.{NAMESPACE}.svc:50051");

        // The Binding's tenant writes; another name, or none (an engine ignoring the injected
        // tenant writes as the store's default), is refused: TENANT_NOT_REGISTERED.
        assert_eq!(
            pods::store_put(&store, member, &master, "k-chat", Some("chat"), 4096).await?,
            0
        );
        assert_eq!(
            pods::store_put(&store, member, &master, "k-other", Some("other"), 4096).await?,
            -1701
        );
        assert_eq!(
            pods::store_put(&store, member, &master, "k-none", None, 4096).await?,
            -1701
        );

        // A second Binding whose domain leaves the name out (default): the tenant-less writer
        // is now in the ledger.
        pool_with_bindings(
            &client,
            name,
            "512Mi",
            &[
                ("tenant-chat", Some("chat"), "64Mi"),
                ("tenant-default", None, "64Mi"),
            ],
        )
        .await?;
        wait_granted(&client, "tenant-default", "Granted", 64 * MIB).await?;
        assert_eq!(
            pods::store_put(&store, member, &master, "k-none", None, 4096).await?,
            0
        );
        remove_pool_and_backend(&client, name, &["tenant-chat", "tenant-default"]).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A demo-size disk tier on the backend: a 32Mi segment, 1Gi of tier per member at `path` (made
/// on each node, owned by the store image's user), the store's 500 ms object lease (so a second
/// round of writes evicts, and so offloads, the first) and a one-second member heartbeat.
fn with_tier(cluster: &NodeCluster, path: &str) -> impl Fn(&mut serde_json::Value) + use<> {
    for n in &cluster.nodes.nodes {
        let dir = n.host_root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).expect("the tier folder");
        std::os::unix::fs::chown(&dir, Some(65532), Some(0)).expect("chown");
    }
    let path = path.to_owned();
    move |v: &mut serde_json::Value| walkthrough::demo_tier(v, &path)
}

/// The store's flags as the running leader Pod's container has them.
fn leader_args(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| {
            c.command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_leaders_offload_flags_are_derived_from_the_tier_declaration() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let tier = with_tier(cluster, "/var/lib/kvcache/claim-offload");
    block_on(async move {
        let client = client_from(&kc).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let offload = ["-enable_offload=true", "-offload_on_evict=true"];
        for (name, tiered) in [("claim-offload", true), ("claim-no-offload", false)] {
            apply(
                &client,
                &backend(name, |v| {
                    if tiered {
                        tier(v);
                    } else {
                        v["spec"]["connection"]["managed"]["members"][0]["capacityPerMember"] =
                            "32Mi".into();
                    }
                }),
            )
            .await?;
            // The master runs with what was derived: Ready, with its members' segments.
            wait_backend(&client, name, "Ready with 64Mi of segments", |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && b.status
                        .as_ref()
                        .and_then(|s| s.capacity.as_ref())
                        .and_then(|c| c.memory.as_ref())
                        .and_then(|q| parse_bytes(&q.0).ok())
                        == Some(64 * MIB)
            })
            .await?;
            let leader = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
            let args = leader_args(&leader[0]);
            for flag in offload {
                assert_eq!(
                    args.iter().any(|a| a.as_str() == flag),
                    tiered,
                    "{name}: {flag} in {args:?}"
                );
            }
        }
        remove_backend(&client, "claim-offload").await?;
        remove_backend(&client, "claim-no-offload").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_filling_tier_shows_in_the_tier_figure_and_not_in_capacity() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let tier = with_tier(cluster, "/var/lib/kvcache/claim-fill");
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "claim-fill";
        apply(&client, &backend(name, tier)).await?;
        // A Binding for the store's default tenant, which the writes below name.
        pool_with_bindings(&client, name, "64Mi", &[("fill-default", None, "64Mi")]).await?;
        wait_granted(&client, "fill-default", "Granted", 64 * MIB).await?;
        // CAPACITY: two 32Mi segments plus the two members' declared 1Gi of tier.
        let total = 64 * MIB + (2u64 << 30);
        let ready = wait_backend(&client, name, "Ready with 2112Mi (segments + declared tier)", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(total)
        })
        .await?;
        let before = ready.status.and_then(|s| s.capacity).expect("a capacity");
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        let member = name_of(&members[0]);
        let admin = format!("{name}-leader.{NAMESPACE}.svc:{}", kvcache_render::backend::ADMIN_PORT);
        let figure = |text: &str| kvcache_e2e::store::metric_value(text, "master_allocated_file_size_bytes").unwrap_or(0.0);
        let empty = figure(&pods::master_page(&store, member, &admin, "metrics").await?);
        assert_eq!(empty, 0.0, "an empty tier");

        // Two rounds of 56 MiB into 64 MiB of segments: the second evicts the first to the tier.
        let master = format!("{name}-leader.{NAMESPACE}.svc:50051");
        let ip = pods::ip_of(&members[0]).expect("an address").to_owned();
        let out = pods::exec(&store, member, None, &[
            "python3", "-c", pods::PUT_MANY, &master, &ip, "2", "56", "1048576",
        ]).await?;
        assert!(out.success, "{out:?}");
        // The tier figure moves (buckets close on the members' heartbeat; the master has no
        // watch, so it is read again every half second).
        let deadline = tokio::time::Instant::now() + WAIT;
        let filled = loop {
            let f = figure(&pods::master_page(&store, member, &admin, "metrics").await?);
            if f > 0.0 {
                break f;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "master_allocated_file_size_bytes stayed 0 for {WAIT:?} after the writes ({out:?})"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        // CAPACITY does not: every status the backend shows over the next two capacity reads
        // of the operator (15 s apart) has the same figures.
        let api: Api<KVCacheBackend> = Api::all(client.clone());
        let watched = {
            use futures::StreamExt;
            let stream = kube::runtime::watcher::watch_object(api, name);
            let window = tokio::time::sleep(Duration::from_secs(35));
            tokio::pin!(window);
            let mut stream = Box::pin(stream);
            let mut seen = Vec::new();
            loop {
                tokio::select! {
                    _ = &mut window => break seen,
                    next = stream.next() => match next {
                        Some(Ok(Some(b))) => seen.push(b.status.and_then(|s| s.capacity)),
                        Some(Ok(None)) | None => break seen,
                        Some(Err(_)) => {}
                    },
                }
            }
        };
        assert!(!watched.is_empty());
        assert!(
            watched.iter().all(|c| c.as_ref() == Some(&before)),
            "the tier filled to {filled} bytes; CAPACITY over the window: {watched:?}, before {before:?}"
        );
        remove_pool_and_backend(&client, name, &["fill-default"]).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_model_deployment_without_kv_cache_runs_with_no_shared_cache() {
    use kvcache_api::ModelDeployment;
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-no-cache")?;
        // The walkthrough's workload (and its namespace and instance type) with kvCache left out.
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "nocache");
                if v["kind"] == "ModelDeployment"
                    && let Some(spec) = v["spec"].as_object_mut()
                {
                    spec.remove("kvCache");
                }
                matches!(
                    v["kind"].as_str(),
                    Some("Namespace" | "InstanceType" | "ModelDeployment")
                )
            })?;
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-nocache");
        wait_object(
            &models,
            "qwen-chat",
            "CacheAttached=True/NotApplicable",
            WAIT,
            |m| {
                m.status.as_ref().is_some_and(|s| {
                    has_condition(&s.conditions, "CacheAttached", "True", "NotApplicable")
                })
            },
        )
        .await?;
        // The replicas run (Ready) with nothing of the store's handed to them.
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-nocache");
        let replicas = pods::wait_ready(
            &team,
            &walkthrough::role_pods("qwen-chat", "server"),
            2,
            WAIT,
        )
        .await?;
        for p in &replicas {
            let c = &p.spec.as_ref().expect("a spec").containers[0];
            let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
            assert!(
                env.iter().all(|e| !e.starts_with("MOONCAKE_")),
                "{}: {env:?}",
                name_of(p)
            );
            let argv: Vec<&String> = c
                .command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .collect();
            assert!(
                argv.iter().all(|a| !a.contains("kv-transfer-config")),
                "{}: {argv:?}",
                name_of(p)
            );
            let log = pods::wait_log(&team, name_of(p), None, "serving /health", WAIT).await?;
            assert!(log.contains("without the shared cache"), "{log}");
        }
        remove_model(&client, "team-nocache", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
