//! Real worker nodes: two kubelets with their own containerd + runc, each in its own network
//! namespace, register and become Ready; Pods from a locally built image run on each, get
//! addresses from their node's Pod range, pass their readiness probe, and reach each other
//! across nodes. Nothing here is simulated.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, PostParams};
use kvcache_e2e::cluster::{ControlPlane, Options, block_on, client_from, wait_object};
use kvcache_e2e::nodes::{BUSYBOX_IMAGE, NODE_ALLOCATABLE_MEMORY, NodeNetwork, Nodes};
use kvcache_e2e::{paths, slots};

const WAIT: Duration = Duration::from_secs(90);

struct Cluster {
    control_plane: ControlPlane,
    nodes: Nodes,
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| {
        let dir = paths::scratch("nodes").map_err(|e| e.to_string())?;
        let net = NodeNetwork::plan().map_err(|e| e.to_string())?;
        let control_plane = ControlPlane::start(
            &dir,
            &Options {
                advertise: Some(net.host_ip.clone()),
                ..Options::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let nodes = Nodes::start(&control_plane, &net, 2, &dir).map_err(|e| e.to_string())?;
        Ok(Cluster {
            control_plane,
            nodes,
        })
    });
    match c {
        Ok(c) => c,
        Err(e) => panic!("the cluster with nodes could not start: {e}"),
    }
}

fn pod(name: &str, node: &str, command: &[&str], probe: bool) -> Pod {
    let mut p: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
            }]
        }
    }))
    .expect("pod");
    if probe && let Some(spec) = p.spec.as_mut() {
        spec.containers[0].readiness_probe = serde_json::from_value(
            serde_json::json!({"tcpSocket": {"port": 8080}, "periodSeconds": 1}),
        )
        .ok();
    }
    p
}

async fn wait_pod(api: &Api<Pod>, name: &str, what: &str, ok: impl Fn(&Pod) -> bool) -> Pod {
    wait_object(api, name, what, WAIT, ok)
        .await
        .unwrap_or_else(|e| panic!("Pod {e}"))
}

/// A shell command that fetches `url` until it succeeds, a second between tries, for at most 80 s
/// (inside the test's 90 s wait, so a failure is the Pod's, with its exit status). Each try is cut
/// at 5 s: until kube-proxy has written a Service's rules, a packet to its ClusterIP follows the
/// node's default route and a connect can hang for minutes (this busybox's `wget` has no timeout
/// of its own), outlasting the wait however soon the rules arrive.
fn retried_fetch(url: &str, flags: &str) -> String {
    format!(
        "/bin/busybox timeout 80 /bin/busybox sh -c 'until /bin/busybox timeout 5 /bin/busybox wget {flags} -q -O /dev/null {url}; do /bin/busybox sleep 1; done'"
    )
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn phase(p: &Pod) -> Option<String> {
    p.status.as_ref().and_then(|s| s.phase.clone())
}

#[test]
fn two_nodes_run_pods_that_reach_each_other() {
    let c = cluster();
    let kubeconfig = c.control_plane.kubeconfig.clone();
    let nodes: Vec<(String, String, String)> = c
        .nodes
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.ip.clone(), n.pod_cidr.clone()))
        .collect();
    block_on(async move {
        let client = client_from(&kubeconfig).await?;
        // Both nodes registered with their own address.
        let listed = Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await?;
        for (name, ip, _) in &nodes {
            let node = listed
                .items
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("node {name} registered"));
            let addresses = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default();
            assert!(
                addresses
                    .iter()
                    .any(|a| a.type_ == "InternalIP" && a.address == *ip),
                "{name}: {addresses:?}"
            );
            let labels = node.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("kvcache").map(String::as_str), Some("true"));
            assert_eq!(
                labels.get("gpustack.ai/instance-type").map(String::as_str),
                Some("gpu-a10-24g")
            );
        }
        // Demo sizing: each node offers NODE_ALLOCATABLE_MEMORY and one GPU.
        let fresh = Api::<Node>::all(client.clone()).get(&nodes[0].0).await?;
        let allocatable = fresh.status.and_then(|s| s.allocatable).unwrap_or_default();
        let memory = kvcache_api::quantity::parse_bytes(&allocatable["memory"].0)
            .expect("a byte quantity");
        assert!(
            memory.abs_diff(NODE_ALLOCATABLE_MEMORY) < 256 << 20,
            "allocatable memory {memory} is about {NODE_ALLOCATABLE_MEMORY}"
        );
        assert_eq!(
            allocatable.get("nvidia.com/gpu").map(|q| q.0.as_str()),
            Some("1")
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let serve = ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/bin"];
        for (i, (node, _, _)) in nodes.iter().enumerate() {
            pods.create(
                &PostParams::default(),
                &pod(&format!("web-{i}"), node, &serve, true),
            )
            .await?;
        }
        let mut ips = Vec::new();
        for (i, (_, _, cidr)) in nodes.iter().enumerate() {
            let p = wait_pod(&pods, &format!("web-{i}"), "Ready", ready).await;
            let ip = p.status.and_then(|s| s.pod_ip).expect("a Pod IP");
            let prefix = cidr.trim_end_matches("0/24");
            assert!(ip.starts_with(prefix), "{ip} is in its node's range {cidr}");
            ips.push(ip);
        }
        // From node 0, a Pod fetches a file from the Pod on node 1.
        let url = format!("http://{}:8080/busybox", ips[1]);
        let fetch = [
            "/bin/busybox",
            "wget",
            "-q",
            "-O",
            "/dev/null",
            url.as_str(),
        ];
        pods.create(
            &PostParams::default(),
            &pod("fetch", &nodes[0].0, &fetch, false),
        )
        .await?;
        let p = wait_pod(&pods, "fetch", "finished", |p| {
            matches!(phase(p).as_deref(), Some("Succeeded" | "Failed"))
        })
        .await;
        assert_eq!(phase(&p).as_deref(), Some("Succeeded"), "{:#?}", p.status);

        // kube-proxy: a ClusterIP Service in front of the Pod on node 1, reached from node 0.
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let svc: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web-1"},
            "spec": {"selector": {"app": "web-1"}, "ports": [{"port": 80, "targetPort": 8080}]}
        }))
        .expect("service");
        let svc = services.create(&PostParams::default(), &svc).await?;
        let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP");
        let url = format!("http://{cluster_ip}/busybox");
        // The Service's endpoints reach kube-proxy a moment after it is created: retry inside.
        let retrying = retried_fetch(&url, "");
        pods.create(
            &PostParams::default(),
            &pod("via-service", &nodes[0].0, &["/bin/busybox", "sh", "-c", &retrying], false),
        )
        .await?;
        let p = wait_pod(&pods, "via-service", "finished", |p| {
            matches!(phase(p).as_deref(), Some("Succeeded" | "Failed"))
        })
        .await;
        assert_eq!(phase(&p).as_deref(), Some("Succeeded"), "{:#?}", p.status);

        // A Pod asking for more memory than a node offers stays Pending, with the scheduler's
        // reason (no nodeName: the scheduler places Pods).
        let mut big = pod("too-big", "", &["/bin/busybox", "sleep", "60"], false);
        if let Some(spec) = big.spec.as_mut() {
            spec.node_name = None;
            spec.containers[0].resources = serde_json::from_value(
                serde_json::json!({"requests": {"memory": "8Gi"}}),
            )
            .ok();
        }
        pods.create(&PostParams::default(), &big).await?;
        let p = wait_pod(&pods, "too-big", "unschedulable", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
        })
        .await;
        let message = p
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.message)
            .unwrap_or_default();
        assert!(message.contains("Insufficient memory"), "{message}");

        // Cluster DNS: the Service's name resolves in a Pod (busybox's nslookup has its own
        // resolver; a static binary's libc would need NSS libraries the image does not carry).
        let lookup = format!(
            "for i in $(/bin/busybox seq 1 30); do /bin/busybox nslookup web-1.default.svc.cluster.local | /bin/busybox grep -q {cluster_ip} && exit 0; /bin/busybox sleep 1; done; exit 1"
        );
        pods.create(
            &PostParams::default(),
            &pod("resolve", &nodes[1].0, &["/bin/busybox", "sh", "-c", &lookup], false),
        )
        .await?;
        let p = wait_pod(&pods, "resolve", "finished", |p| {
            matches!(phase(p).as_deref(), Some("Succeeded" | "Failed"))
        })
        .await;
        assert_eq!(phase(&p).as_deref(), Some("Succeeded"), "{:#?}", p.status);

        // And the API server through the `kubernetes` Service, as a Pod's client would.
        let api = retried_fetch("https://10.96.0.1/healthz", "--no-check-certificate");
        pods.create(
            &PostParams::default(),
            &pod("to-api", &nodes[1].0, &["/bin/busybox", "sh", "-c", &api], false),
        )
        .await?;
        let p = wait_pod(&pods, "to-api", "finished", |p| {
            matches!(phase(p).as_deref(), Some("Succeeded" | "Failed"))
        })
        .await;
        assert_eq!(phase(&p).as_deref(), Some("Succeeded"), "{:#?}", p.status);
        // Each node has its own view of host paths: a file a Pod writes under /var/lib/kvcache
        // on node 0 is not there on node 1 (as on separate machines).
        for (i, (node, _, _)) in nodes.iter().enumerate() {
            let script = if i == 0 {
                "/bin/busybox touch /data/from-node-0"
            } else {
                "/bin/busybox sleep 2; [ ! -e /data/from-node-0 ]"
            };
            let mut p = pod(&format!("tier-{i}"), node, &["/bin/busybox", "sh", "-c", script], false);
            if let Some(spec) = p.spec.as_mut() {
                spec.volumes = serde_json::from_value(serde_json::json!([{
                    "name": "tier",
                    "hostPath": {"path": "/var/lib/kvcache", "type": "Directory"}
                }]))
                .ok();
                spec.containers[0].volume_mounts = serde_json::from_value(
                    serde_json::json!([{"name": "tier", "mountPath": "/data"}]),
                )
                .ok();
            }
            pods.create(&PostParams::default(), &p).await?;
            let done = wait_pod(&pods, &format!("tier-{i}"), "finished", |p| {
                matches!(phase(p).as_deref(), Some("Succeeded" | "Failed"))
            })
            .await;
            assert_eq!(phase(&done).as_deref(), Some("Succeeded"), "tier-{i}: {:#?}", done.status);
        }
        Ok(())
    })
    .expect("the scenario");
    // The file is in node 0's own folder.
    let own = cluster().nodes.nodes[0]
        .host_root
        .join("var/lib/kvcache/from-node-0");
    assert!(own.exists(), "{} exists", own.display());
    assert!(
        !std::path::Path::new("/var/lib/kvcache/from-node-0").exists(),
        "the machine's own folder is untouched"
    );
}

/// A cluster never takes the names of one on the machine: neither another cluster of this
/// process nor a namespace an earlier run left (CI once failed with `ip netns add kvc801n1:
/// File exists`). The leftover sits in the slot this process's id points to first.
#[test]
fn a_node_network_is_never_one_already_on_the_machine() {
    let first = std::process::id() % slots::SLOTS;
    let (tag, next) = (slots::tag(first), slots::tag((first + 1) % slots::SLOTS));
    // The first slot this process would try holds a node's namespace, the next one only the
    // host end of a node's veth (what a namespace leaves while its last process exits).
    let leftover = format!("kvc{tag}n0");
    let veth = format!("kvcv{next}1");
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .expect("ip runs")
            .success()
    };
    assert!(ip(&["netns", "add", &leftover]), "ip netns add {leftover}");
    assert!(
        ip(&[
            "link",
            "add",
            &veth,
            "type",
            "veth",
            "peer",
            "name",
            &format!("kvcx{next}")
        ]),
        "ip link add {veth}"
    );
    let (a, b) = (NodeNetwork::plan(), NodeNetwork::plan());
    ip(&["netns", "del", &leftover]);
    ip(&["link", "del", &veth]);
    let (a, b) = (a.expect("a free slot"), b.expect("a second free slot"));
    for taken in [tag, next] {
        for plan in [&a, &b] {
            assert_ne!(
                plan.bridge,
                format!("kvcb{taken}"),
                "took a leftover's slot"
            );
        }
    }
    assert_ne!(
        a.bridge, b.bridge,
        "two clusters of one process share a slot"
    );
    assert_ne!(a.host_ip, b.host_ip);
}
