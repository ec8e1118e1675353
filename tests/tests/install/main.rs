//! The installation for real: `kubectl apply -f deploy/operator.yaml` (with this cluster's
//! control plane named in its NetworkPolicy, `support::installation`) on a cluster with two
//! real nodes that enforce NetworkPolicy and the locally built images gives two operator Pods
//! (one leads, one stands by and serves webhooks), and the walkthrough, applied with `kubectl`
//! as a user would, converges through them: the API server calls the webhooks through the
//! operator's Service. One cluster and one installation for the binary; the tests take turns.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{block_on, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{phase, wait_condition, wait_event};
use kvcache_e2e::{Error, walkthrough};

mod access;
mod flood;
mod render_drift;
mod support;
mod webhook_guard;
use support::*;

#[test]
fn kubectl_apply_gives_two_ready_replicas_the_walkthrough_converges_and_the_standby_writes_nothing()
{
    let turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        turn.standby_writes.is_empty(),
        "the standby wrote while the installation came up: {:?}",
        turn.standby_writes
    );
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        let operators = wait_replicas(&client, 2).await?;
        converged(&client).await?;
        let leader = holder(&client).await?.expect("the Lease has a holder");
        let leader = pod_of(&leader);
        let standby = operators
            .iter()
            .find(|p| name_of(p) != leader)
            .expect("a standby");
        let standby_ip = pods::ip_of(standby)
            .expect("the standby's address")
            .to_owned();
        let leader_pod = operators
            .iter()
            .find(|p| name_of(p) == leader)
            .expect("the leader is one of the Pods");
        let leader_ip = pods::ip_of(leader_pod)
            .expect("the leader's address")
            .to_owned();
        // What the log holds so far (earlier tests may have moved the leadership).
        let audited = std::fs::read_to_string(&cluster.control_plane.audit_log)
            .unwrap_or_default()
            .lines()
            .count();
        // A ceiling edit: the leader writes the Binding's and the pool's status.
        grant(&client, "64Mi", 64 * MIB).await?;

        // The webhooks through the Service: a second Binding on the domain `default` of the
        // same backend, from another namespace, is refused naming the first.
        walkthrough::ensure_namespace(&client, "team-z").await?;
        let other: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "team-z", "namespace": "team-z"},
            "spec": {"poolRef": {"name": "shared-dram"}, "quota": {"ceiling": "16Mi"},
                     "domain": {"blockSize": 64, "dtype": "bfloat16"}}
        }))
        .expect("a Binding");
        let refused = Api::<KVCachePoolBinding>::namespaced(client.clone(), "team-z")
            .create(&PostParams::default(), &other)
            .await;
        match refused {
            Err(kube::Error::Api(s)) => assert!(
                s.message.contains("team-a/team-a") && s.message.contains("mooncake-dram"),
                "{s:?}"
            ),
            other => panic!("a duplicate domain admitted: {other:?}"),
        }
        // An engine Pod opted in to injection gets the store settings (dry run).
        injected_dry_run(&client, "team-a", "engine").await?;

        // Every write by the operator's account came from the leader: none from the standby's
        // address (both use one field manager, so managedFields cannot tell them apart; the
        // API server's audit log records where each write came from).
        grant(&client, "8Gi", 512 * MIB).await?;
        let writes = operator_writes(cluster, audited);
        assert!(
            writes.iter().any(|(ips, _, _)| ips.contains(&leader_ip)),
            "the leader's writes ({leader_ip}) are audited: {writes:?}"
        );
        let from_standby: Vec<_> = writes
            .iter()
            .filter(|(ips, _, _)| ips.contains(&standby_ip))
            .collect();
        assert!(
            from_standby.is_empty(),
            "the standby {} ({standby_ip}) wrote: {from_standby:?}",
            name_of(standby)
        );
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn metrics_scraped_from_the_pods_expose_every_series_and_logs_carry_the_trace() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        let operators = wait_replicas(&client, 2).await?;
        converged(&client).await?;
        let leader = holder(&client).await?.expect("the Lease has a holder");
        let leader = pod_of(&leader).to_owned();
        // A leader that took over moments ago (another test of this binary may have killed or
        // upgraded the replicas) has not made every pass yet: wait for the series this test
        // asserts on rather than reading them from the first scrape.
        let capacity = "kvcache_operator_backend_capacity_bytes{backend=\"mooncake-dram\"}";
        let reconciled = |text: &str| {
            ["kvcachebackend", "kvcachepool", "kvcachepoolbinding", "modeldeployment"]
                .iter()
                .all(|c| {
                    value(
                        text,
                        &format!("kvcache_operator_reconciles_total{{controller=\"{c}\",result=\"ok\"}}"),
                    )
                    .is_some_and(|v| v > 0.0)
                })
        };
        let store_read =
            |text: &str| sum(text, "kvcache_operator_store_reads_total{backend=\"mooncake-dram\",result=\"ok\"}") > 0.0;
        let text = wait_scrape_for(
            &client,
            &leader,
            "the leader's capacity gauge, a reconcile of every controller and a store read",
            |text| {
                value(text, capacity) == Some((512 * MIB) as f64) && reconciled(text) && store_read(text)
            },
        )
        .await?;
        assert_eq!(value(&text, "kvcache_operator_leader"), Some(1.0), "{text}");
        // Member Pods turn Ready a little after they mount (their probe): the gauge follows.
        let store_pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        pods::wait_ready(&store_pods, &walkthrough::backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        let text = wait_scrape(&client, &leader, "kvcache_operator_backend_members{backend=\"mooncake-dram\",state=\"ready\"}", 2.0).await?;
        assert_eq!(
            value(&text, "kvcache_operator_backend_members{backend=\"mooncake-dram\",state=\"mounted\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            value(&text, "kvcache_operator_backend_degraded{backend=\"mooncake-dram\"}"),
            Some(0.0)
        );
        let granted = value(
            &text,
            "kvcache_operator_binding_granted_bytes{namespace=\"team-a\",binding=\"team-a\",domain=\"default\"}",
        )
        .expect("the Binding's grant");
        assert!(granted > 0.0, "{text}");
        assert!(
            value(
                &text,
                "kvcache_operator_binding_used_bytes{namespace=\"team-a\",binding=\"team-a\",domain=\"default\"}"
            )
            .is_some(),
            "{text}"
        );
        assert_eq!(
            value(
                &text,
                "kvcache_operator_binding_quota_pressure{namespace=\"team-a\",binding=\"team-a\",domain=\"default\"}"
            ),
            Some(0.0),
            "QuotaPressure=False as a number: {text}"
        );
        for controller in [
            "kvcachebackend",
            "kvcachepool",
            "kvcachepoolbinding",
            "modeldeployment",
        ] {
            let ok = format!(
                "kvcache_operator_reconciles_total{{controller=\"{controller}\",result=\"ok\"}}"
            );
            assert!(value(&text, &ok).is_some_and(|v| v > 0.0), "{ok}: {text}");
            assert!(
                sum(
                    &text,
                    &format!(
                        "kvcache_operator_reconcile_duration_seconds_count{{controller=\"{controller}\""
                    )
                ) > 0.0,
                "{controller} durations: {text}"
            );
        }
        assert!(
            sum(&text, "kvcache_operator_store_reads_total{backend=\"mooncake-dram\",result=\"ok\"}") > 0.0,
            "{text}"
        );
        // A validating request of this test's own (a dry-run create goes through admission):
        // another test of this binary may have restarted the replicas since the walkthrough's
        // creates, and a restarted replica starts its counters at zero.
        let instance_type: kvcache_api::model::InstanceType = serde_yaml::from_str(
            "apiVersion: worker.gpustack.ai/v1\nkind: InstanceType\nmetadata: {name: metrics-probe}\nspec:\n  resources: {cpu: '1', memory: 1Gi}\n",
        )
        .expect("an InstanceType");
        Api::<kvcache_api::model::InstanceType>::all(client.clone())
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &instance_type,
            )
            .await?;
        // The webhook requests, on whichever replica served them: counted when the handler
        // ends, so waited for.
        let deadline = Instant::now() + WAIT;
        let after_request = loop {
            let mut webhook = 0.0;
            let mut texts = Vec::new();
            for p in &operators {
                let t = scrape(&client, name_of(p)).await?;
                webhook += sum(
                    &t,
                    "kvcache_operator_webhook_request_duration_seconds_count{webhook=\"validate\"",
                );
                texts.push(t);
            }
            if webhook > 0.0 {
                break texts;
            }
            assert!(
                Instant::now() < deadline,
                "validate requests recorded on either replica within {WAIT:?}; last scrapes:\n{}",
                texts.join("\n---\n")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let standby = operators
            .iter()
            .find(|p| name_of(p) != leader)
            .expect("a standby");
        let standby_text = scrape(&client, name_of(standby)).await?;

        // The figure for the README: each replica's resident memory at rest.
        for p in &operators {
            let kib: u64 = pods::host_pids(p)
                .iter()
                .filter_map(|pid| u32::try_from(*pid).ok())
                .filter_map(kvcache_e2e::process::resident_kib)
                .sum();
            println!("RSS of {} at rest: {:.1} MiB", name_of(p), kib as f64 / 1024.0);
        }

        // Every expression of the alert rules and the dashboard names series that the operator
        // (either replica) or the store's leader exports.
        let store_pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let master = pods::wait_ready(&store_pods, &walkthrough::backend_pods("mooncake-dram", "leader"), 1, WAIT).await?;
        // Read inside the leader Pod: its admin port admits the operator's Pods alone, not the
        // API server's Pod proxy (this cluster enforces the store's NetworkPolicies).
        let master_text = pods::master_page_in(
            &store_pods,
            name_of(&master[0]),
            "master",
            "127.0.0.1:9003",
            "metrics",
        )
        .await?;
        let mut exported = std::collections::BTreeSet::new();
        for t in after_request.iter().chain([&master_text]) {
            for l in t.lines().filter(|l| !l.starts_with('#')) {
                let name = l.split(['{', ' ']).next().unwrap_or_default();
                exported.insert(name.to_owned());
            }
        }
        // The per-deployment shared-cache series need engines that count hits (the stand-in does
        // not): tests/tests/real_engine/main.rs checks those against the real vLLM's deployment.
        for (place, expr) in kvcache_render::install::monitoring::expressions() {
            for series in kvcache_render::install::monitoring::series_in(&expr)
                .into_iter()
                .filter(|s| !kvcache_render::install::monitoring::ENGINE_SERIES.contains(&s.as_str()))
            {
                assert!(
                    exported.contains(&series),
                    "{place} reads {series}, which nothing exports ({expr})"
                );
            }
        }
        assert_eq!(value(&standby_text, "kvcache_operator_leader"), Some(0.0));
        assert!(
            value(&standby_text, "kvcache_operator_reconciles_total{controller=\"kvcachebackend\",result=\"ok\"}").is_none(),
            "the standby reconciles nothing: {standby_text}"
        );

        // JSON logs: a reconcile's lines carry its controller, object and trace id. A ceiling
        // edit makes the Binding controller, the one writer of a Binding's status, write it
        // (a line at info) once the pool's pass has concluded.
        grant(&client, "32Mi", 32 * MIB).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), NS);
        // The line follows the write the grant saw: waited for.
        let deadline = Instant::now() + WAIT;
        let traced = loop {
            let log = pods::logs(&api, &leader, None).await?;
            let found = log
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|l| {
                    l["fields"]["message"] == "status updated"
                        && l["fields"]["kind"] == "KVCachePoolBinding"
                        && l["fields"]["name"] == "team-a"
                })
                .find_map(|l| {
                    // The reconcile's span among the line's spans (kube-runtime's is outside it).
                    l["spans"].as_array()?.iter().find(|s| {
                        s["controller"] == "kvcachepoolbinding" && s["object"] == "team-a"
                    }).cloned()
                });
            if let Some(span) = found {
                break span;
            }
            assert!(
                Instant::now() < deadline,
                "no JSON line of the Binding controller writing the Binding within {WAIT:?} in:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        grant(&client, "8Gi", 512 * MIB).await?;
        let trace = traced["trace_id"].as_str().unwrap_or_default();
        assert_eq!(trace.len(), 32, "{traced}");
        assert!(trace.chars().all(|c| c.is_ascii_hexdigit()), "{traced}");
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_operator_pod_is_admitted_under_the_restricted_pod_security_standard() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        let ns = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "restricted", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}
        });
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .patch(
                "restricted",
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(&ns),
            )
            .await?;
        let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
            .get("kvcache-operator")
            .await?;
        let template = deployment
            .spec
            .map(|s| s.template)
            .expect("a Pod template");
        let pod = |edit: &dyn Fn(&mut Pod)| {
            let mut p = Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some("operator".into()),
                    namespace: Some("restricted".into()),
                    ..Default::default()
                },
                spec: template.spec.clone(),
                ..Default::default()
            };
            // The account is the installation's namespace's; the security check is the same.
            if let Some(s) = p.spec.as_mut() {
                s.service_account_name = None;
                s.service_account = None;
            }
            edit(&mut p);
            p
        };
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), "restricted");
        pods.create(&dry, &pod(&|_| {})).await?;
        // The check is on: the same Pod allowed to escalate is refused.
        let escalating = pods
            .create(
                &dry,
                &pod(&|p| {
                    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
                        c.security_context
                            .get_or_insert_with(Default::default)
                            .allow_privilege_escalation = Some(true);
                    }
                }),
            )
            .await;
        match escalating {
            Err(kube::Error::Api(s)) => {
                assert!(s.message.contains("violates PodSecurity"), "{s:?}")
            }
            other => panic!("an escalating Pod admitted under restricted: {other:?}"),
        }
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_deleted_leader_hands_over_at_once_a_killed_one_within_the_lease_and_reconciling_goes_on() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        wait_replicas(&client, 2).await?;
        converged(&client).await?;
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);

        // Deleting the leader Pod: SIGTERM, the Lease released, the standby takes it.
        let first = holder(&client).await?.expect("a holder");
        let t = Instant::now();
        pods_api
            .delete(pod_of(&first), &DeleteParams::default())
            .await?;
        let second = wait_new_holder(&client, &first, LEASE).await?;
        let sigterm = t.elapsed();
        println!(
            "SIGTERM handover: {:.2} s ({first} -> {second})",
            sigterm.as_secs_f64()
        );
        let operators = wait_replicas(&client, 2).await?;

        // Killing the leader's process: nothing released; the standby waits out the Lease.
        let leader = operators
            .iter()
            .find(|p| name_of(p) == pod_of(&second))
            .expect("the new leader is one of the Pods");
        let t = Instant::now();
        for pid in pods::host_pids(leader) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let third = wait_new_holder(&client, &second, LEASE * 3).await?;
        let killed = t.elapsed();
        println!(
            "kill -9 handover: {:.2} s ({second} -> {third})",
            killed.as_secs_f64()
        );

        // The walkthrough is still reconciled: a ceiling edit reaches the grant.
        grant(&client, "128Mi", 128 * MIB).await?;
        wait_replicas(&client, 2).await?;
        grant(&client, "8Gi", 512 * MIB).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_uninstall_keeps_the_crds_the_objects_and_the_store_and_a_reinstall_picks_them_up() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        wait_replicas(&client, 2).await?;
        converged(&client).await?;
        let install = installation().display().to_string();
        // The README's one command.
        run_kubectl(&[
            "delete",
            "-f",
            &install,
            "-l",
            "app.kubernetes.io/component=operator",
            "--wait=true",
        ]);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
        assert!(deployments.get_opt("kvcache-operator").await?.is_none());
        // Kept: the CRDs and every object, the namespace, the store still serving.
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        assert_eq!(
            crds.list(&Default::default())
                .await?
                .items
                .iter()
                .filter(|c| c.spec.group == "worker.gpustack.ai")
                .count(),
            5
        );
        assert!(
            Api::<KVCacheBackend>::all(client.clone())
                .get_opt("mooncake-dram")
                .await?
                .is_some()
        );
        let store: Api<Pod> = Api::namespaced(client.clone(), NS);
        pods::wait_ready(
            &store,
            &walkthrough::backend_pods("mooncake-dram", "member-0"),
            2,
            WAIT,
        )
        .await?;
        // Installed again: it picks everything up where it was.
        run_kubectl(&["apply", "-f", &install]);
        wait_replicas(&client, 2).await?;
        converged(&client).await?;
        grant(&client, "96Mi", 96 * MIB).await?;
        grant(&client, "8Gi", 512 * MIB).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The store Pods of every backend: name, uid and the restarts of each container, sorted.
#[test]
fn an_operator_upgrade_to_a_new_image_tag_restarts_no_store_pod_and_every_key_still_hits() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        wait_replicas(&client, 2).await?;
        converged(&client).await?;
        // A backend whose leader elects (two replicas) and whose members find it through the
        // Lease: both templates deliver the elector, the part an operator release could touch.
        let name = "upgrade-ha";
        let text =
            std::fs::read_to_string(walkthrough::examples("walkthrough").join("01-backend.yaml"))
                .expect("the walkthrough's backend");
        let mut v: serde_json::Value = serde_yaml::from_str(&text).expect("YAML");
        v["metadata"]["name"] = name.into();
        v["spec"]["image"] = kvcache_api::settings::DEFAULT_BACKEND_IMAGE.into();
        let managed = &mut v["spec"]["connection"]["managed"];
        managed["leader"] = serde_json::json!({
            "replicas": 2, "memberAddressing": "Lease", "multiTenancy": false
        });
        managed["members"][0]["capacityPerMember"] = "64Mi".into();
        walkthrough::rig_store_resources(&mut v, walkthrough::RIG_STORE_CPU);
        let backend: KVCacheBackend = serde_json::from_value(v).expect("a KVCacheBackend");
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        backends
            .patch(
                name,
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(&backend),
            )
            .await?;
        wait_object(&backends, name, "Ready with 128Mi", WAIT, |b| {
            phase(b) == Some(BackendPhase::Ready)
                && b.status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| parse_bytes(&c.total.0).ok())
                    == Some(128 * MIB)
        })
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NS);
        // Under election one leader replica is Ready: the Lease holder.
        pods::wait_pods(
            &store,
            &walkthrough::backend_pods(name, "leader"),
            "2 leader Pods, 1 Ready (the Lease holder)",
            WAIT,
            |p| p.len() == 2 && p.iter().filter(|p| pods::is_ready(p)).count() == 1,
        )
        .await?;
        let members = pods::wait_ready(
            &store,
            &walkthrough::backend_pods(name, "member-0"),
            2,
            WAIT,
        )
        .await?;
        let member = name_of(&members[0]).to_owned();
        let master = format!("{name}-leader.{NS}.svc:50051");
        let keys: Vec<String> = (0..8).map(|i| format!("upgrade-{i}")).collect();
        for key in &keys {
            let code = pods::store_put(&store, &member, &master, key, None, 64 << 10).await?;
            assert_eq!(code, 0, "put {key}");
        }
        let before = store_pods(&client).await?;

        // The upgrade: the same operator under another tag, as a release changes it.
        let next = kvcache_e2e::images::OPERATOR_NEXT.trim_start_matches("docker.io/");
        let leader = roll_operator_to(&client, next).await?;
        // The new leader has reconciled the backend (it sets the capacity gauge as it does).
        wait_scrape(
            &client,
            &leader,
            &format!("kvcache_operator_backend_capacity_bytes{{backend=\"{name}\"}}"),
            (128 * MIB) as f64,
        )
        .await?;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
        let leader_set = deployments.get(&format!("{name}-leader")).await?;
        let s = leader_set.status.clone().unwrap_or_default();
        assert_eq!(
            (s.observed_generation, s.updated_replicas),
            (leader_set.metadata.generation, Some(2)),
            "the leader Deployment's template was not changed by the upgrade"
        );
        let after = store_pods(&client).await?;
        assert_eq!(
            after, before,
            "no store Pod was replaced or restarted by the operator upgrade"
        );
        for key in &keys {
            match pods::store_get(&store, &member, &master, key, None).await? {
                kvcache_e2e::store::Lookup::Hit(bytes) => {
                    assert_eq!(bytes, 64 << 10, "{key} read back whole")
                }
                miss => panic!("{key} after the upgrade: {miss:?}"),
            }
        }

        // Back to the installed tag (a rollback is an upgrade too), the backend removed.
        roll_operator_to(
            &client,
            kvcache_render::plan::resolve::DEFAULT_OPERATOR_IMAGE,
        )
        .await?;
        assert_eq!(store_pods(&client).await?.len(), after.len());
        backends.delete(name, &DeleteParams::default()).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Scales the operator Deployment to `n` replicas and waits until exactly `n` of its Pods run.
#[test]
fn with_the_operator_scaled_to_zero_a_stuck_binding_and_its_namespace_can_still_be_removed() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        wait_replicas(&client, 2).await?;
        converged(&client).await?;
        let ns = "team-stuck";
        second_binding(&client, ns, "stuck").await?;
        scale_operator(&client, 0).await?;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);

        // A change the webhook judges still fails closed while no operator answers.
        let refused = bindings
            .patch(
                ns,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"quota": {"ceiling": "32Mi"}}})),
            )
            .await;
        match refused {
            Err(kube::Error::Api(e)) => assert!(
                e.message.contains("validate.kvcache.gpustack.ai"),
                "refused by the unreachable webhook: {}",
                e.message
            ),
            other => panic!("a spec change with no operator running: {other:?}"),
        }
        // The namespace is deleted; the Binding waits on its finalizer (nobody releases it).
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::default())
            .await?;
        wait_object(&bindings, ns, "a deletion timestamp", WAIT, |b| {
            b.metadata.deletion_timestamp.is_some()
        })
        .await?;
        // The user's way out: the finalizer removed by hand. A finalizer-only update does not
        // go to the webhook, so the stopped operator does not block it.
        bindings
            .patch(
                ns,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await?;
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let deadline = Instant::now() + WAIT;
        while namespaces.get_opt(ns).await?.is_some() {
            assert!(
                Instant::now() < deadline,
                "namespace {ns} still there {WAIT:?} after its last finalizer was removed"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        scale_operator(&client, 2).await?;
        converged(&client).await?;
        // Nothing released the stuck Binding's tenant on the master. It held nothing, so the
        // next pool pass removes it: team-a is granted the whole capacity again (the stuck
        // ceiling took a share of it), an event says why, and the pool names no unclaimed
        // tenant.
        grant(&client, "8Gi", 512 * MIB).await?;
        wait_event(
            &client,
            "shared-dram",
            "UnclaimedTenantRemoved",
            "tenant stuck ",
            WAIT,
        )
        .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        wait_condition(
            &pools,
            "shared-dram",
            "TenantsClaimed=True/AllClaimed",
            WAIT,
        )
        .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_deleted_binding_whose_tenant_holds_data_revokes_it_and_drops_the_data_and_other_tenants_keep_theirs()
 {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        wait_replicas(&client, 2).await?;
        converged(&client).await?;
        let ns = "team-drop";
        let domain = "drop-me";
        second_binding(&client, ns, domain).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NS);
        let members = pods::wait_ready(
            &store,
            &walkthrough::backend_pods("mooncake-dram", "member-0"),
            2,
            WAIT,
        )
        .await?;
        let member = name_of(&members[0]).to_owned();
        let master = format!("mooncake-dram-leader.{NS}.svc:50051");
        for i in 0..4 {
            let code = pods::store_put(
                &store,
                &member,
                &master,
                &format!("drop-{i}"),
                Some(domain),
                64 << 10,
            )
            .await?;
            assert_eq!(code, 0, "put drop-{i} as {domain}");
        }
        // team-a's tenant ("default": the walkthrough Binding names no domain) holds a key too.
        let code = pods::store_put(&store, &member, &master, "kept", Some("default"), 4096).await?;
        assert_eq!(code, 0, "put kept as default");

        // Deleted: its tenant revoked (no put of it from then on, on any connection) and its
        // objects removed, without being asked (docs/design.md#binding-release), then released.
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
        let uid = bindings.get(ns).await?.metadata.uid.unwrap_or_default();
        bindings.delete(ns, &DeleteParams::default()).await?;
        kvcache_e2e::cluster::wait_deleted(&bindings, ns, &uid, "the Binding released", WAIT)
            .await?;
        wait_event(&client, ns, "TenantRevoked", domain, WAIT).await?;
        wait_event(&client, ns, "CachedDataDropped", "removed 4 objects", WAIT).await?;
        for i in 0..4 {
            let got =
                pods::store_get(&store, &member, &master, &format!("drop-{i}"), Some(domain)).await;
            assert!(
                !matches!(got, Ok(kvcache_e2e::store::Lookup::Hit(_))),
                "drop-{i} is gone with its tenant: {got:?}"
            );
        }
        match pods::store_get(&store, &member, &master, "kept", Some("default")).await? {
            kvcache_e2e::store::Lookup::Hit(n) => assert_eq!(n, 4096),
            miss => panic!("another tenant's key after the drop: {miss:?}"),
        }
        walkthrough::delete_namespace(&client, ns).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
