//! A backend's status and life: the capacity its members mounted and the member a Degraded
//! phase names, a deletion held while a pool uses it, what it no longer renders pruned, an
//! operator restarted while it renders one, and segments mounted by a member of another backend
//! or by no member at all.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kvcache_api::backend::BackendPhase;
use kvcache_api::{KVCacheBackend, KVCachePool};
use kvcache_e2e::Error;
use kvcache_e2e::cluster::{block_on, client_from, wait_deleted, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{condition, has_condition, phase};
use kvcache_e2e::walkthrough::{self, backend_pods};
use kvcache_render::objects::backend::OWNER_LABEL;

use crate::{
    MIB, NAMESPACE, WAIT, apply, backend, capacity, cluster, operator, signal, wait_backend,
    wait_backend_ready,
};

#[test]
fn the_walkthrough_backend_is_ready_with_what_its_members_mounted_and_degraded_names_a_stopped_member()
 {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-ready";
        apply(&client, &backend(name, |_| {})).await?;
        // Two members' 256Mi each.
        let b = wait_backend_ready(&client, name, 512 * MIB).await?;
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
            "Degraded, MembersMounted=False naming the stopped member, and the store's own capacity figure down to the other member's",
            // The master lists a dropped segment and reports its capacity figure through two
            // answers a pass reads apart (`/get_segments_detail`, `/metrics`): wait for both.
            |b| {
                phase(b) == Some(BackendPhase::Degraded)
                    && has_condition(b, "MembersMounted=False")
                    && condition(b, "MembersMounted")
                        .is_some_and(|c| c.message.contains(name_of(stopped)))
                    && capacity(b) == Some(256 * MIB)
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
        wait_backend_ready(&client, name, 512 * MIB).await?;
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
        wait_backend_ready(&client, name, 512 * MIB).await?;
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
                && has_condition(b, "Deletable=False")
                && condition(b, "Deletable").is_some_and(|c| c.message.contains("holds-dram-held"))
        })
        .await?;
        assert!(held.metadata.deletion_timestamp.is_some());
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;

        // The pool goes: so does the backend, with its workloads and their Pods.
        pools
            .delete("holds-dram-held", &DeleteParams::default())
            .await?;
        wait_deleted(
            &backends,
            name,
            &held.uid().unwrap_or_default(),
            "gone once its pool is",
            WAIT,
        )
        .await?;
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
fn what_a_backend_no_longer_renders_goes_its_tenant_policy_and_its_members_policy() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-pruned";
        apply(&client, &backend(name, |_| {})).await?;
        // The policies applied and their enforcement probed (these nodes run no enforcer).
        wait_backend(&client, name, "NetworkIsolated=False/NotEnforced", |b| {
            has_condition(b, "NetworkIsolated=False/NotEnforced")
        })
        .await?;
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), NAMESPACE);
        let tenant_policy = format!("{name}-tenant-policy");
        let members_policy = format!("{name}-members");
        let map = wait_object(&maps, &tenant_policy, "the tenant policy", WAIT, |_| true).await?;
        let members = wait_object(
            &policies,
            &members_policy,
            "the members' policy",
            WAIT,
            |_| true,
        )
        .await?;

        // Multi-tenancy off (no pool uses the backend): the tenant policy goes.
        let plain = |v: &mut serde_json::Value| {
            v["spec"]["connection"]["managed"]["leader"]["multiTenancy"] = false.into();
        };
        apply(&client, &backend(name, plain)).await?;
        wait_deleted(
            &maps,
            &tenant_policy,
            &map.uid().unwrap_or_default(),
            "pruned once multi-tenancy is off",
            WAIT,
        )
        .await?;

        // Its one member group on the host network (RDMA), where no policy reaches: the
        // members' policy goes and the status says why; the leader's stays.
        apply(
            &client,
            &backend(name, |v| {
                plain(v);
                v["spec"]["connection"]["managed"]["members"][0]["transport"] =
                    serde_json::json!({"protocol": "RDMA"});
            }),
        )
        .await?;
        let b = wait_backend(
            &client,
            name,
            "NetworkIsolated=False/HostNetworkMembers",
            |b| has_condition(b, "NetworkIsolated=False/HostNetworkMembers"),
        )
        .await?;
        let why = condition(&b, "NetworkIsolated").map(|c| c.message.clone());
        assert!(
            why.as_deref()
                .is_some_and(|m| m.contains(&format!("{name}-member-0"))),
            "names the group's DaemonSet: {why:?}"
        );
        wait_deleted(
            &policies,
            &members_policy,
            &members.uid().unwrap_or_default(),
            "pruned once no member group is off the host network",
            WAIT,
        )
        .await?;
        assert!(
            policies.get_opt(&format!("{name}-leader")).await?.is_some(),
            "the leader's policy stays"
        );

        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let uid = b.uid().unwrap_or_default();
        backends.delete(name, &DeleteParams::default()).await?;
        wait_deleted(&backends, name, &uid, "deleted", WAIT).await
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
    // Restarted while it renders the new backend; no other test's Pods meet its webhook down.
    let _down = crate::OPERATOR_UP
        .write()
        .unwrap_or_else(|p| p.into_inner());
    operator()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .restart()
        .unwrap_or_else(|e| panic!("the operator restarts: {e}"));
    block_on(async move {
        let client = client_from(&kc).await?;
        // After the restart.
        let b = wait_backend_ready(&client, name, 512 * MIB).await?;
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

#[test]
fn a_member_of_another_backend_mounted_on_this_master_is_named_and_restarted() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-foreign";
        apply(&client, &backend(name, |_| {})).await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        // A member Pod of backend "dram-elsewhere" (by its labels, as its DaemonSet would make
        // it) whose client dials this backend's master: what a member redialing a reused
        // address does.
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let stray = "dram-elsewhere-member-0-stray";
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": stray, "labels": {
                "app.kubernetes.io/name": "kv-cache-backend",
                "app.kubernetes.io/instance": "dram-elsewhere",
                "app.kubernetes.io/component": "member-0"
            }},
            "spec": {"containers": [{
                "name": "member", "image": crate::PINNED_IMAGE,
                "command": ["mc_store_rest_server"],
                "env": [
                    {"name": "MOONCAKE_TE_META_DATA_SERVER", "value": "P2PHANDSHAKE"},
                    {"name": "MOONCAKE_MASTER", "value": format!("{name}-leader.{NAMESPACE}.svc:50051")},
                    {"name": "MOONCAKE_PROTOCOL", "value": "tcp"},
                    {"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MOONCAKE_GLOBAL_SEGMENT_SIZE", "value": "33554432"},
                    {"name": "MOONCAKE_LOCAL_BUFFER_SIZE", "value": "16777216"}
                ]
            }]}
        }))
        .expect("a Pod");
        let created = store.create(&Default::default(), &pod).await?;
        let uid = created.uid().unwrap_or_default();
        let b = wait_backend(
            &client,
            name,
            "MembersMounted=False/ForeignMember naming the stray member",
            |b| {
                condition(b, "MembersMounted").is_some_and(|c| {
                    c.reason == "ForeignMember" && c.message.contains(stray)
                })
            },
        )
        .await?;
        assert_eq!(phase(&b), Some(BackendPhase::Degraded));
        // Restarted: the stray Pod is deleted (a DaemonSet would make it again, on its own
        // master), and a Warning event on the backend names it.
        pods::wait_pods(&store, "app.kubernetes.io/instance=dram-elsewhere", "the stray member deleted", WAIT, |p| {
            p.iter().all(|p| p.uid().as_deref() != Some(uid.as_str()) || p.metadata.deletion_timestamp.is_some())
        })
        .await?;
        kvcache_e2e::status::wait_event(&client, name, "ForeignMemberRestarted", stray, WAIT).await?;
        // Once its segment is gone the backend is Ready again with its own two members.
        wait_backend_ready(&client, name, 512 * MIB).await?;
        crate::remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A process that is no member mounts a segment on the backend's master (the store's own
/// REST server with a 32 MiB segment, in a namespace of its own): once listed past the master's
/// client TTL the backend names it (`UnknownSegments`, `status.unknownSegments` with its
/// address and Pod), warns once, counts it on `/metrics`, and drains it so that no block lands
/// there (docs/isolation.md#unknown-segments); deleting the process clears it all.
#[test]
fn a_segment_no_member_mounted_is_named_with_its_pod_counted_and_drained() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-rogue";
        let ns = "kvc-rogue";
        apply(&client, &backend(name, |_| {})).await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        // The members alone (a member's segment can be listed a moment before its Pod's
        // address is: pending, never counted).
        wait_backend(&client, name, "UnknownSegments=False/None, none listed", |b| {
            has_condition(b, "UnknownSegments=False/None")
                && b.status.as_ref().is_some_and(|s| s.unknown_segments.is_empty())
        })
        .await?;
        walkthrough::ensure_namespace(&client, ns).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "rogue", "labels": {"app": "rogue"}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "rogue", "image": crate::PINNED_IMAGE, "imagePullPolicy": "Never",
                "command": ["mc_store_rest_server"],
                "env": [
                    {"name": "MOONCAKE_TE_META_DATA_SERVER", "value": "P2PHANDSHAKE"},
                    {"name": "MOONCAKE_MASTER", "value": format!("{name}-leader.{NAMESPACE}.svc:50051")},
                    {"name": "MOONCAKE_PROTOCOL", "value": "tcp"},
                    {"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MOONCAKE_GLOBAL_SEGMENT_SIZE", "value": "33554432"},
                    {"name": "MOONCAKE_LOCAL_BUFFER_SIZE", "value": "16777216"}
                ]
            }]}
        }))
        .expect("a Pod");
        api.create(&Default::default(), &pod).await?;
        let rogue = pods::wait_pod(&api, "rogue", "running with an address", WAIT, |p| {
            pods::ip_of(p).is_some() && pods::is_ready(p)
        })
        .await?;
        let ip = pods::ip_of(&rogue).expect("an address").to_owned();
        // Named once past its grace (the master's 10 s client TTL and 20 s): the condition
        // names the segment's address and the Pod there.
        let b = wait_backend(
            &client,
            name,
            "UnknownSegments=True/MountedByNoMember naming the rogue",
            |b| {
                condition(b, "UnknownSegments").is_some_and(|c| {
                    c.status == "True"
                        && c.reason == "MountedByNoMember"
                        && c.message.contains(&format!("at address {ip}, Pod {ns}/rogue"))
                })
            },
        )
        .await?;
        let status = b.status.clone().unwrap_or_default();
        let [seen] = status.unknown_segments.as_slice() else {
            panic!("one unknown segment: {:?}", status.unknown_segments);
        };
        assert!(seen.confirmed && seen.segment_name.starts_with(&format!("{ip}:")), "{seen:?}");
        assert_eq!(seen.pod.as_deref(), Some("kvc-rogue/rogue"));
        assert_eq!(seen.size.as_deref(), Some("32Mi"));
        // The phase is the store's service: still Ready.
        assert_eq!(phase(&b), Some(BackendPhase::Ready));
        kvcache_e2e::status::wait_event(&client, name, "UnknownSegment", &ip, WAIT).await?;
        // Drained onto the members: the master takes no new block into it.
        wait_backend(&client, name, "the rogue's segment DRAINED", |b| {
            b.status.as_ref().is_some_and(|s| {
                s.unknown_segments.iter().any(|u| u.address == ip && u.state == "DRAINED")
            })
        })
        .await?;
        kvcache_e2e::status::wait_event(&client, name, "UnknownSegmentDraining", &ip, WAIT).await?;
        let (host, port) = {
            let op = operator().lock().unwrap_or_else(|p| p.into_inner());
            (op.host.clone(), op.metrics_port)
        };
        let metrics = kvcache_e2e::store::http_get(&format!("http://{host}:{port}/metrics"))?;
        assert_eq!(
            kvcache_e2e::store::metric_sum(
                &metrics,
                "kvcache_operator_backend_unknown_segments",
                &[("backend", name)]
            ),
            Some(1.0),
            "{metrics}"
        );
        // The process gone (its segment unmounted): nothing unknown, the count back to 0.
        api.delete("rogue", &DeleteParams::default()).await?;
        wait_backend(&client, name, "UnknownSegments=False/None again", |b| {
            has_condition(b, "UnknownSegments=False/None")
                && b.status.as_ref().is_some_and(|s| s.unknown_segments.is_empty())
        })
        .await?;
        let metrics = kvcache_e2e::store::http_get(&format!("http://{host}:{port}/metrics"))?;
        assert_eq!(
            kvcache_e2e::store::metric_sum(
                &metrics,
                "kvcache_operator_backend_unknown_segments",
                &[("backend", name)]
            ),
            Some(0.0),
            "{metrics}"
        );
        crate::remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The counterpart of `network_policy.rs`'s tenant test on nodes without an enforcer: the
/// same probes see an unbound namespace connect to the master's RPC and admin ports, so that
/// test's refusals are the enforcer's doing, not the probe's; and the operator's own probe
/// finds the same: `NetworkIsolated=False/NotEnforced` naming the master's RPC address it
/// dialled, a `NotEnforced` warning, its probe Pod deleted once read
/// (docs/isolation.md#enforcement-checked).
#[test]
fn without_an_enforcer_the_same_probes_see_an_unbound_namespace_reach_the_store() {
    use kvcache_e2e::reach::{self, Reach};
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-unenforced";
        apply(
            &client,
            &backend(name, |v| {
                v["spec"]["connection"]["managed"]["members"][0]["capacityPerMember"] =
                    "64Mi".into();
            }),
        )
        .await?;
        wait_backend_ready(&client, name, 128 * MIB).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let leader = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
        let ip = pods::ip_of(&leader[0]).expect("an address").to_owned();
        let ns = "unbound-probe";
        walkthrough::ensure_namespace(&client, ns).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "prober", "namespace": ns, "labels": {"app": "prober"}},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": crate::PINNED_IMAGE, "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"]}]
            }
        }))
        .expect("a Pod");
        api.create(&Default::default(), &pod).await?;
        let prober = pods::wait_ready(&api, "app=prober", 1, WAIT).await?;
        let targets = [format!("{ip}:50051"), format!("{ip}:9003")];
        let seen = reach::probe(&api, name_of(&prober[0]), &targets).await?;
        assert!(
            seen.values().all(|r| *r == Reach::Connected),
            "no enforcer: the policies are inert and the probe connects: {seen:?}"
        );
        let b = wait_backend(&client, name, "NetworkIsolated=False/NotEnforced", |b| {
            has_condition(b, "NetworkIsolated=False/NotEnforced")
        })
        .await?;
        let why = condition(&b, "NetworkIsolated").map(|c| c.message.clone()).unwrap_or_default();
        assert!(
            why.contains(&format!("master's RPC port at {ip}:50051 and connected")),
            "names what it dialled: {why}"
        );
        let record = b
            .status
            .as_ref()
            .and_then(|s| s.isolation_probe.clone())
            .expect("status.isolationProbe");
        assert_eq!(record.target, format!("{ip}:50051"));
        assert!(record.pod.starts_with(&format!("{NAMESPACE}/{name}-probe-")), "{record:?}");
        kvcache_e2e::status::wait_event(&client, name, "NotEnforced", &format!("{ip}:50051"), WAIT)
            .await?;
        // One Pod for the change, deleted once its result was read.
        pods::wait_pods(
            &store,
            &format!("{}={name}", kvcache_render::objects::backend::probe::PROBE_LABEL),
            "the probe Pod deleted",
            WAIT,
            |p| p.is_empty(),
        )
        .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
