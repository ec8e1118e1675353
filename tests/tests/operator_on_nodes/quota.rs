//! Quotas and tenants on the running master: a ceiling edit reaches it without a restart and a
//! leader restart shows the empty window, a ceiling is not a reservation, a tenant absent from
//! the ledger is refused, and without multi-tenancy nothing is enforced.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kvcache_api::pool::PoolPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::paths;
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{condition, describe, has_condition, phase, wait_condition};
use kvcache_e2e::walkthrough::{self, backend_pods};

use crate::{
    GPUS, MIB, NAMESPACE, WAIT, apply, backend, cluster, effective, pool_with_bindings,
    remove_model, remove_pool_and_backend, remove_walkthrough, signal, wait_backend_ready,
    wait_granted, walkthrough_as,
};

#[test]
fn a_ceiling_edit_reaches_the_running_master_and_a_leader_restart_shows_the_empty_window() {
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
        wait_backend_ready(&client, "mooncake-led", 512 * MIB).await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-led");
        wait_granted(&client, "team-led", "Recut", 512 * MIB).await?;
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
        wait_granted(&client, "team-led", "Granted", 128 * MIB).await?;
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
            wait_condition(&pools, "shared-led", "CapacityAllocatable=False/NothingToAllocate", WAIT).await?;
            wait_condition(&bindings, "team-led", "QuotaGranted=False/ZeroGranted", WAIT).await
        }
        .await;
        signal(&pids, nix::sys::signal::Signal::SIGCONT);
        window?;
        // It clears by itself once the members mount on the new master.
        wait_condition(&pools, "shared-led", "CapacityAllocatable=True", WAIT).await?;
        wait_granted(&client, "team-led", "Granted", 128 * MIB).await?;
        remove_walkthrough(&client, "led").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn without_multi_tenancy_the_binding_is_unenforced_the_engine_writes_and_a_pool_name_never_attaches()
 {
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
        wait_backend_ready(&client, "mooncake-plain", 512 * MIB).await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-plain");
        let b = wait_condition(
            &bindings,
            "team-plain",
            "QuotaGranted=True/Unenforced",
            WAIT,
        )
        .await?;
        assert_eq!(effective(&b), None, "no figure without a ledger");
        let pools: Api<KVCachePool> = Api::all(client.clone());
        let p = pools.get("shared-plain").await?;
        assert!(
            has_condition(&p, "QuotaLedgerAvailable=False/MultiTenancyDisabled"),
            "{}",
            describe(&p)
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
        wait_condition(
            &models,
            "qwen-chat",
            "CacheAttached=Unknown/NoObservationAvailable",
            WAIT,
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
        let m = wait_condition(
            &models,
            "qwen-by-pool",
            "DomainRegistered=False/BindingNotFound",
            WAIT,
        )
        .await?;
        let message = condition(&m, "DomainRegistered")
            .map(|c| c.message.as_str())
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
        wait_backend_ready(&client, name, 512 * MIB).await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        wait_object(
            &pools,
            name,
            "QuotaWithinTotal=False/Oversubscribed, still Ready",
            WAIT,
            |p| {
                has_condition(p, "QuotaWithinTotal=False/Oversubscribed")
                    && phase(p) == Some(PoolPhase::Ready)
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
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "quota-tight");
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
                }) && has_condition(b, "QuotaGranted=True/Granted")
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
