//! A flood from a tenant's Pod of the default installation, on real nodes under the enforcer.
//! The default installation leaves the webhook port open to every source (no control plane
//! named: `kubectl apply -f deploy/operator.yaml` as shipped), so only the operator's own bounds
//! (`crates/kvcache-operator/src/serve/`) stand between a tenant and the admission of every
//! other namespace. From a Pod of `team-a` held to half a core (as a tenant's Pod would be), the
//! test sends what once OOM-killed both replicas: 600 connections each sending most of a 2 MB
//! review at once and then a byte every 2 s; then 600 idle connections; then forged reviews as
//! fast as they are answered; then 50 Pods wearing the walkthrough deployment's labels answer
//! `/metrics` with 4 MiB each. Meanwhile another namespace's injected Pod is admitted and its
//! Binding updated (both dry runs through the webhook), and their latencies are printed beside
//! the unloaded ones (the figures are `cargo xtask bench admission --flood`'s; a test asserts no
//! time). Afterwards neither replica restarted, each process's peak memory is under the
//! container's 256 MiB limit, the webhook counted the connections it closed past the tenant's
//! share, and no look-alike Pod was ever read.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kvcache_api::{KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, wait_deleted};
use kvcache_e2e::flood::{IN_POD, Tally, forged_review, peak_memory};
use kvcache_e2e::pods::{self, exec, host_pids, ip_of, name_of};
use kvcache_e2e::{Error, images, reach, walkthrough};

use super::support::*;

/// The flooding tenant's namespace (the walkthrough's), and the namespace whose admissions are
/// timed (a Binding of its own on the walkthrough's pool).
const TENANT: &str = "team-a";
const OTHER: &str = "flood-other";
const FLOODER: &str = "flooder";
const MONITORING: &str = kvcache_render::install::DEFAULT_METRICS_NAMESPACE;
const READER: &str = "flood-metrics-reader";
const LOOKALIKE: &str = "lookalike";
const LOOKALIKES: i32 = 50;
/// The operator container's memory limit in the installation.
const LIMIT: u64 = 256 * MIB;
/// Admissions timed per phase, of each kind.
const TIMED: usize = 5;

/// The installation as shipped: no control plane named, so the webhook port admits every
/// source and the server admits every address (`cargo xtask manifests` without
/// `--control-plane-cidrs`).
fn default_installation() -> &'static Path {
    static FILE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    rendered(
        &FILE,
        "install-default-manifest",
        kvcache_render::install::Access::default,
    )
}

/// Applies `manifest` and waits until both replicas run its template (`named`: the one naming
/// the control plane, whose container is given `--webhook-allowed-source`); the new Pods.
async fn roll_onto(client: &Client, manifest: &Path, named: bool) -> Result<Vec<Pod>, Error> {
    run_kubectl(&["apply", "-f", &manifest.display().to_string()]);
    let what = if named {
        "both replicas on the installation naming the control plane"
    } else {
        "both replicas on the default installation (no allowed source)"
    };
    wait_rolled(client, what, move |p| {
        let allowed = p
            .containers
            .iter()
            .flat_map(|c| c.args.iter().flatten())
            .any(|a| a.starts_with("--webhook-allowed-source"));
        allowed == named
    })
    .await?;
    wait_replicas(client, 2).await
}

/// Runs one flood of [`IN_POD`] in the flooder; its tally.
async fn flood(api: Api<Pod>, args: Vec<String>) -> Result<Tally, Error> {
    let mut command = vec!["python3", "-c", IN_POD];
    command.extend(args.iter().map(String::as_str));
    let out = exec(&api, FLOODER, None, &command).await?;
    serde_json::from_str(out.stdout.trim()).map_err(|e| Error::Wait {
        what: format!("the tally of the flood {:?}", args.first()),
        reason: format!(
            "{e}; it printed {:?} and {:?}",
            out.stdout,
            pods::last_lines(&out.stderr, 5)
        ),
    })
}

/// Admission latencies of the other namespace: `TIMED` injected engine Pods and as many
/// updates of its Binding, dry runs through the webhook, each admitted.
#[derive(Debug, Default)]
struct Timed {
    pods: Vec<Duration>,
    bindings: Vec<Duration>,
}

impl Timed {
    fn line(&self, phase: &str) -> String {
        let p50 = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            v.get(v.len() / 2).copied().unwrap_or_default()
        };
        let max = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
        format!(
            "{phase}: Pod p50 {:?} max {:?}; Binding p50 {:?} max {:?}",
            p50(&self.pods),
            max(&self.pods),
            p50(&self.bindings),
            max(&self.bindings)
        )
    }
}

async fn timed(client: &Client, phase: &str) -> Result<Timed, Error> {
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), OTHER);
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let mut t = Timed::default();
    for i in 0..TIMED {
        let at = Instant::now();
        injected_dry_run_on(client, OTHER, OTHER, &format!("engine-{phase}-{i}")).await?;
        t.pods.push(at.elapsed());
        let at = Instant::now();
        bindings
            .patch(
                OTHER,
                &dry,
                &Patch::Merge(serde_json::json!({"spec": {"quota": {"ceiling": "48Mi"}}})),
            )
            .await?;
        t.bindings.push(at.elapsed());
    }
    Ok(t)
}

/// Serves 4 MiB at every path on port 8000 and prints a line for each read.
const LOOKALIKE_SERVER: &str = "import http.server\nbody = b'# ' + b'x' * (4 * 1024 * 1024 - 3) + b'\\n'\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        print('read', self.path, flush=True)\n        self.send_response(200)\n        self.send_header('content-length', str(len(body)))\n        self.end_headers()\n        self.wfile.write(body)\nhttp.server.ThreadingHTTPServer(('', 8000), H).serve_forever()\n";

/// `LOOKALIKES` Pods of another Deployment in the tenant's namespace wearing the labels of the
/// walkthrough deployment's engines (`qwen-chat`, role `server`), each answering `/metrics` on
/// the engine port with 4 MiB; Ready once listening.
async fn lookalikes(client: &Client) -> Result<Vec<Pod>, Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), TENANT);
    let d: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": LOOKALIKE, "namespace": TENANT},
        "spec": {
            "replicas": LOOKALIKES,
            "selector": {"matchLabels": {"app": LOOKALIKE}},
            "template": {
                "metadata": {"labels": {
                    "app": LOOKALIKE,
                    "app.kubernetes.io/name": "model-deployment",
                    "app.kubernetes.io/instance": "qwen-chat",
                    "app.kubernetes.io/component": "server"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "enableServiceLinks": false,
                    "containers": [{"name": "metrics", "image": images::STORE.name,
                                    "imagePullPolicy": "Never",
                                    "command": ["python3", "-c", LOOKALIKE_SERVER],
                                    "ports": [{"containerPort": kvcache_render::objects::model::SERVING_PORT}],
                                    "readinessProbe": {"tcpSocket": {"port": kvcache_render::objects::model::SERVING_PORT},
                                                       "periodSeconds": 2},
                                    "resources": {"requests": {"cpu": "1m", "memory": "16Mi"},
                                                  "limits": {"memory": "64Mi"}}}]
                }
            }
        }
    }))
    .expect("a Deployment");
    deployments.create(&PostParams::default(), &d).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    pods::wait_ready(&api, &format!("app={LOOKALIKE}"), LOOKALIKES as usize, WAIT).await
}

/// The leader's count of ModelDeployment reconciles.
fn model_reconciles(text: &str) -> f64 {
    kvcache_e2e::store::metric_sum(
        text,
        "kvcache_operator_reconciles_total",
        &[("controller", "modeldeployment")],
    )
    .unwrap_or(0.0)
}

#[test]
fn a_flood_from_a_tenant_pod_of_the_default_installation_leaves_admission_to_everyone_else() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(async {
            let client = cluster.client().await?;
            flood_the_default_installation(&client).await
        })
    }));
    // The binary's other tests run on the installation that names the control plane: back to
    // it whatever happened, then report.
    let back = block_on(async {
        let client = cluster.client().await?;
        roll_onto(&client, installation(), true).await
    });
    match outcome {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(r) => r.unwrap_or_else(|e| panic!("{e}")),
    }
    back.unwrap_or_else(|e| panic!("the installation naming the control plane came back: {e}"));
}

async fn flood_the_default_installation(client: &Client) -> Result<(), Error> {
    let client = client.clone();
    converged(&client).await?;
    let operators = roll_onto(&client, default_installation(), false).await?;
    let service = Api::<Service>::namespaced(client.clone(), NS)
        .get("kvcache-operator")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the operator Service's address");
    let webhook = format!("{service}:443");
    second_binding(&client, OTHER, "flood-other").await?;
    let tenant_pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    // Held to half a core and 512 MiB, as a tenant's Pod would be.
    let pod = prober_with(
        &client,
        TENANT,
        FLOODER,
        serde_json::json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                           "limits": {"cpu": "500m", "memory": "512Mi"}}),
    )
    .await?;
    // The operator's /metrics, read as Prometheus would: this installation admits the
    // monitoring namespace there, not the API server's proxy.
    walkthrough::ensure_namespace(&client, MONITORING).await?;
    let reader = prober(&client, MONITORING, READER).await?;
    let monitoring: Api<Pod> = Api::namespaced(client.clone(), MONITORING);
    let metrics = |p: &Pod| {
        let (monitoring, address) = (
            monitoring.clone(),
            format!("{}:8080", ip_of(p).unwrap_or_default()),
        );
        async move { metrics_from(&monitoring, READER, &address).await }
    };
    drop(reader);
    // The default policy admits the tenant at the webhook port: the flood reaches the server.
    reach::wait_reach(
        &tenant_pods,
        name_of(&pod),
        std::slice::from_ref(&webhook),
        true,
        WAIT,
        "the tenant's Pod reaching the webhook of the default installation",
    )
    .await?;

    let unloaded = timed(&client, "unloaded").await?;
    let mut lines = vec![unloaded.line("unloaded")];
    let s = |v: &str| v.to_owned();
    let review = String::from_utf8(forged_review(
        TENANT,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "forged", "namespace": TENANT,
                         "labels": {"kvcache.gpustack.ai/inject": "true"},
                         "annotations": {"kvcache.gpustack.ai/binding": "no-such-binding",
                                         "kvcache.gpustack.ai/engine": "vLLM"}},
            "spec": {"containers": [{"name": "engine", "image": "engine"}]}
        }),
    ))
    .expect("UTF-8");
    let phases: [(&str, Vec<String>, Duration); 3] = [
        // (name, the flood's arguments, how long it builds before the timed admissions)
        (
            "slow-bodies",
            [
                "slow",
                &service,
                "443",
                "/mutate-pods",
                "600",
                "2000000",
                "1500000",
                "2",
                "20",
            ]
            .map(s)
            .to_vec(),
            Duration::from_secs(6),
        ),
        (
            "idle",
            ["idle", &service, "443", "600", "15"].map(s).to_vec(),
            Duration::from_secs(3),
        ),
        (
            "forged",
            [
                "forged",
                &service,
                "443",
                "/mutate-pods",
                "32",
                "3000",
                "20",
                &review,
            ]
            .map(s)
            .to_vec(),
            Duration::from_secs(3),
        ),
    ];
    let mut tallies = Vec::new();
    for (name, args, lead) in phases {
        let running = tokio::spawn(flood(tenant_pods.clone(), args));
        // Load, not a condition: the flood builds up before admissions are timed under it.
        tokio::time::sleep(lead).await;
        let during = timed(&client, name).await?;
        let tally = running.await.expect("the flood ends")?;
        let line = format!("{} (flood {tally:?})", during.line(name));
        eprintln!("flood: {line}");
        lines.push(line);
        tallies.push((name, tally));
    }
    let (_, slow) = &tallies[0];
    assert!(
        slow.opened > 0 && slow.refused + slow.closed > 0,
        "the slow bodies reached the webhook and met its bounds: {slow:?}"
    );
    let (_, idle) = &tallies[1];
    assert!(
        idle.opened > 0 && idle.closed > 0,
        "idle connections past the tenant's share were closed: {idle:?}"
    );
    let (_, forged) = &tallies[2];
    assert!(
        forged.statuses.get(&200).copied().unwrap_or(0) > 0,
        "forged reviews were answered (each judged, refused inside the review): {forged:?}"
    );

    // 4. Look-alike engines: read never, so their 4 MiB bodies cost nothing. Two passes of the
    // deployment's reconcile after they are Ready (it reads its engines every pass).
    let leader_name = pod_of(&holder(&client).await?.unwrap_or_default()).to_owned();
    let leader = operators
        .iter()
        .find(|p| name_of(p) == leader_name)
        .cloned()
        .expect("the Lease holder is one of the replicas");
    let alike = lookalikes(&client).await?;
    let before = model_reconciles(&metrics(&leader).await?);
    let during = timed(&client, "lookalikes").await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let now = model_reconciles(&metrics(&leader).await?);
        if now >= before + 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "two ModelDeployment reconciles on {leader_name} after the look-alikes were Ready: {before} then {now} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    lines.push(during.line("lookalikes"));
    let mut read = Vec::new();
    for p in &alike {
        let log = pods::logs(&tenant_pods, name_of(p), None).await?;
        if log.lines().any(|l| l.starts_with("read ")) {
            read.push(name_of(p).to_owned());
        }
    }
    let md = Api::<ModelDeployment>::namespaced(client.clone(), TENANT)
        .get("qwen-chat")
        .await?;
    let engines_read = md
        .status
        .as_ref()
        .and_then(|s| s.shared_cache.as_ref())
        .map(|c| c.engines_read);
    assert!(
        read.is_empty(),
        "the operator read Pods that only wear the deployment's labels: {read:?} (engines read {engines_read:?})"
    );

    // Neither replica restarted or was replaced; each process's peak stayed under the limit.
    let now = wait_replicas(&client, 2).await?;
    for p in &operators {
        let same = now
            .iter()
            .find(|n| name_of(n) == name_of(p))
            .unwrap_or_else(|| panic!("operator Pod {} was replaced: now {now:?}", name_of(p)));
        let restarts: i32 = same
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or_default();
        assert_eq!(restarts, 0, "operator Pod {} restarted", name_of(p));
        let peak = host_pids(same)
            .into_iter()
            .filter_map(|pid| peak_memory(u32::try_from(pid).ok()?))
            .max()
            .expect("the operator process's VmHWM");
        lines.push(format!("{}: peak memory {} MiB", name_of(p), peak >> 20));
        assert!(
            peak < LIMIT,
            "operator Pod {}: peak memory {} MiB stays under the container's 256 MiB limit",
            name_of(p),
            peak >> 20
        );
    }
    let mut refused = 0.0;
    for p in &now {
        refused += kvcache_e2e::store::metric_sum(
            &metrics(p).await?,
            "kvcache_operator_connections_refused_total",
            &[("server", "webhook"), ("reason", "source_full")],
        )
        .unwrap_or(0.0);
    }
    lines.push(format!(
        "connections closed past the tenant's share: {refused}; look-alikes read: none; engines read {engines_read:?}; addresses {:?}",
        now.iter().filter_map(ip_of).collect::<Vec<_>>()
    ));
    println!("flood from {TENANT}/{FLOODER}:\n  {}", lines.join("\n  "));
    assert!(
        refused > 0.0,
        "the webhook counted the connections it closed past the tenant's share"
    );

    // Tidy: the flooder, the reader, the look-alikes, the other namespace's Binding.
    tenant_pods
        .delete(FLOODER, &DeleteParams::default())
        .await?;
    monitoring.delete(READER, &DeleteParams::default()).await?;
    Api::<Deployment>::namespaced(client.clone(), TENANT)
        .delete(LOOKALIKE, &DeleteParams::default())
        .await?;
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), OTHER);
    let uid = bindings.get(OTHER).await?.metadata.uid.unwrap_or_default();
    bindings.delete(OTHER, &DeleteParams::default()).await?;
    wait_deleted(
        &bindings,
        OTHER,
        &uid,
        "the other namespace's Binding released",
        WAIT,
    )
    .await?;
    Ok(())
}
