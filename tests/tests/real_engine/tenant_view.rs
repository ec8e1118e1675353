//! The tenant's view through the real engine: an engine whose path to the members is cut falls
//! back to recomputing, its deployment says so within one window (`--shared-cache-window`, set
//! short for this binary) and recovers once its loads succeed again; restarted mid-window, its
//! counts neither go negative nor double; a tenant filled to a small grant is under
//! `QuotaPressure` until its ceiling is raised.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::reach;
use kvcache_e2e::status::{condition, has_condition, wait_condition, wait_event};
use kvcache_e2e::walkthrough::{self, backend_pods};
use kvcache_e2e::{Error, engine};

use crate::{
    BACKEND, CHAT, NAMESPACE, POOL, PROMPT_TOKENS, TEAM_A, WAIT, ask, cluster, deploy, operator,
    turn, undeploy, write_through,
};

/// The deployment whose engine's store path is cut.
const READER: &str = "fallback";

/// An egress policy on `READER`'s engine Pods: the master's RPC port and the cluster's DNS (at
/// `dns`, the harness's CoreDNS on the node bridge), nothing else, so the master still answers
/// its lookups but no member can be read from.
fn cut_from_members(dns: &str) -> NetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "cut-from-members", "namespace": TEAM_A},
        "spec": {
            "podSelector": {"matchLabels": {
                "app.kubernetes.io/instance": READER,
                "app.kubernetes.io/component": "server",
            }},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                        "podSelector": {"matchLabels": {
                            "app.kubernetes.io/instance": BACKEND,
                            "app.kubernetes.io/component": "leader",
                        }},
                    }],
                    "ports": [{"protocol": "TCP", "port": 50051}],
                },
                {
                    "to": [{"ipBlock": {"cidr": format!("{dns}/32")}}],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
            ],
        },
    }))
    .expect("a NetworkPolicy")
}

/// Probes the members' transfer ports (what an engine dials: the REST port takes the operator
/// alone, docs/isolation.md) from `pod` until each connects (`open`) or none does.
async fn wait_members(client: &Client, pod: &Pod, open: bool) -> Result<(), Error> {
    let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let (low, high) = kvcache_render::objects::backend::access::TRANSFER_PORTS;
    let mut targets = Vec::new();
    for m in pods::wait_ready(&store, &backend_pods(BACKEND, "member-0"), 2, WAIT).await? {
        targets.extend(
            reach::listening(&store, &m, None)
                .await?
                .into_iter()
                .filter(|t| {
                    t.rsplit_once(':')
                        .and_then(|(_, p)| p.parse::<i32>().ok())
                        .is_some_and(|p| (low..=high).contains(&p))
                }),
        );
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
    let what = format!(
        "every member port {} from {}",
        if open { "connecting" } else { "closed" },
        name_of(pod)
    );
    reach::wait_reach(&api, name_of(pod), &targets, open, WAIT, &what)
        .await
        .map(drop)
}

#[test]
fn an_engine_cut_from_the_members_falls_back_and_its_deployment_says_so_then_recovers() {
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    let dns = cluster().nodes.dns.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        // Cut before the engine starts: a NetworkPolicy leaves connections made before it open,
        // and the engine's client keeps its connections to the members. The master still finds
        // the blocks, no member can be read: each load fails (`partial_failure`, TRANSFER_FAIL)
        // and vLLM 0.32 reschedules the request, which looks the blocks up and fails again, so
        // the request waits for as long as the cut lasts.
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), TEAM_A);
        policies
            .patch(
                "cut-from-members",
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(cut_from_members(&dns)),
            )
            .await?;
        let writer = deploy(&client, TEAM_A, CHAT, 1).await?.remove(0);
        let reader = deploy(&client, TEAM_A, READER, 1).await?.remove(0);
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM_A);
        wait_members(&client, &reader, false).await?;
        let p = engine::prompt(601, PROMPT_TOKENS);
        write_through(&client, TEAM_A, &writer, &p).await?;
        let pending = {
            let (client, reader) = (client.clone(), reader.clone());
            tokio::spawn(async move { ask(&client, TEAM_A, &reader, &p).await })
        };
        let m = wait_condition(
            &models,
            READER,
            "SharedCacheHealthy=False/LoadsFallingBack",
            WAIT,
        )
        .await?;
        let why = condition(&m, "SharedCacheHealthy").map(|c| c.message.clone());
        assert!(
            why.as_deref().is_some_and(|w| w.contains(name_of(&reader))),
            "names the failing Pod: {why:?}"
        );
        wait_event(&client, READER, "LoadsFallingBack", name_of(&reader), WAIT).await?;

        // The path back: the waiting request loads once the cut is lifted; once the loads
        // succeed (and the failures leave the window) the deployment is healthy again.
        policies
            .delete("cut-from-members", &DeleteParams::default())
            .await?;
        wait_members(&client, &reader, true).await?;
        let (_, added) = pending.await.map_err(|e| Error::Wait {
            what: "the request sent during the cut".into(),
            reason: e.to_string(),
        })??;
        assert!(
            added.operations.failed_loads > 0 && added.tokens_from_store > 0,
            "the request sent during the cut failed its loads, then loaded once it was lifted: {added:?}"
        );
        let deadline = Instant::now() + WAIT;
        let mut seed = 602;
        loop {
            let p = engine::prompt(seed, PROMPT_TOKENS);
            seed += 1;
            write_through(&client, TEAM_A, &writer, &p).await?;
            ask(&client, TEAM_A, &reader, &p).await?;
            let m = models.get(READER).await?;
            if has_condition(&m, "SharedCacheHealthy=True/LoadsSucceed") {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Wait {
                    what: format!(
                        "{READER}: SharedCacheHealthy=True/LoadsSucceed once loads succeed"
                    ),
                    reason: format!("last seen {:?}", m.status),
                });
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        wait_event(&client, READER, "LoadsRecovered", "", WAIT).await?;

        // The engine restarted mid-window (its processes killed; the kubelet restarts the
        // container in the same Pod, whose counters start again at zero): the window then holds
        // what the new process did, exactly, neither below zero nor its old counts again.
        let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
        let reader = api.get(name_of(&reader)).await?;
        let restarts = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum::<i32>())
        };
        let before = restarts(&reader);
        for pid in pods::host_pids(&reader) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let reader = pods::wait_pods(
            &api,
            &walkthrough::role_pods(READER, "server"),
            "the engine restarted in its Pod and Ready again",
            WAIT,
            |p| p.len() == 1 && restarts(&p[0]) > before && pods::is_ready(&p[0]),
        )
        .await?
        .remove(0);
        let p = engine::prompt(seed, PROMPT_TOKENS);
        write_through(&client, TEAM_A, &writer, &p).await?;
        let (_, added) = ask(&client, TEAM_A, &reader, &p).await?;
        assert!(
            added.tokens_from_store > 0,
            "the restarted engine loads from the store: {added:?}"
        );
        let own = engine::counters(&client, TEAM_A, name_of(&reader)).await?;
        let m = wait_object(
            &models,
            READER,
            "status.sharedCache holding the restarted engine's loads",
            WAIT,
            |m| {
                m.status
                    .as_ref()
                    .and_then(|s| s.shared_cache.as_ref())
                    .is_some_and(|c| c.tokens_from_store >= added.tokens_from_store)
            },
        )
        .await?;
        let cache = m
            .status
            .and_then(|s| s.shared_cache)
            .expect("status.sharedCache");
        assert_eq!(
            (
                cache.queried_tokens,
                cache.tokens_from_store,
                cache.engines_read
            ),
            (own.queried_tokens, own.tokens_from_store, 1),
            "the window holds the new process's own counts ({own:?}): {cache:?}"
        );
        undeploy(&client, TEAM_A, READER).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A team of its own for the quota test, so that its domain starts empty whatever ran before.
const TEAM_Q: &str = "team-q";
/// team-q's deployment that fills its domain.
const FILL: &str = "fill";

/// Applies team-q's Binding (domain `team-q`) with `ceiling`.
async fn bind_team_q(bindings: &Api<KVCachePoolBinding>, ceiling: &str) -> Result<(), Error> {
    let mut b = engine::binding(TEAM_Q, POOL, Some(TEAM_Q));
    b["spec"]["quota"]["ceiling"] = ceiling.into();
    bindings
        .patch(
            TEAM_Q,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&b),
        )
        .await?;
    Ok(())
}

fn granted(b: &KVCachePoolBinding) -> Option<u64> {
    let q = b.status.as_ref()?.effective_quota.as_ref()?;
    parse_bytes(&q.0).ok()
}

#[test]
fn a_tenant_whose_saves_are_refused_at_its_grant_is_under_pressure_until_its_ceiling_is_raised() {
    const KI: u64 = 1024;
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        walkthrough::ensure_namespace(&client, TEAM_Q).await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), TEAM_Q);
        // Beside team-a's and team-b's 8Gi ceilings the 512Mi store recuts a 4608Ki ceiling to
        // a grant of about 144 KiB: two of the tiny model's blocks (64 KiB each), so the
        // domain holds 89 % of it and the store refuses every further block while those two
        // are leased (docs/full-quota-behavior.md).
        bind_team_q(&bindings, "4608Ki").await?;
        let small = wait_object(
            &bindings,
            TEAM_Q,
            "team-q's grant recut to between one and four blocks",
            WAIT,
            |b| granted(b).is_some_and(|g| g > 64 * KI && g <= 256 * KI),
        )
        .await?;
        assert!(
            has_condition(&small, "QuotaPressure=False/BelowGrant"),
            "nothing written yet: {:?}",
            small.status
        );
        let fill = deploy(&client, TEAM_Q, FILL, 1).await?.remove(0);
        let prom = crate::monitoring::start(&[&fill]).await?;
        let deadline = Instant::now() + WAIT;
        let mut seed = 701;
        let at_grant = loop {
            let p = engine::prompt(seed, PROMPT_TOKENS);
            seed += 1;
            let (_, added) = ask(&client, TEAM_Q, &fill, &p).await?;
            let b = bindings.get(TEAM_Q).await?;
            if has_condition(&b, "QuotaPressure=True") {
                break b;
            }
            if Instant::now() > deadline {
                return Err(Error::Wait {
                    what: format!("{TEAM_Q}: QuotaPressure=True once its grant is full"),
                    reason: format!("last prompt added {added:?}; the Binding: {:?}", b.status),
                });
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        // The engine keeps writing while the pressure is checked: refused saves stay in the
        // window, so the condition (and the alert on it) holds until the ceiling is raised.
        let filling = {
            let (client, fill) = (client.clone(), fill.clone());
            tokio::spawn(async move {
                loop {
                    let p = engine::prompt(seed, PROMPT_TOKENS);
                    seed += 1;
                    let _ = ask(&client, TEAM_Q, &fill, &p).await;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
            })
        };
        let c = condition(&at_grant, "QuotaPressure").expect("QuotaPressure");
        assert!(
            c.message.contains("spec.quota.ceiling") || c.message.contains("quota.total"),
            "names the fix: {}",
            c.message
        );
        let cache = at_grant
            .status
            .as_ref()
            .and_then(|s| s.shared_cache.as_ref())
            .expect("the tenant's view");
        assert!(
            c.reason != "SavesRefused" || cache.failed_saves > 0,
            "the refused saves are in the tenant's view: {cache:?}"
        );
        // The condition as the alert reads it (the operator's Binding cache follows the write).
        let series = "kvcache_operator_binding_quota_pressure{namespace=\"team-q\",binding=\"team-q\",domain=\"team-q\"}";
        let deadline = Instant::now() + WAIT;
        loop {
            let text = operator()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .metrics()?;
            let v = kvcache_e2e::store::metric_sum(
                &text,
                "kvcache_operator_binding_quota_pressure",
                &[("namespace", TEAM_Q), ("binding", TEAM_Q), ("domain", TEAM_Q)],
            );
            if v == Some(1.0) {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Wait {
                    what: format!("{series} at 1 in the operator's metrics"),
                    reason: format!("last {v:?}"),
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        wait_event(&client, TEAM_Q, "TenantAtGrant", "", WAIT).await?;
        // Prometheus, scraping the operator (the master's series re-exported) and the engine
        // all along, fires the alert for the filled tenant (its `for` cut to 0s:
        // crate::monitoring), and every dashboard panel has data.
        let firing = crate::monitoring::wait_query(
            &prom,
            "ALERTS{alertname=\"KVCacheTenantAtGrant\",alertstate=\"firing\"}",
            "KVCacheTenantAtGrant firing for team-q",
            |s| s.iter().any(|s| s.metric.get("binding").map(String::as_str) == Some(TEAM_Q)),
        )
        .await?;
        let alert = firing
            .iter()
            .find(|s| s.metric.get("binding").map(String::as_str) == Some(TEAM_Q))
            .expect("the alert");
        assert_eq!(
            (alert.metric.get("namespace"), alert.metric.get("domain")),
            (Some(&TEAM_Q.to_owned()), Some(&TEAM_Q.to_owned())),
            "the tenant's own labels, not the operator's: {alert:?}"
        );
        crate::monitoring::every_panel_has_data(&prom).await?;
        drop(prom);

        // The ceiling raised: the grant follows and the domain is far below it.
        filling.abort();
        bind_team_q(&bindings, "8Gi").await?;
        wait_condition(&bindings, TEAM_Q, "QuotaPressure=False/BelowGrant", WAIT).await?;
        wait_event(&client, TEAM_Q, "TenantBelowGrant", "", WAIT).await?;
        undeploy(&client, TEAM_Q, FILL).await?;
        // Gone, with what it held, so that the other tests' grants are what they were.
        walkthrough::drop_cached_data(&bindings, TEAM_Q).await?;
        let uid = bindings.get(TEAM_Q).await?.metadata.uid.unwrap_or_default();
        bindings.delete(TEAM_Q, &DeleteParams::default()).await?;
        kvcache_e2e::cluster::wait_deleted(&bindings, TEAM_Q, &uid, "team-q's Binding released", WAIT)
            .await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
