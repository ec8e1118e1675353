//! Warm failover (`leader.electionBackend: Etcd`, docs/warm-failover.md): the operator runs an
//! etcd for the backend on local volumes, the masters elect through it and replay its metadata
//! operation log, so keys written before a failover or a leader restart read back after it with
//! their bytes; a member replaced while no master serves turns its keys into misses, never into
//! other bytes. The keys go through the store's own client dialling `status.endpoint`, the
//! leader Service the engines are given (the etcd answers the backend's own Pods alone; the
//! Service follows the serving master).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::Error;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::rollout::{KeyCount, keys};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::walkthrough::backend_pods;

use crate::{
    MIB, NAMESPACE, WAIT, apply, backend, capacity, cluster, remove_backend, signal, wait_backend,
};

/// Keys written before the failover: 40 of 1 MiB, spread over both 256 MiB members.
pub(crate) const KEYS: usize = 40;
const SIZE: usize = 1 << 20;

/// The demo-size backend `name` with warm failover at `replicas` leaders, one tenant-less store
/// (the default tenant writes without a pool or Binding), its etcd on the harness's local
/// volumes.
pub(crate) fn warm(name: &str, replicas: i32) -> KVCacheBackend {
    backend(name, |v| {
        v["spec"]["connection"]["managed"]["leader"] = serde_json::json!({
            "replicas": replicas,
            "electionBackend": "Etcd",
            "multiTenancy": false,
            "etcd": {"storageClassName": LOCAL_CLASS, "storageSize": "64Mi"},
        });
    })
}

/// The warm election's figures in the status: the view and the keys the operator last read.
pub(crate) fn election(b: &KVCacheBackend) -> (Option<i64>, Option<i64>) {
    b.status
        .as_ref()
        .and_then(|s| s.election.as_ref())
        .map_or((None, None), |e| (e.view_version, e.keys))
}

/// Ready with both members' 512Mi, a master elected through etcd, the etcd in quorum.
pub(crate) fn serving(b: &KVCacheBackend) -> bool {
    phase(b) == Some(BackendPhase::Ready)
        && capacity(b) == Some(512 * MIB)
        && has_condition(b, "ElectionObserved=True")
        && has_condition(b, "EtcdAvailable=True")
}

/// `status.endpoint`: the leader Service's address.
fn endpoint(b: &KVCacheBackend) -> String {
    b.status
        .as_ref()
        .and_then(|s| s.endpoint.clone())
        .unwrap_or_default()
}

/// Writes the keys through a member Pod and waits until the operator read the master's count.
pub(crate) async fn write_keys(
    client: &kube::Client,
    store: &Api<Pod>,
    name: &str,
) -> Result<(KVCacheBackend, String), Error> {
    let b = wait_backend(
        client,
        name,
        "warm: Ready, elected, etcd in quorum",
        serving,
    )
    .await?;
    let master = endpoint(&b);
    assert_eq!(
        master,
        format!(
            "{}.{NAMESPACE}.svc:50051",
            kvcache_render::objects::backend::leader_name(name)
        ),
        "the engines' entry is the leader Service, not the etcd: {}",
        describe(&b)
    );
    let members = pods::wait_ready(store, &backend_pods(name, "member-0"), 2, WAIT).await?;
    let wrote = keys(
        store,
        name_of(&members[0]),
        &master,
        "put",
        name,
        KEYS,
        SIZE,
    )
    .await?;
    assert_eq!(wrote.ok, KEYS, "every key written: {wrote:?}");
    let b = wait_backend(client, name, &format!("status.election.keys {KEYS}"), |b| {
        election(b).1 == Some(KEYS as i64)
    })
    .await?;
    Ok((b, master))
}

/// Reads the keys back through a Ready member Pod.
async fn read_keys(store: &Api<Pod>, name: &str, master: &str) -> Result<KeyCount, Error> {
    let members = pods::wait_ready(store, &backend_pods(name, "member-0"), 2, WAIT).await?;
    keys(store, name_of(&members[0]), master, "get", name, KEYS, SIZE).await
}

#[test]
fn a_warm_backend_keeps_every_key_when_its_serving_leader_pod_is_deleted() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-warm";
        // Three etcd members (standbys asked for), at most two on a node.
        local_volumes(&client, &cluster.nodes, name, 2).await?;
        apply(&client, &warm(name, 2)).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let etcd = pods::wait_ready(&store, &backend_pods(name, "etcd"), 3, WAIT).await?;
        assert_eq!(etcd.len(), 3, "three etcd members with standbys");
        let (before, master) = write_keys(&client, &store, name).await?;
        let (view, _) = election(&before);
        let leaders = pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "2 leader Pods, 1 Ready",
            WAIT,
            |p| p.len() == 2 && p.iter().filter(|p| pods::is_ready(p)).count() == 1,
        )
        .await?;
        let serving_pod = leaders.iter().find(|p| pods::is_ready(p)).expect("a Ready leader");
        store
            .delete(name_of(serving_pod), &DeleteParams::default())
            .await?;
        let after = wait_backend(
            &client,
            name,
            "a new view serving with 512Mi and FailoverKeptCache said",
            |b| {
                serving(b)
                    && election(b).0.is_some_and(|v| Some(v) != view)
                    && (has_condition(b, "FailoverKeptCache=True")
                        || has_condition(b, "FailoverKeptCache=False"))
            },
        )
        .await?;
        let read = read_keys(&store, name, &master).await?;
        println!(
            "warm failover (serving leader Pod deleted): {} of {} keys read back with their bytes ({} wrong, {} missing, {} failed); {}",
            read.ok, read.of, read.wrong, read.missing, read.failed, describe(&after)
        );
        assert_eq!(read.ok, KEYS, "every key read back after the failover: {read:?}");
        assert_eq!(read.wrong, 0, "no key reads back other bytes");
        assert!(
            has_condition(&after, "FailoverKeptCache=True"),
            "the status says the failover kept the cache: {}",
            describe(&after)
        );
        remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_single_warm_leader_restart_keeps_the_keys_and_a_member_replaced_meanwhile_gives_misses_not_wrong_bytes()
 {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-warm-one";
        local_volumes(&client, &cluster.nodes, name, 1).await?;
        apply(&client, &warm(name, 1)).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let (before, master) = write_keys(&client, &store, name).await?;
        let (view, _) = election(&before);

        // The only leader Pod deleted: a new Pod, a new address, the same etcd.
        let leader = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
        let first = leader[0].uid();
        store
            .delete(name_of(&leader[0]), &DeleteParams::default())
            .await?;
        pods::wait_pods(
            &store,
            &backend_pods(name, "leader"),
            "a new Ready leader Pod",
            WAIT,
            |p| p.len() == 1 && pods::is_ready(&p[0]) && p[0].uid() != first,
        )
        .await?;
        let restarted = wait_backend(&client, name, "serving again in a new view", |b| {
            serving(b) && election(b).0.is_some_and(|v| Some(v) != view)
        })
        .await?;
        let read = read_keys(&store, name, &master).await?;
        println!(
            "warm single-leader restart: {} of {} keys read back ({} wrong, {} missing, {} failed)",
            read.ok, read.of, read.wrong, read.missing, read.failed
        );
        assert_eq!(read.ok, KEYS, "every key read back after the restart: {read:?}");
        assert!(
            has_condition(&restarted, "FailoverKeptCache=True"),
            "{}",
            describe(&restarted)
        );

        // The master killed and, while it is down, a member replaced: its keys go, no key
        // reads back other bytes.
        let leader = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
        let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        let replaced = members[1].uid();
        signal(&pods::host_pids(&leader[0]), nix::sys::signal::Signal::SIGKILL);
        store
            .delete(name_of(&members[1]), &DeleteParams::default())
            .await?;
        pods::wait_pods(
            &store,
            &backend_pods(name, "member-0"),
            "2 Ready member Pods, one of them new",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().all(pods::is_ready)
                    && p.iter().all(|p| p.uid() != replaced)
            },
        )
        .await?;
        let back = wait_backend(&client, name, "serving with both members again", serving).await?;
        let read = read_keys(&store, name, &master).await?;
        println!(
            "warm restart with a member replaced meanwhile: {} read back, {} missing, {} wrong, {} failed of {}; {}",
            read.ok, read.missing, read.wrong, read.failed, read.of, describe(&back)
        );
        assert_eq!(read.wrong, 0, "no key reads back other bytes: {read:?}");
        assert_eq!(read.failed, 0, "a lost key is a miss, not an error: {read:?}");
        assert_eq!(read.ok + read.missing, KEYS, "{read:?}");
        assert!(
            read.missing > 0 && read.ok > 0,
            "the replaced member's keys are misses, the other member's read back: {read:?}"
        );
        remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
