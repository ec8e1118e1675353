//! Pools and Bindings reconciled against a real master's tenant ledger (one operator for this
//! test binary's control plane; the store runs on loopback, read through
//! `--store-address-override`): ceilings pushed through the admin API and grants read back as
//! the master recuts them, a ceiling edit reaching the running master, zero capacity reported for
//! what it is, `Unenforced` without a ledger, deletion held while in use and tenants released.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use kvcache_api::model::InstanceType;
use kvcache_api::pool::PoolPhase;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::wait_object;
use kvcache_e2e::operator::Operator;
use kvcache_e2e::status::{HasStatus, condition, describe, has_condition, phase, wait_condition};
use kvcache_e2e::store::{Master, MasterOptions, Member, MemberOptions, http_get};
use kvcache_e2e::{Watched, paths, shared};
use kvcache_quota::admin::{TenantEntry, decode_list};
use kvcache_quota::policy;

const MI: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(45);

async fn apply<K: Watched + serde::Serialize>(api: &Api<K>, yaml: &str) -> K {
    let obj: K = serde_yaml::from_str(yaml).expect("manifest");
    api.patch(
        &obj.name_any(),
        &PatchParams::apply("kvcache-e2e").force(),
        &Patch::Apply(&obj),
    )
    .await
    .expect("applied")
}

/// Waits on a watch until `ok` holds; fails naming `what` and the last object seen.
async fn wait<K: Watched>(api: &Api<K>, name: &str, what: &str, ok: impl Fn(&K) -> bool) -> K {
    wait_object(api, name, what, WAIT, ok)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits on a watch until the object has the condition `spec` (`Type=Status[/Reason]`).
async fn wait_for_condition<K: Watched + HasStatus>(api: &Api<K>, name: &str, spec: &str) -> K {
    wait_condition(api, name, spec, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn effective(b: &KVCachePoolBinding) -> Option<String> {
    b.status
        .as_ref()
        .and_then(|s| s.effective_quota.as_ref())
        .map(|q| q.as_str().to_owned())
}

fn ledger(master: &Master) -> BTreeMap<String, TenantEntry> {
    let text = http_get(&format!("{}/api/v1/tenant_quotas", master.admin_url())).expect("ledger");
    decode_list(200, &text)
        .expect("decodes")
        .into_iter()
        .map(|e| (e.tenant_id.clone(), e))
        .collect()
}

async fn namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_on_the_real_master() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let op_ns = cluster
        .namespace(&client, "op-pool")
        .await
        .expect("operator namespace");
    let dir = paths::scratch("op-pool").expect("dir");
    let (d, kc, ns2) = (
        dir.clone(),
        cluster.control_plane.kubeconfig.clone(),
        op_ns.clone(),
    );
    let (master, member, operator) = tokio::task::spawn_blocking(move || {
        // A multi-tenant master that starts with no tenant: the operator registers them.
        let file = d.join("tenant-quota-policy.yaml");
        std::fs::write(
            &file,
            policy::render("ledger-store", &[])
                .expect("empty policy")
                .to_yaml(),
        )
        .expect("policy file");
        let master = Master::start(
            &d,
            MasterOptions {
                client_ttl: Some(3),
                ..MasterOptions::multi_tenant(&file)
            },
        )
        .expect("master");
        let member =
            Member::start(&d, &MemberOptions::new(master.address(), 64 * MI)).expect("member");
        master.wait_capacity(64 * MI, WAIT).expect("mounted");
        let operator = Operator::builder(&kc, &ns2)
            .overrides(&[format!("ledger-store=127.0.0.1:{}", master.metrics_port)])
            .start(&d)
            .expect("operator");
        (master, member, operator)
    })
    .await
    .expect("setup");

    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let pools: Api<KVCachePool> = Api::all(client.clone());
    apply(
        &backends,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: ledger-store}\nspec:\n  image: example.local/store:1\n  connection:\n    managed:\n      leader: {}\n      members: [{medium: DRAM, capacityPerMember: 64Mi}]\n",
    )
    .await;
    apply(
        &pools,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: shared}\nspec: {backends: [ledger-store], quota: {total: 1Gi}}\n",
    )
    .await;
    namespace(&client, "team-a").await;
    namespace(&client, "team-b").await;
    let team_a: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-a");
    let team_b: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-b");
    let binding = |ns: &str, ceiling: &str, domain: &str| {
        format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: {ns}, namespace: {ns}}}\nspec:\n  poolRef: {{name: shared}}\n  quota: {{ceiling: {ceiling}}}\n  domain: {{name: {domain}, blockSize: 64, dtype: bfloat16}}\n"
        )
    };
    apply(&team_a, &binding("team-a", "64Mi", "default")).await;
    apply(&team_b, &binding("team-b", "32Mi", "chat")).await;

    unenforced_without_a_ledger(&client, &backends, &pools).await;

    // Ceilings exceed the 64 MiB mounted: the master recuts, and the Bindings say what it granted.
    let model = kvcache_quota::recut(
        64 * MI,
        &[("default".into(), 64 * MI), ("chat".into(), 32 * MI)],
    );
    let a = wait(&team_a, "team-a", "the master's recut grant", |b| {
        effective(b) == Some(model["default"].to_string())
    })
    .await;
    assert!(
        has_condition(&a, "QuotaGranted=True/Recut"),
        "{}",
        describe(&a)
    );
    wait(&team_b, "team-b", "the master's recut grant", |b| {
        effective(b) == Some(model["chat"].to_string())
    })
    .await;
    let p = wait(&pools, "shared", "Ready with the backend's endpoint", |p| {
        phase(p) == Some(PoolPhase::Ready)
    })
    .await;
    let status = p.status.clone().expect("status");
    assert_eq!(
        status.client_endpoint.as_deref(),
        Some(format!("ledger-store-leader.{op_ns}.svc:50051").as_str())
    );
    assert_eq!(status.domains, ["chat", "default"]);
    assert_eq!(status.used_by.len(), 2);

    // A ceiling edit reaches the running master; no restart.
    apply(&team_b, &binding("team-b", "16Mi", "chat")).await;
    let model = kvcache_quota::recut(
        64 * MI,
        &[("default".into(), 64 * MI), ("chat".into(), 16 * MI)],
    );
    wait(&team_b, "team-b", "the grant after the ceiling edit", |b| {
        effective(b) == Some(model["chat"].to_string())
    })
    .await;
    let entries = tokio::task::spawn_blocking({
        let url = master.admin_url();
        move || http_get(&format!("{url}/api/v1/tenant_quotas"))
    })
    .await
    .expect("thread")
    .expect("ledger");
    let entries: BTreeMap<String, TenantEntry> = decode_list(200, &entries)
        .expect("decodes")
        .into_iter()
        .map(|e| (e.tenant_id.clone(), e))
        .collect();
    assert_eq!(entries["chat"].requested_quota_bytes, 16 * MI);

    model_deployments_attach(&client, &master, &op_ns).await;

    // No capacity: the pool says there is nothing to allocate and every grant is zero; it
    // clears by itself once a member mounts again.
    let master = tokio::task::spawn_blocking(move || {
        drop(member);
        master
    })
    .await
    .expect("thread");
    // While no member is mounted.
    let p = wait_for_condition(
        &pools,
        "shared",
        "CapacityAllocatable=False/NothingToAllocate",
    )
    .await;
    assert_ne!(phase(&p), Some(PoolPhase::Ready));
    // While nothing is allocatable.
    wait_for_condition(&team_a, "team-a", "QuotaGranted=False/ZeroGranted").await;
    let d2 = dir.clone();
    let (master, member) = tokio::task::spawn_blocking(move || {
        let m = Member::start(&d2, &MemberOptions::new(master.address(), 64 * MI)).expect("member");
        (master, m)
    })
    .await
    .expect("thread");
    wait(&pools, "shared", "Ready again once a member mounts", |p| {
        phase(p) == Some(PoolPhase::Ready)
    })
    .await;

    // A Binding a ModelDeployment uses is held while it does, and says so on its own status.
    team_a
        .delete("team-a", &DeleteParams::default())
        .await
        .expect("delete");
    let held = wait_for_condition(&team_a, "team-a", "Releasable=False/HeldByWorkloads").await;
    assert_eq!(
        phase(&held),
        Some(PoolPhase::Deleting),
        "{}",
        describe(&held)
    );
    let why = condition(&held, "Releasable").map(|c| c.message.clone());
    assert!(
        why.as_deref()
            .is_some_and(|m| m.contains("team-a/qwen-chat")),
        "the hold names the workload: {why:?}"
    );
    // Deleting the pool waits for its Bindings; deleting them releases their tenants (once no
    // ModelDeployment uses them).
    for name in ["qwen-chat"] {
        Api::<ModelDeployment>::namespaced(client.clone(), "team-a")
            .delete(name, &DeleteParams::default())
            .await
            .expect("model deployment deleted");
    }
    pools
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete requested");
    let p = wait(&pools, "shared", "held while Bindings reference it", |p| {
        phase(p) == Some(PoolPhase::Deleting)
    })
    .await;
    assert!(has_condition(&p, "Releasable=False"), "{}", describe(&p));
    team_b
        .delete("team-b", &DeleteParams::default())
        .await
        .expect("delete");
    let uid = p.uid().expect("uid");
    tokio::time::timeout(
        Duration::from_secs(90),
        await_condition(
            pools.clone(),
            "shared",
            kube::runtime::conditions::is_deleted(&uid),
        ),
    )
    .await
    .expect("the pool goes once its Bindings are gone")
    .expect("watch");
    let left = tokio::task::spawn_blocking(move || {
        let l = ledger(&master);
        drop((master, member, operator));
        l
    })
    .await
    .expect("thread");
    assert!(
        !left.contains_key("chat") && !left.contains_key("default"),
        "the released tenants left the ledger: {left:?}"
    );
}

/// A backend without multi-tenancy: its Bindings are `Unenforced`, with no figure.
async fn unenforced_without_a_ledger(
    client: &Client,
    backends: &Api<KVCacheBackend>,
    pools: &Api<KVCachePool>,
) {
    apply(
        backends,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: plain-store}\nspec:\n  image: example.local/store:1\n  connection:\n    managed:\n      leader: {multiTenancy: false}\n      members: [{medium: DRAM, capacityPerMember: 64Mi}]\n",
    )
    .await;
    apply(
        pools,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: plain}\nspec: {backends: [plain-store], quota: {total: 1Gi}}\n",
    )
    .await;
    namespace(client, "team-c").await;
    let team_c: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-c");
    apply(
        &team_c,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {name: plain, namespace: team-c}\nspec:\n  poolRef: {name: plain}\n  quota: {ceiling: 1Gi}\n  domain: {blockSize: 64, dtype: bfloat16}\n",
    )
    .await;
    let b = wait_for_condition(&team_c, "plain", "QuotaGranted=True/Unenforced").await;
    assert_eq!(effective(&b), None, "no figure without a ledger");
    let p = pools.get("plain").await.expect("pool");
    assert!(
        has_condition(&p, "QuotaLedgerAvailable=False/MultiTenancyDisabled"),
        "{}",
        describe(&p)
    );
}

/// A ModelDeployment attaches through its namespace's Binding: the store settings are rendered
/// into its role, `CacheAttached` is observed from what the store charges the domain, the
/// Binding names it, and a Binding of another namespace never attaches.
async fn model_deployments_attach(client: &Client, master: &Master, op_ns: &str) {
    let its: Api<InstanceType> = Api::all(client.clone());
    apply(
        &its,
        "apiVersion: worker.gpustack.ai/v1\nkind: InstanceType\nmetadata: {name: gpu-small}\nspec:\n  nodeSelector: {gpustack.ai/instance-type: gpu-small}\n  accelerator: {resourceName: nvidia.com/gpu, manufacturer: nvidia}\n  resources: {cpu: '1', memory: 1Gi}\n",
    )
    .await;
    let md = |ns: &str, binding: &str| {
        format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata: {{name: qwen-chat, namespace: {ns}}}\nspec:\n  model: {{name: Qwen/Qwen2.5-0.5B-Instruct}}\n  engine: {{name: vLLM, version: '0.29.0'}}\n  kvCache: {{poolRef: {{name: {binding}}}}}\n  roles:\n    - {{name: server, replicas: 1, instanceType: gpu-small, resources: {{accelerator: 1}}}}\n"
        )
    };
    let team_a: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-a");
    apply(&team_a, &md("team-a", "team-a")).await;
    let m = wait_for_condition(&team_a, "qwen-chat", "DomainRegistered=True/Registered").await;
    let kv = m.status.and_then(|s| s.kv_cache).expect("status.kvCache");
    assert_eq!(kv.binding, "team-a/team-a");
    assert_eq!(kv.pool.as_deref(), Some("shared"));
    // The role's Deployment carries the store settings for this store and domain.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "team-a");
    let d = wait(
        &deployments,
        "qwen-chat-server",
        "the role's Deployment",
        |_| true,
    )
    .await;
    let annotations = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let config: serde_json::Value = serde_json::from_str(
        annotations
            .get("kvcache.gpustack.ai/client-config")
            .expect("the client config annotation"),
    )
    .expect("JSON");
    assert_eq!(
        config["master_server_address"],
        format!("ledger-store-leader.{op_ns}.svc:50051"),
        "{config}"
    );
    // Observed, never inferred: once the domain holds data the store charges it.
    let address = master.address();
    let put = tokio::task::spawn_blocking(move || {
        kvcache_e2e::store::put(&address, "written-by-the-domain", Some("default"), 4096)
    })
    .await
    .expect("thread")
    .expect("put");
    assert_eq!(put, 0, "the tenant writes");
    // CacheActive from the store's charge.
    wait_for_condition(&team_a, "qwen-chat", "CacheAttached=True/CacheActive").await;
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-a");
    wait(
        &bindings,
        "team-a",
        "usedBy naming the ModelDeployment",
        |b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.used_by.iter().any(|u| u.name == "qwen-chat"))
        },
    )
    .await;
    // A Binding of another namespace never attaches.
    namespace(client, "team-d").await;
    let team_d: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-d");
    apply(&team_d, &md("team-d", "team-a")).await;
    let m = wait_for_condition(
        &team_d,
        "qwen-chat",
        "DomainRegistered=False/BindingNotFound",
    )
    .await;
    assert!(
        condition(&m, "DomainRegistered")
            .is_some_and(|c| c.message.contains("a Binding in this namespace")),
        "the message says what to name: {}",
        describe(&m)
    );
    assert!(
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "team-d")
            .get_opt("qwen-chat-server")
            .await
            .expect("get")
            .is_none(),
        "nothing is rendered without a resolved Binding"
    );
}
