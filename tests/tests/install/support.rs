//! What the install tests share: kubectl, the one installation of the binary, the Lease's
//! holder, scrapes of the operator's metrics, convergence and the quota grant, and the audit
//! log's writes by the operator's account.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCacheBackend, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, wait_object};
use kvcache_e2e::nodes::NodeCluster;
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{has_condition, phase, wait_condition};
use kvcache_e2e::{Error, images, paths, walkthrough};

pub(crate) const NS: &str = "gpustack-system";
pub(crate) const WAIT: Duration = Duration::from_secs(180);
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const SELECTOR: &str =
    "app.kubernetes.io/name=kvcache-operator,app.kubernetes.io/component=operator";
pub(crate) const ACCOUNT: &str = kvcache_e2e::audit::OPERATOR_ACCOUNT;
/// The operator's Lease duration in the installation (`--leader-election-duration` default).
pub(crate) const LEASE: Duration = Duration::from_secs(15);

pub(crate) fn kubectl() -> std::process::Command {
    let bin: PathBuf = paths::cache_dir()
        .join("k8s")
        .join(paths::KUBERNETES_VERSION)
        .join("bin")
        .join("kubectl");
    let mut c = std::process::Command::new(bin);
    c.env("KUBECONFIG", &cluster().control_plane.kubeconfig);
    c
}

/// Runs kubectl; its output, or a panic with what it printed.
pub(crate) fn run_kubectl(args: &[&str]) -> String {
    let out = kubectl().args(args).output().expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {}: {}{}",
        args.join(" "),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The installation the tests apply: `deploy/operator.yaml` with this cluster's control plane
/// named in the operator's NetworkPolicy (as `cargo xtask manifests --out FILE
/// --control-plane-cidrs ...` writes it; Helm's `controlPlaneCIDRs`). The harness's API server
/// runs on the host and reaches the Pods from the node bridge's host address.
pub(crate) fn installation() -> &'static Path {
    static FILE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    rendered(&FILE, "install-manifest", || {
        kvcache_render::install::Access {
            control_plane: vec![format!("{}/32", control_plane_address())],
            ..Default::default()
        }
    })
}

/// The installation with `access`, rendered once into `file` (a scratch folder named
/// `prefix`): what `cargo xtask manifests` writes for it.
pub(crate) fn rendered(
    file: &'static OnceLock<Result<PathBuf, String>>,
    prefix: &str,
    access: impl FnOnce() -> kvcache_render::install::Access,
) -> &'static Path {
    let file = file.get_or_init(|| {
        let text = kvcache_render::install::operator_yaml_with_access(
            kvcache_render::plan::resolve::DEFAULT_NAMESPACE,
            kvcache_render::plan::resolve::DEFAULT_OPERATOR_IMAGE,
            &access(),
        )
        .map_err(|e| e.to_string())?;
        let path = paths::scratch(prefix)
            .map_err(|e| e.to_string())?
            .join("operator.yaml");
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    });
    match file {
        Ok(p) => p,
        Err(e) => panic!("the installation ({prefix}) could not be rendered: {e}"),
    }
}

/// The address the API server's connections to Pods come from: the node bridge's host address
/// (the harness's API server and cluster DNS listen there).
pub(crate) fn control_plane_address() -> &'static str {
    &cluster().nodes.dns
}

/// The cluster with the installation applied and both replicas Ready, then the walkthrough
/// (demo size) applied with kubectl in creation order.
pub(crate) fn installed() -> &'static Mutex<Install> {
    static INSTALLED: OnceLock<Result<Mutex<Install>, String>> = OnceLock::new();
    let done = INSTALLED.get_or_init(|| {
        let cluster = cluster();
        run_kubectl(&["apply", "-f", &installation().display().to_string()]);
        let dir = paths::scratch("install-walkthrough").map_err(|e| e.to_string())?;
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |_| true)
                .map_err(|e| e.to_string())?;
        let standby_writes = block_on(async {
            let client = cluster.client().await?;
            let operators = wait_replicas(&client, 2).await?;
            // What each replica wrote to come up (the Lease, the webhook's Secret and
            // caBundle): all of it the leader's.
            let leader = holder(&client).await?.unwrap_or_default();
            let standby = operators
                .iter()
                .find(|p| name_of(p) != pod_of(&leader))
                .and_then(pods::ip_of)
                .unwrap_or_default()
                .to_owned();
            Ok::<_, Error>(
                operator_writes(cluster, 0)
                    .into_iter()
                    .filter(|(ips, _, _)| ips.contains(&standby))
                    .collect::<Vec<_>>(),
            )
        })
        .map_err(|e| e.to_string())?;
        run_kubectl(&["apply", "-f", &manifests.display().to_string()]);
        Ok(Mutex::new(Install { standby_writes }))
    });
    match done {
        Ok(m) => m,
        Err(e) => panic!("the installation did not come up: {e}"),
    }
}

/// What the installation showed while coming up.
pub(crate) struct Install {
    /// Successful writes the standby made before the walkthrough was applied.
    pub(crate) standby_writes: Vec<(Vec<String>, String, String)>,
}

/// The binary's cluster: two real nodes with every image, NetworkPolicy enforced by the
/// harness's enforcer (kube-router's firewall), so the installation's own policy holds as on a
/// production cluster (started on first use; torn down by the watchdogs when the binary exits).
pub(crate) fn cluster() -> &'static NodeCluster {
    static CLUSTER: OnceLock<Result<NodeCluster, String>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| {
        let dir = paths::scratch("install-nodes").map_err(|e| e.to_string())?;
        let mut c = NodeCluster::start(&dir, 2, images::NODE_DEFAULT).map_err(|e| e.to_string())?;
        c.nodes
            .enforce_network_policy()
            .map_err(|e| e.to_string())?;
        Ok(c)
    });
    match c {
        Ok(c) => c,
        Err(e) => panic!("the cluster with an enforcer could not start: {e}"),
    }
}

/// Waits until the operator Deployment has `n` Ready replicas and as many Pods; returns the
/// Pods.
pub(crate) async fn wait_replicas(client: &Client, n: usize) -> Result<Vec<Pod>, Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    wait_object(
        &deployments,
        "kvcache-operator",
        &format!("{n} Ready replicas"),
        WAIT,
        move |d| {
            d.status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == Some(n as i32) && s.replicas == Some(n as i32))
        },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods::wait_ready(&pods, SELECTOR, n, WAIT).await
}

/// The Pod a Lease holder identity (`<pod>_<process>`) names.
pub(crate) fn pod_of(identity: &str) -> &str {
    identity.split('_').next().unwrap_or_default()
}

/// The `holderIdentity` of the operator's own Lease (`kvcache-operator`); `None` when the Lease or
/// its holder is absent.
pub(crate) async fn holder(client: &Client) -> Result<Option<String>, Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    Ok(leases
        .get_opt("kvcache-operator")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// Waits until the Lease is held by a Pod other than `not` that exists; returns it.
pub(crate) async fn wait_new_holder(
    client: &Client,
    not: &str,
    within: Duration,
) -> Result<String, Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let not = not.to_owned();
    let lease = wait_object(
        &leases,
        "kvcache-operator",
        "a new holder of the operator's Lease",
        within,
        move |l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty() && h != not)
        },
    )
    .await?;
    Ok(lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}

/// `/metrics` of an operator Pod, through the API server's Pod proxy.
pub(crate) async fn scrape(client: &Client, pod: &str) -> Result<String, Error> {
    pods::proxy_get(client, NS, pod, 8080, "metrics").await
}

/// Scrapes `pod` until `series` reads `want`; the last scrape.
pub(crate) async fn wait_scrape(
    client: &Client,
    pod: &str,
    series: &str,
    want: f64,
) -> Result<String, Error> {
    wait_scrape_for(client, pod, &format!("{series} reading {want}"), |text| {
        value(text, series) == Some(want)
    })
    .await
}

/// Scrapes `pod` until `holds` is true of its text: a replica that has just become leader (or
/// restarted) has not yet made every pass, so a test waits for what it asserts on. Fails naming
/// `what` with the last scrape.
pub(crate) async fn wait_scrape_for(
    client: &Client,
    pod: &str,
    what: &str,
    holds: impl Fn(&str) -> bool,
) -> Result<String, Error> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = scrape(client, pod).await?;
        if holds(&text) {
            return Ok(text);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never seen on {pod} within {WAIT:?}; last scrape:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The value of a series (`name{labels}` exactly as printed, or a bare name) in a scrape.
pub(crate) fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok()).flatten()
    })
}

/// The sum of every sample of a metric whose line starts with `prefix`.
pub(crate) fn sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// The walkthrough converged: backend Ready with both members' capacity, the Binding granted,
/// the deployment's cache attached.
pub(crate) async fn converged(client: &Client) -> Result<(), Error> {
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    wait_object(&backends, "mooncake-dram", "Ready with 512Mi", WAIT, |b| {
        phase(b) == Some(BackendPhase::Ready)
            && b.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| parse_bytes(&c.total.0).ok())
                == Some(512 * MIB)
    })
    .await?;
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-a");
    wait_object(
        &bindings,
        "team-a",
        "QuotaGranted=True with a figure",
        WAIT,
        |b| {
            has_condition(b, "QuotaGranted=True")
                && b.status
                    .as_ref()
                    .is_some_and(|s| s.effective_quota.is_some())
        },
    )
    .await?;
    let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-a");
    wait_condition(&models, "qwen-chat", "CacheAttached=True", WAIT).await?;
    Ok(())
}

/// Sets the walkthrough Binding's ceiling and waits until the store granted it.
pub(crate) async fn grant(client: &Client, ceiling: &str, bytes: u64) -> Result<(), Error> {
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-a");
    bindings
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"quota": {"ceiling": ceiling}}})),
        )
        .await?;
    wait_object(
        &bindings,
        "team-a",
        &format!("the {ceiling} ceiling granted"),
        WAIT,
        move |b| {
            b.status
                .as_ref()
                .and_then(|s| s.effective_quota.as_ref())
                .and_then(|q| parse_bytes(&q.0).ok())
                == Some(bytes)
        },
    )
    .await?;
    Ok(())
}

/// The addresses an audit event came from, and its verb and object, for each write by the
/// operator's account.
pub(crate) fn operator_writes(
    cluster: &NodeCluster,
    skip: usize,
) -> Vec<(Vec<String>, String, String)> {
    let text = std::fs::read_to_string(&cluster.control_plane.audit_log).unwrap_or_default();
    text.lines()
        .skip(skip)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["user"]["username"] == ACCOUNT)
        // The log holds the account's reads too (for the RBAC audit).
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete" | "deletecollection")
            )
        })
        // Successful writes only: a standby's campaign that finds the Lease held is refused.
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| c < 300)
        })
        // The election itself: a candidate writes the operator's Lease to campaign.
        .filter(|e| {
            !(e["objectRef"]["resource"] == "leases"
                && e["objectRef"]["name"] == "kvcache-operator")
        })
        .map(|e| {
            let ips = e["sourceIPs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (
                ips,
                e["verb"].as_str().unwrap_or_default().to_owned(),
                e["requestURI"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

pub(crate) async fn store_pods(client: &Client) -> Result<Vec<(String, String, i32)>, Error> {
    let store: Api<Pod> = Api::namespaced(client.clone(), NS);
    let listed = store
        .list(&ListParams::default().labels("app.kubernetes.io/name=kv-cache-backend"))
        .await?;
    let mut seen: Vec<(String, String, i32)> = listed
        .iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or_default();
            (name_of(p).to_owned(), p.uid().unwrap_or_default(), restarts)
        })
        .collect();
    seen.sort();
    Ok(seen)
}

/// Sets the operator Deployment's image and waits until both replicas run it and one of them
/// holds the Lease; returns the new holder's Pod.
pub(crate) async fn roll_operator_to(client: &Client, image: &str) -> Result<String, Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let before = holder(client).await?.unwrap_or_default();
    deployments
        .patch(
            "kvcache-operator",
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"spec": {"template": {"spec": {
                "containers": [{"name": "operator", "image": image}]
            }}}})),
        )
        .await?;
    let wanted = image.to_owned();
    wait_rolled(
        client,
        &format!("both replicas on {image}, no other Pod"),
        move |p| {
            p.containers
                .iter()
                .any(|c| c.image.as_deref() == Some(wanted.as_str()))
        },
    )
    .await?;
    let operators = wait_replicas(client, 2).await?;
    // Every old Pod is gone, so whoever holds the Lease next runs the new image.
    let now = wait_new_holder(client, &before, WAIT).await?;
    assert!(
        operators.iter().any(|p| name_of(p) == pod_of(&now)),
        "the Lease holder {now} is one of the rolled Pods"
    );
    Ok(pod_of(&now).to_owned())
}

/// Waits until the operator Deployment's template holds `template` and its rollout is done:
/// both replicas on it and Ready, no other Pod; fails naming `what`.
pub(crate) async fn wait_rolled(
    client: &Client,
    what: &str,
    template: impl Fn(&k8s_openapi::api::core::v1::PodSpec) -> bool + Send + 'static,
) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    wait_object(&deployments, "kvcache-operator", what, WAIT, move |d| {
        let s = d.status.clone().unwrap_or_default();
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .is_some_and(&template)
            && s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(2)
            && s.ready_replicas == Some(2)
            && s.replicas == Some(2)
    })
    .await?;
    Ok(())
}

pub(crate) async fn scale_operator(client: &Client, n: i32) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deployments
        .patch(
            "kvcache-operator",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": n}})),
        )
        .await?;
    if n > 0 {
        wait_replicas(client, n as usize).await?;
    } else {
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
        pods::wait_pods(&pods_api, SELECTOR, "no operator Pod", WAIT, |p| {
            p.is_empty()
        })
        .await?;
    }
    Ok(())
}

/// A Binding in its own namespace on the walkthrough's pool, under domain `domain`; waits until
/// the operator holds it (its release finalizer) and the store granted it.
pub(crate) async fn second_binding(client: &Client, ns: &str, domain: &str) -> Result<(), Error> {
    walkthrough::ensure_namespace(client, ns).await?;
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
    let b: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": ns, "namespace": ns},
        "spec": {"poolRef": {"name": "shared-dram"}, "quota": {"ceiling": "64Mi"},
                 "domain": {"name": domain, "blockSize": 64, "dtype": "bfloat16"}}
    }))
    .expect("a Binding");
    bindings.create(&PostParams::default(), &b).await?;
    wait_object(
        &bindings,
        ns,
        "the release finalizer and QuotaGranted=True",
        WAIT,
        |b| !b.finalizers().is_empty() && has_condition(b, "QuotaGranted=True"),
    )
    .await?;
    Ok(())
}

/// Creates (dry run) an engine Pod `name` in `ns` opted in to injection on the Binding named
/// `team-a`, and checks that the webhook injected it (the API server called the webhook); the
/// Pod as admitted.
pub(crate) async fn injected_dry_run(client: &Client, ns: &str, name: &str) -> Result<Pod, Error> {
    injected_dry_run_on(client, ns, "team-a", name).await
}

/// [`injected_dry_run`] on the Binding `binding` of `ns`.
pub(crate) async fn injected_dry_run_on(
    client: &Client,
    ns: &str,
    binding: &str,
    name: &str,
) -> Result<Pod, Error> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"kvcache.gpustack.ai/inject": "true"},
            "annotations": {"kvcache.gpustack.ai/binding": binding, "kvcache.gpustack.ai/engine": "vLLM"}},
        "spec": {"containers": [{"name": "engine", "image": "gpustack/runner:cpu-vllm0.29.0",
            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]}]}
    }))
    .expect("a Pod");
    let dry = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let injected = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&dry, &pod)
        .await?;
    assert!(
        kube::ResourceExt::annotations(&injected).contains_key("kvcache.gpustack.ai/injected"),
        "the webhook injected {ns}/{name}: {:?}",
        kube::ResourceExt::annotations(&injected)
    );
    Ok(injected)
}

/// A Pod `name` of the store image (it has python3) in `ns` that only waits, with `resources`
/// (JSON, `{}` for none); Ready once running.
pub(crate) async fn prober_with(
    client: &Client,
    ns: &str,
    name: &str,
    resources: serde_json::Value,
) -> Result<Pod, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": images::STORE.name, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"], "resources": resources}]
        }
    }))
    .expect("a Pod");
    api.create(&PostParams::default(), &pod).await?;
    let ready = pods::wait_ready(&api, &format!("app={name}"), 1, WAIT).await?;
    Ok(ready[0].clone())
}

/// [`prober_with`] without resources.
pub(crate) async fn prober(client: &Client, ns: &str, name: &str) -> Result<Pod, Error> {
    prober_with(client, ns, name, serde_json::json!({})).await
}

/// Prints the body of `GET http://ADDRESS/metrics` (3 s at most); exits 1 when there is none.
pub(crate) const GET_METRICS: &str = "import sys, urllib.request\nprint(urllib.request.urlopen('http://%s/metrics' % sys.argv[1], timeout=3).read().decode())";

/// The body of `/metrics` at `address` as the Pod `pod` of `api` reads it (a monitoring
/// namespace's Pod, where the API server's proxy is not admitted: an installation naming no
/// control plane).
pub(crate) async fn metrics_from(
    api: &Api<Pod>,
    pod: &str,
    address: &str,
) -> Result<String, Error> {
    let out = pods::exec(api, pod, None, &["python3", "-c", GET_METRICS, address]).await?;
    if out.success {
        Ok(out.stdout)
    } else {
        Err(Error::Wait {
            what: format!("{pod} reading /metrics at {address}"),
            reason: pods::last_lines(&out.stderr, 3).join(" | "),
        })
    }
}
