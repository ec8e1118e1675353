//! The admission webhook for real: the API server calls `kvcache-operator run`'s webhook over
//! TLS (the operator made the CA and the serving certificate, kept them in a Secret, and wrote
//! the CA into the webhook configuration), and refuses or warns as docs/design.md says.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{block_on, shared, wait_object};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::process::free_port;
use kvcache_e2e::status::{has_condition, wait_condition};
use kvcache_e2e::{Error, paths};

const WAIT: Duration = Duration::from_secs(60);
/// The installation's namespace: the operator runs under the installation's account, whose
/// calls `tests/tests/rbac_audit.rs` counts (the certificate's renewal among them).
const OPERATOR_NS: &str = "gpustack-system";
const SECRET: &str = kvcache_render::install::WEBHOOK_SECRET;
const CA_SECRET: &str = kvcache_render::install::WEBHOOK_CA_SECRET;

struct Hook {
    operator: Operator,
    /// The webhook's loopback port.
    port: u16,
}

/// The binary's one operator with its webhook on a loopback port, and the validating
/// configuration pointing at it (the installation's, with a URL instead of the Service).
fn hook() -> &'static Mutex<Hook> {
    static HOOK: OnceLock<Result<Mutex<Hook>, String>> = OnceLock::new();
    let started = HOOK.get_or_init(|| {
        let cluster = shared();
        let kc = cluster.control_plane.kubeconfig.clone();
        let port = free_port().map_err(|e| e.to_string())?;
        let dir = paths::scratch("webhook").map_err(|e| e.to_string())?;
        block_on(async move {
            let client = cluster.client().await?;
            kvcache_e2e::walkthrough::ensure_namespace(&client, OPERATOR_NS).await?;
            kvcache_e2e::operator::register_webhooks(
                &client,
                OPERATOR_NS,
                &format!("https://127.0.0.1:{port}"),
                true,
            )
            .await?;
            Ok::<_, Error>(())
        })
        .map_err(|e| e.to_string())?;
        let operator = Operator::builder(&kc, OPERATOR_NS)
            .as_installation_account()
            .extra(&[
                format!("--webhook-addr=127.0.0.1:{port}"),
                "--webhook-name=127.0.0.1".into(),
            ])
            .start(&dir)
            .map_err(|e| e.to_string())?;
        Ok(Mutex::new(Hook { operator, port }))
    });
    match started {
        Ok(h) => h,
        Err(e) => panic!("the operator with its webhook could not start: {e}"),
    }
}

/// A client on the caller's runtime (a client serves only the runtime it was made on), once
/// the operator runs.
async fn client() -> Result<Client, Error> {
    shared().client().await
}

/// Waits until the configuration trusts the CA in the Secret (the operator wrote it).
async fn wait_trusted(client: &Client) -> Result<String, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), OPERATOR_NS);
    let secret = wait_object(
        &secrets,
        SECRET,
        "the webhook's certificate Secret",
        WAIT,
        |_| true,
    )
    .await?;
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .expect("ca.crt");
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let want = ca.clone();
    wait_object(
        &configs,
        "kvcache-operator",
        "caBundle holding the Secret's CA",
        WAIT,
        move |c| {
            c.webhooks.iter().flatten().all(|w| {
                w.client_config
                    .ca_bundle
                    .as_ref()
                    .is_some_and(|b| String::from_utf8_lossy(&b.0).contains(want.trim()))
            })
        },
    )
    .await?;
    Ok(ca)
}

fn yaml<K: serde::de::DeserializeOwned>(text: &str) -> K {
    serde_yaml::from_str(text).expect("YAML")
}

async fn namespace(client: &Client, name: &str) {
    kvcache_e2e::walkthrough::ensure_namespace(client, name)
        .await
        .expect("namespace");
}

/// The refusal's message, or a panic if the write was admitted.
fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "refused as Invalid: {s:?}");
            s.message.clone()
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_second_binding_claiming_a_domain_on_the_same_backend_is_refused_naming_the_first_even_while_it_is_deleted()
 {
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let client = client().await?;
        wait_trusted(&client).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        backends
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: claims-store}\nspec:\n  connection:\n    external:\n      endpoints: [{name: Client, address: '127.0.0.1:1'}, {name: Admin, address: '127.0.0.1:2'}]\n"))
            .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        pools
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: claims}\nspec: {backends: [claims-store], quota: {total: 1Gi}}\n"))
            .await?;
        for ns in ["claims-a", "claims-b"] {
            namespace(&client, ns).await;
        }
        let binding = |ns: &str, domain: &str| -> KVCachePoolBinding {
            yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: team, namespace: {ns}}}\nspec:\n  poolRef: {{name: claims}}\n  quota: {{ceiling: 1Gi}}\n  domain: {{name: {domain}, blockSize: 64, dtype: bfloat16}}\n"))
        };
        let a: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "claims-a");
        a.create(&PostParams::default(), &binding("claims-a", "qwen")).await?;
        // Once the operator has seen the first claim (its finalizer is on), the second is
        // judged against it.
        wait_object(&a, "team", "the operator's finalizer", WAIT, |b| !b.finalizers().is_empty()).await?;
        let b: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "claims-b");
        let message = refusal(b.create(&PostParams::default(), &binding("claims-b", "qwen")).await);
        assert!(
            message.contains("spec.domain.name")
                && message.contains("claims-a/team")
                && message.contains("backend claims-store"),
            "{message}"
        );
        // Another name on the same backend is admitted.
        b.create(&PostParams::default(), &binding("claims-b", "llama")).await?;

        // A Binding being deleted still holds its domain (the master keeps its tenant's data
        // until the release finishes): a finalizer of the test's keeps claims-a/team there.
        // Appended by a JSON patch: the operator's finalizer stays, and its status writes in
        // between cannot make the patch conflict.
        let hold: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/finalizers/-", "value": "e2e.kvcache.gpustack.ai/hold"}
        ]))
        .expect("a JSON patch");
        a.patch("team", &PatchParams::default(), &Patch::<()>::Json(hold)).await?;
        a.delete("team", &DeleteParams::default()).await?;
        namespace(&client, "claims-c").await;
        let c: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "claims-c");
        // The webhook judges against the operator's cache, which sees the deletion a moment
        // later: asked again until its refusal names it, within WAIT.
        let deadline = tokio::time::Instant::now() + WAIT;
        let message = loop {
            let m = refusal(c.create(&PostParams::default(), &binding("claims-c", "qwen")).await);
            if m.contains("which is being deleted") || tokio::time::Instant::now() >= deadline {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(
            message.contains("claims-a/team, which is being deleted")
                && message.contains("spec.domain.name"),
            "the refusal while claims-a/team is being deleted: {message}"
        );
        // Gone (every finalizer removed), the name is free again.
        let none = serde_json::json!({"metadata": {"finalizers": null}});
        a.patch("team", &PatchParams::default(), &Patch::Merge(&none)).await?;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match c.create(&PostParams::default(), &binding("claims-c", "qwen")).await {
                Ok(_) => break,
                Err(kube::Error::Api(s))
                    if s.code == 422 && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!(
                    "waiting for claims-c to claim qwen once claims-a/team is gone (within {WAIT:?}): {e}"
                ),
            }
        }
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `kubectl` built by setup, with the test cluster's kubeconfig.
fn kubectl() -> std::process::Command {
    let bin: PathBuf = paths::cache_dir()
        .join("k8s")
        .join(paths::KUBERNETES_VERSION)
        .join("bin")
        .join("kubectl");
    let mut c = std::process::Command::new(bin);
    c.env("KUBECONFIG", &shared().control_plane.kubeconfig);
    c
}

#[test]
fn a_pool_on_a_single_tenant_backend_is_admitted_with_a_warning_kubectl_prints() {
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let client = client().await?;
        wait_trusted(&client).await?;
        Api::<KVCacheBackend>::all(client.clone())
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: single-tenant}\nspec:\n  image: example.local/store:1\n  connection:\n    managed:\n      leader: {multiTenancy: false}\n      members: [{medium: DRAM, capacityPerMember: 64Mi}]\n"))
            .await?;
        // The webhook judges against the operator's cache: wait until it holds the backend.
        wait_object(&Api::<KVCacheBackend>::all(client.clone()), "single-tenant", "the operator's finalizer", WAIT, |b| !b.finalizers().is_empty()).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = paths::scratch("webhook-kubectl").expect("dir");
    let file = dir.join("pool.yaml");
    std::fs::write(&file, "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: single}\nspec: {backends: [single-tenant], quota: {total: 1Gi}}\n").expect("write");
    let out = kubectl()
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .expect("kubectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "admitted: {stderr}");
    assert!(
        stderr.contains("Warning:") && stderr.contains("no per-tenant quota is enforced"),
        "the warning reaches the client: {stderr}"
    );
}

/// `kubectl apply` of `manifest` (with `extra` flags, e.g. `--dry-run=server`): whether it was
/// admitted, and what kubectl printed to stderr (warnings and refusals).
fn kubectl_apply(name: &str, manifest: &str, extra: &[&str]) -> (bool, String) {
    let dir = paths::scratch("webhook-tenancy").expect("dir");
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, manifest).expect("write");
    let out = kubectl()
        .arg("apply")
        .args(extra)
        .arg("-f")
        .arg(&file)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// docs/isolation.md#tenancy: a Binding that brings a second namespace to a shared backend is
/// admitted with a warning naming the namespace already there (under `--dry-run=server` too);
/// the backend lists both in `status.boundNamespaces`; a backend dedicated to one namespace
/// refuses another's Binding naming its `spec.tenancy`, read live before the operator's cache
/// holds it; and a backend another namespace binds cannot be made Dedicated.
#[test]
fn a_second_namespace_on_a_shared_backend_is_warned_and_a_dedicated_backend_refuses_another() {
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    let binding = |ns: &str, pool: &str| {
        format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: {pool}, namespace: {ns}}}\nspec:\n  poolRef: {{name: {pool}}}\n  quota: {{ceiling: 1Gi}}\n  domain: {{name: {ns}, blockSize: 64, dtype: bfloat16}}\n"
        )
    };
    let backend = |name: &str, tenancy: &str| -> KVCacheBackend {
        yaml(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}}}\nspec:\n  tenancy: {tenancy}\n  connection:\n    external:\n      endpoints: [{{name: Client, address: '127.0.0.1:1'}}, {{name: Admin, address: '127.0.0.1:2'}}]\n"
        ))
    };
    let pool = |name: &str| -> KVCachePool {
        yaml(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {{name: {name}}}\nspec: {{backends: [{name}], quota: {{total: 1Gi}}}}\n"
        ))
    };
    block_on(async move {
        let client = client().await?;
        wait_trusted(&client).await?;
        for ns in ["tenancy-a", "tenancy-b"] {
            namespace(&client, ns).await;
        }
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let pools: Api<KVCachePool> = Api::all(client.clone());
        backends
            .create(&PostParams::default(), &backend("tenancy-shared", "{}"))
            .await?;
        pools
            .create(&PostParams::default(), &pool("tenancy-shared"))
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));

    // The first namespace on the backend: not a word.
    let (admitted, stderr) =
        kubectl_apply("a-shared", &binding("tenancy-a", "tenancy-shared"), &[]);
    assert!(admitted, "the first Binding: {stderr}");
    assert!(
        !stderr.contains("Warning:"),
        "alone on the backend, no warning: {stderr}"
    );
    block_on(async move {
        let client = client().await?;
        // The webhook judges against the operator's cache: once its finalizer is on, the
        // operator has seen tenancy-a's Binding.
        let a: Api<KVCachePoolBinding> = Api::namespaced(client, "tenancy-a");
        wait_object(
            &a,
            "tenancy-shared",
            "the operator's finalizer",
            WAIT,
            |b| !b.finalizers().is_empty(),
        )
        .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));

    // The second: admitted, with the warning, on a dry run and for real.
    let second = binding("tenancy-b", "tenancy-shared");
    for extra in [&["--dry-run=server"][..], &[]] {
        let (admitted, stderr) = kubectl_apply("b-shared", &second, extra);
        assert!(admitted, "{extra:?}: {stderr}");
        let warning = stderr
            .lines()
            .find(|l| l.starts_with("Warning: namespace tenancy-b will share KVCacheBackend tenancy-shared with namespaces tenancy-a: "))
            .unwrap_or_else(|| panic!("{extra:?}: no warning naming tenancy-a: {stderr}"));
        assert!(
            warning.contains("MOONCAKE_TENANT_ID")
                && warning.contains("read, remove or pre-plant")
                && warning.contains("spec.tenancy: {mode: Dedicated, namespace: tenancy-b}"),
            "{warning}"
        );
    }

    block_on(async move {
        let client = client().await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        // The backend's status lists both namespaces.
        wait_object(&backends, "tenancy-shared", "status.boundNamespaces [tenancy-a, tenancy-b]", WAIT, |b| {
            b.status.as_ref().is_some_and(|s| s.bound_namespaces == ["tenancy-a", "tenancy-b"])
        })
        .await?;
        // Made Dedicated to tenancy-a while tenancy-b binds it: refused, naming tenancy-b's.
        let dedicate = serde_json::json!({"spec": {"tenancy": {"mode": "Dedicated", "namespace": "tenancy-a"}}});
        let message = refusal(backends.patch("tenancy-shared", &PatchParams::default(), &Patch::Merge(&dedicate)).await);
        assert!(
            message.contains("spec.tenancy") && message.contains("(tenancy-b/tenancy-shared)"),
            "{message}"
        );

        // A backend dedicated to tenancy-a, its pool and at once a Binding of tenancy-b: the
        // webhook reads what its cache lacks live, and refuses naming the field.
        backends
            .create(&PostParams::default(), &backend("tenancy-dedicated", "{mode: Dedicated, namespace: tenancy-a}"))
            .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        pools.create(&PostParams::default(), &pool("tenancy-dedicated")).await?;
        let b: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "tenancy-b");
        let message = refusal(b.create(&PostParams::default(), &yaml(&binding("tenancy-b", "tenancy-dedicated"))).await);
        assert!(
            message.contains("spec.poolRef.name")
                && message.contains("KVCacheBackend tenancy-dedicated, whose spec.tenancy (mode: Dedicated) admits namespace tenancy-a only"),
            "{message}"
        );
        // Its own namespace is admitted.
        let a: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "tenancy-a");
        a.create(&PostParams::default(), &yaml(&binding("tenancy-a", "tenancy-dedicated"))).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// docs/high-availability.md#leader-edits: on a Lease-elected backend an edit of the leader's
/// template is admitted with a warning that the master restarts and the cache empties, under
/// `kubectl apply --dry-run=server` (nothing written) as for real; an edit that leaves the
/// leader's template alone (a member's capacity) says nothing of it.
#[test]
fn a_leader_edit_of_a_lease_backend_is_warned_under_a_server_dry_run() {
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    let name = "leader-edit-lease";
    let manifest = |leader_cpu: &str, capacity: &str| {
        format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}}}\nspec:\n  image: example.local/store:1\n  connection:\n    managed:\n      leader: {{multiTenancy: false, resources: {{requests: {{cpu: {leader_cpu}, memory: 1Gi}}}}}}\n      members: [{{medium: DRAM, capacityPerMember: {capacity}, resources: {{requests: {{cpu: '1', memory: 1Gi}}}}}}]\n"
        )
    };
    block_on(async {
        let client = client().await?;
        wait_trusted(&client).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let (admitted, stderr) = kubectl_apply(name, &manifest("500m", "64Mi"), &[]);
    assert!(admitted, "created: {stderr}");
    let warned = |stderr: &str| {
        stderr
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "Warning: spec.connection.managed: this edit changes the leader's Pod template, so the master ({name}-leader) restarts and the cache empties"
                ))
            })
            .map(str::to_owned)
    };
    assert_eq!(
        warned(&stderr),
        None,
        "a new backend restarts nothing: {stderr}"
    );

    let (admitted, stderr) = kubectl_apply(name, &manifest("750m", "64Mi"), &["--dry-run=server"]);
    assert!(admitted, "a leader edit is admitted: {stderr}");
    let warning = warned(&stderr)
        .unwrap_or_else(|| panic!("the dry run's warning reaches kubectl: {stderr}"));
    assert!(
        warning.contains("keys the status last read: unknown")
            && warning.contains("leader.electionBackend: Etcd")
            && warning.contains("leader.replicas above one"),
        "{warning}"
    );
    block_on(async {
        let client = client().await?;
        let stored = Api::<KVCacheBackend>::all(client).get(name).await?;
        let cpu = stored
            .spec
            .connection
            .managed
            .as_ref()
            .and_then(|m| m.leader.resources.as_ref())
            .and_then(|r| r.cpu_request())
            .map(|c| c.as_str().to_owned());
        assert_eq!(cpu.as_deref(), Some("500m"), "a dry run writes nothing");
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));

    let (admitted, stderr) = kubectl_apply(name, &manifest("500m", "128Mi"), &["--dry-run=server"]);
    assert!(admitted, "a member edit is admitted: {stderr}");
    assert_eq!(
        warned(&stderr),
        None,
        "a member edit leaves the master running: {stderr}"
    );

    block_on(async {
        let client = client().await?;
        remove(&Api::<KVCacheBackend>::all(client), name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn with_the_operator_stopped_other_groups_are_still_written_and_a_new_certificate_serves() {
    let mut h = hook().lock().unwrap_or_else(|p| p.into_inner());
    let first_ca =
        block_on(async { wait_trusted(&client().await?).await }).unwrap_or_else(|e| panic!("{e}"));
    h.operator.stop(Duration::from_secs(15));
    // SIGTERM: the webhook stopped accepting and answered what it had in flight, then the
    // process ended on its own (within the grace, before any kill).
    let log = h.operator.proc.log_tail(40);
    assert!(log.contains("webhook drained"), "{log}");
    assert!(log.contains("stopped"), "{log}");
    block_on(async {
        let client = client().await?;
        // A ConfigMap is not ours: written while the webhook is down.
        namespace(&client, "webhook-down").await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "webhook-down");
        cms.create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("unrelated".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
        // Our kinds fail closed while it is down.
        let pools: Api<KVCachePool> = Api::all(client.clone());
        let down = pools
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: while-down}\nspec: {backends: [nowhere], quota: {total: 1Gi}}\n"))
            .await;
        assert!(down.is_err(), "refused while the webhook is down: {down:?}");
        // A new pair: the Secrets are gone, the operator makes a new CA and serves with it.
        for name in [SECRET, CA_SECRET] {
            Api::<Secret>::namespaced(client.clone(), OPERATOR_NS)
                .delete(name, &DeleteParams::default())
                .await?;
        }
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    h.operator.restart().expect("the operator restarts");
    // The turn is held until the new CA is trusted and a create passes: the next test must not
    // meet a webhook whose CA the API server does not trust yet.
    block_on(async move {
        let client = client().await?;
        let ca = wait_trusted(&client).await?;
        assert_ne!(ca, first_ca, "a new CA");
        let pools: Api<KVCachePool> = Api::all(client.clone());
        pools
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: after-restart}\nspec: {backends: [nowhere], quota: {total: 1Gi}}\n"))
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    drop(h);
}

/// The certificate the webhook presents on `port` (PEM), as `openssl s_client` reads it.
fn presented(port: u16) -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-showcerts",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .expect("a certificate presented");
    let end = text[begin..]
        .find("-----END CERTIFICATE-----")
        .expect("its end")
        + begin;
    text[begin..end + "-----END CERTIFICATE-----".len()].to_owned()
}

#[test]
fn a_renewed_serving_certificate_is_presented_by_the_running_webhook_without_a_refused_request() {
    let h = hook().lock().unwrap_or_else(|p| p.into_inner());
    let port = h.port;
    block_on(async move {
        let client = client().await?;
        let ca = wait_trusted(&client).await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), OPERATOR_NS);
        let cert = |s: &Secret| {
            s.data
                .as_ref()
                .and_then(|d| d.get("tls.crt"))
                .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        };
        let before = cert(&secrets.get(SECRET).await?).expect("tls.crt");
        assert_eq!(presented(port).trim(), before, "the stored pair is presented");
        // The Secret's serving pair replaced by one that does not carry the webhook's names
        // (the CA's own, as if due): the running replica issues a new one from the same CA at
        // once (it watches the Secret), and requests never fail meanwhile.
        let stored = secrets.get(SECRET).await?.data.unwrap_or_default();
        // The CA's key is kept apart from the serving pair.
        assert!(!stored.contains_key("ca.key"), "{:?}", stored.keys());
        let ca_stored = secrets.get(CA_SECRET).await?.data.unwrap_or_default();
        secrets
            .patch(
                SECRET,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {
                    "tls.crt": stored.get("ca.crt").expect("ca.crt"),
                    "tls.key": ca_stored.get("ca.key").expect("ca.key"),
                }})),
            )
            .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        let dry = PostParams { dry_run: true, ..Default::default() };
        let deadline = std::time::Instant::now() + WAIT;
        let mut requests = 0;
        let after = loop {
            pools
                .create(&dry, &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: during-renewal}\nspec: {backends: [nowhere], quota: {total: 1Gi}}\n"))
                .await
                .unwrap_or_else(|e| panic!("request {requests} during the renewal refused: {e}"));
            requests += 1;
            let now = secrets.get(SECRET).await?;
            if let Some(c) = cert(&now).filter(|c| *c != before)
                && presented(port).trim() == c
            {
                break c;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the webhook did not present a renewed serving certificate within {WAIT:?}"
            );
        };
        assert_ne!(after, before);
        // Same CA: nothing had to change in caBundle.
        assert_eq!(wait_trusted(&client).await?, ca);
        pools
            .create(&dry, &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: after-renewal}\nspec: {backends: [nowhere], quota: {total: 1Gi}}\n"))
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    drop(h);
}

/// Deletes `name` and waits until it is gone (its finalizers released).
async fn remove<K: kvcache_e2e::Watched>(api: &Api<K>, name: &str) -> Result<(), Error> {
    let uid = api.get(name).await?.uid().unwrap_or_default();
    api.delete(name, &DeleteParams::default()).await?;
    kvcache_e2e::cluster::wait_deleted(api, name, &uid, "deleted", WAIT).await
}

fn pod(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> k8s_openapi::api::core::v1::Pod {
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "pods-a",
            "labels": {"kvcache.gpustack.ai/inject": "true"},
            "annotations": {"kvcache.gpustack.ai/binding": "chat", "kvcache.gpustack.ai/engine": "vLLM"}},
        "spec": {"containers": [{"name": "engine", "image": "gpustack/runner:cpu-vllm0.29.0",
            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]}]}
    });
    edit(&mut v);
    serde_json::from_value(v).expect("a Pod")
}

#[test]
fn every_pod_refusal_reaches_the_client_with_its_reason_and_an_opted_in_pod_is_injected() {
    use k8s_openapi::api::core::v1::Pod;
    use kvcache_e2e::store::multi_tenant_store;
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    let dir = paths::scratch("webhook-pods").expect("dir");
    // A real multi-tenant master with one member, as an external backend: the pool reads its
    // ledger (QuotaLedgerAvailable=True) and publishes its address.
    let (master, _member) =
        multi_tenant_store(&dir, "pods-store", 64 << 20, WAIT).expect("a store");
    let (client_addr, admin_addr) = (
        master.address(),
        format!("127.0.0.1:{}", master.metrics_port),
    );
    block_on(async move {
        let client = client().await?;
        wait_trusted(&client).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let pools: Api<KVCachePool> = Api::all(client.clone());
        let external = |name: &str, c: &str, a: &str| -> KVCacheBackend {
            yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}}}\nspec:\n  connection:\n    external:\n      endpoints: [{{name: Client, address: '{c}'}}, {{name: Admin, address: '{a}'}}]\n"))
        };
        backends.create(&PostParams::default(), &external("pods-store", &client_addr, &admin_addr)).await?;
        backends.create(&PostParams::default(), &external("pods-down", "127.0.0.1:1", "127.0.0.1:2")).await?;
        for (pool, backend) in [("pods-pool", "pods-store"), ("pods-down-pool", "pods-down")] {
            pools
                .create(&PostParams::default(), &yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {{name: {pool}}}\nspec: {{backends: [{backend}], quota: {{total: 1Gi}}}}\n")))
                .await?;
        }
        namespace(&client, "pods-a").await;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "pods-a");
        let binding = |name: &str, pool: &str, domain: &str| -> KVCachePoolBinding {
            yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: {name}, namespace: pods-a}}\nspec:\n  poolRef: {{name: {pool}}}\n  quota: {{ceiling: 16Mi}}\n  domain: {{name: {domain}, blockSize: 64, dtype: bfloat16}}\n"))
        };
        bindings.create(&PostParams::default(), &binding("chat", "pods-pool", "chat")).await?;
        bindings.create(&PostParams::default(), &binding("down", "pods-down-pool", "down")).await?;
        bindings.create(&PostParams::default(), &binding("dangling", "no-such-pool", "dangling")).await?;
        let mut going = binding("going", "pods-pool", "going");
        going.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        bindings.create(&PostParams::default(), &going).await?;
        bindings.delete("going", &DeleteParams::default()).await?;
        wait_object(&pools, "pods-pool", "QuotaLedgerAvailable=True and a client endpoint", WAIT, |p| {
            has_condition(p, "QuotaLedgerAvailable=True")
                && p.status.as_ref().is_some_and(|s| s.client_endpoint.is_some())
        })
        .await?;
        wait_condition(&pools, "pods-down-pool", "QuotaLedgerAvailable=False", WAIT).await?;
        wait_object(&bindings, "going", "being deleted", WAIT, |b| b.metadata.deletion_timestamp.is_some()).await?;

        let pods: Api<Pod> = Api::namespaced(client.clone(), "pods-a");
        let dry = PostParams { dry_run: true, ..Default::default() };
        // Injected: the file, the variable and the records, through the API server.
        let out = pods.create(&dry, &pod("engine", |_| {})).await?;
        let a = out.metadata.annotations.clone().unwrap_or_default();
        let config: serde_json::Value = serde_json::from_str(a.get("kvcache.gpustack.ai/client-config").expect("client-config")).expect("JSON");
        assert_eq!(config["master_server_address"], client_addr.as_str());
        assert_eq!(config["tenant_id"], "chat");
        assert!(a.contains_key("kvcache.gpustack.ai/injected"));
        let c = &out.spec.as_ref().expect("spec").containers[0];
        assert!(c.args.iter().flatten().any(|x| x == "--kv-transfer-config"), "{:?}", c.args);
        // A Pod created right after its Binding is injected: when the shared cache has not seen
        // the Binding yet, the webhook reads it live (ten in a row, so a lagging cache shows).
        for i in 0..10 {
            let name = format!("late-{i}");
            bindings.create(&PostParams::default(), &binding(&name, "pods-pool", &name)).await?;
            let out = pods
                .create(&dry, &pod("engine", |p| p["metadata"]["annotations"]["kvcache.gpustack.ai/binding"] = name.clone().into()))
                .await
                .unwrap_or_else(|e| panic!("a Pod on the Binding {name} created a moment earlier: {e}"));
            let a = out.metadata.annotations.unwrap_or_default();
            let config: serde_json::Value = serde_json::from_str(a.get("kvcache.gpustack.ai/client-config").expect("client-config")).expect("JSON");
            assert_eq!(config["tenant_id"], name.as_str());
        }
        // A Binding and its Pod in one `kubectl apply` (the Pod's review comes milliseconds after
        // the Binding's write): both admitted, the Pod injected with the Binding's tenant, ten
        // times over.
        let dir = paths::scratch("webhook-together").expect("dir");
        for i in 0..10 {
            let name = format!("together-{i}");
            let mut pod_doc = serde_json::to_value(pod(&name, |p| {
                p["metadata"]["annotations"]["kvcache.gpustack.ai/binding"] = name.clone().into();
            }))
            .expect("JSON");
            pod_doc["spec"]["terminationGracePeriodSeconds"] = 0.into();
            let docs = [
                serde_json::to_value(binding(&name, "pods-pool", &name)).expect("JSON"),
                pod_doc,
            ];
            let file = dir.join(format!("{name}.yaml"));
            let text: Vec<String> = docs.iter().map(|d| serde_yaml::to_string(d).expect("YAML")).collect();
            std::fs::write(&file, text.join("---\n")).expect("write");
            let out = kubectl().args(["apply", "-o", "json", "-f"]).arg(&file).output().expect("kubectl");
            assert!(
                out.status.success(),
                "a Binding and its Pod applied together are both admitted ({name}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kubectl's JSON");
            let applied = list["items"].as_array().expect("a List of what was applied");
            let created = applied.iter().find(|o| o["kind"] == "Pod").expect("the Pod");
            let config: serde_json::Value = serde_json::from_str(
                created["metadata"]["annotations"]["kvcache.gpustack.ai/client-config"].as_str().expect("client-config"),
            )
            .expect("JSON");
            assert_eq!(config["tenant_id"], name.as_str());
            pods.delete(&name, &DeleteParams::default()).await?;
        }

        // A new backend, a pool on it, a Binding on that pool and its Pod in one `kubectl apply`
        // (docs/design.md#live-reads): a Binding is judged against the pool and backend written
        // a moment before it, read live when the caches have not seen them yet. What shows it:
        // in the same apply, a Binding claiming a domain that a Binding the caches already hold
        // claims on the new backend (it named the pool before the pool existed) is refused as
        // its duplicate; judged on the caches alone while they lack the pool, its claim would go
        // unchecked. Server-side apply sends one request per object, the shortest gap between
        // the pool's write and the next review. The Pod is refused only as LedgerNotReady (its
        // pool has not read the master's ledger yet), never as naming what is missing; once the
        // pool reports the ledger the same chain applied again is admitted, the Pod injected.
        // Ten times over: the caches lag only now and then.
        namespace(&client, "live-held").await;
        namespace(&client, "live-dup").await;
        let held: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "live-held");
        let dups: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "live-dup");
        let apply = |file: &std::path::Path| {
            kubectl().args(["apply", "--server-side", "-o", "json", "-f"]).arg(file).output().expect("kubectl")
        };
        for i in 0..10 {
            let (store, pool, name, domain) =
                (format!("live-store-{i}"), format!("live-pool-{i}"), format!("live-{i}"), format!("held-{i}"));
            let claim = |ns: &str, domain: &str| {
                format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  poolRef: {{name: {pool}}}\n  quota: {{ceiling: 16Mi}}\n  domain: {{name: {domain}, blockSize: 64, dtype: bfloat16}}\n")
            };
            held.create(&PostParams::default(), &yaml(&claim("live-held", &domain))).await?;
            // The operator's finalizer is on: its caches hold the claim.
            wait_object(&held, &name, "the operator's finalizer", WAIT, |b| !b.finalizers().is_empty()).await?;
            let backend_doc = format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {store}}}\nspec:\n  connection:\n    external:\n      endpoints: [{{name: Client, address: '{client_addr}'}}, {{name: Admin, address: '{admin_addr}'}}]\n");
            let pool_doc = format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {{name: {pool}}}\nspec: {{backends: [{store}], quota: {{total: 1Gi}}}}\n");
            let mut pod_doc = serde_json::to_value(pod(&name, |p| {
                p["metadata"]["annotations"]["kvcache.gpustack.ai/binding"] = name.clone().into();
            }))
            .expect("JSON");
            pod_doc["spec"]["terminationGracePeriodSeconds"] = 0.into();
            let pod_doc = serde_yaml::to_string(&pod_doc).expect("YAML");
            let own = claim("pods-a", &name);
            // The duplicate comes right after the pool, when the caches are least likely to
            // hold it.
            let first = dir.join(format!("{name}.yaml"));
            std::fs::write(&first, [backend_doc.as_str(), &pool_doc, &claim("live-dup", &domain), &own, &pod_doc].join("---\n")).expect("write");
            let out = apply(&first);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{name}: the duplicate claim is refused: {stderr}");
            // kubectl prints one line per refused object (its own wording around the webhook's
            // message; the admitted ones' warnings start with "Warning:").
            let duplicate = format!("domain \"{domain}\" is already held on backend {store} by KVCachePoolBinding live-held/{name}");
            let refused: Vec<&str> = stderr.lines().filter(|l| !l.is_empty() && !l.starts_with("Warning:")).collect();
            assert_eq!(
                refused.iter().filter(|l| l.contains("spec.domain.name") && l.contains(&duplicate)).count(),
                1,
                "{name}: refused as the duplicate of live-held/{name}: {stderr}"
            );
            assert!(
                refused.iter().all(|l| l.contains(&duplicate) || l.contains("LedgerNotReady")),
                "{name}: only the duplicate and (its pool new) the Pod as LedgerNotReady are refused: {stderr}"
            );
            assert!(dups.get_opt(&name).await?.is_none(), "{name}: the duplicate was not created");
            assert!(backends.get_opt(&store).await?.is_some(), "{name}: the backend was created");
            assert!(pools.get_opt(&pool).await?.is_some(), "{name}: the pool was created");
            assert!(bindings.get_opt(&name).await?.is_some(), "{name}: the Binding was created");
            wait_object(&pools, &pool, "QuotaLedgerAvailable=True and a client endpoint", WAIT, |p| {
                has_condition(p, "QuotaLedgerAvailable=True")
                    && p.status.as_ref().is_some_and(|s| s.client_endpoint.is_some())
            })
            .await?;
            // Applied again without the duplicate: every object admitted, the Pod injected. The
            // caches may see the pool's ledger a moment after the watch above: a LedgerNotReady
            // is asked again, within WAIT.
            let second = dir.join(format!("{name}-again.yaml"));
            std::fs::write(&second, [backend_doc.as_str(), &pool_doc, &own, &pod_doc].join("---\n")).expect("write");
            let deadline = tokio::time::Instant::now() + WAIT;
            let list: serde_json::Value = loop {
                let out = apply(&second);
                if out.status.success() {
                    break serde_json::from_slice(&out.stdout).expect("kubectl's JSON");
                }
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    stderr.contains("LedgerNotReady") && tokio::time::Instant::now() < deadline,
                    "{name}: the chain applied again once its pool reports the ledger is admitted (within {WAIT:?}): {stderr}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let applied = list["items"].as_array().expect("a List of what was applied");
            let created = applied.iter().find(|o| o["kind"] == "Pod").expect("the Pod");
            let config: serde_json::Value = serde_json::from_str(
                created["metadata"]["annotations"]["kvcache.gpustack.ai/client-config"].as_str().expect("client-config"),
            )
            .expect("JSON");
            assert_eq!(config["tenant_id"], name.as_str());
            assert_eq!(config["master_server_address"], client_addr.as_str());
            // Gone again, so that later tests meet what they made: the Pod at once, the Bindings
            // once the operator released their tenants, then the pool, then the backend.
            pods.delete(&name, &DeleteParams::default().grace_period(0)).await?;
            remove(&bindings, &name).await?;
            remove(&held, &name).await?;
            remove(&pools, &pool).await?;
            remove(&backends, &store).await?;
        }

        // Each refusal, with its reason in what the client reads.
        let ann = |k: &'static str, v: Option<&'static str>| {
            move |p: &mut serde_json::Value| match v {
                Some(v) => p["metadata"]["annotations"][k] = v.into(),
                None => {
                    if let Some(m) = p["metadata"]["annotations"].as_object_mut() {
                        m.remove(k);
                    }
                }
            }
        };
        let cmd = |command: serde_json::Value, args: serde_json::Value| {
            move |p: &mut serde_json::Value| {
                p["spec"]["containers"][0]["command"] = command;
                p["spec"]["containers"][0]["args"] = args;
            }
        };
        let null = serde_json::Value::Null;
        // An SGLang server (its store settings are variables) with the container's own `env`.
        let sglang_env = |env: serde_json::Value| {
            move |p: &mut serde_json::Value| {
                p["metadata"]["annotations"]["kvcache.gpustack.ai/engine"] = "SGLang".into();
                let c = &mut p["spec"]["containers"][0];
                c["image"] = "gpustack/runner:cpu-sglang0.5.18".into();
                c["command"] = serde_json::json!(["python3", "-m", "sglang.launch_server"]);
                c["env"] = env;
            }
        };
        let cases: Vec<(&str, Pod, &str)> = vec![
            ("a", pod("a", ann("kvcache.gpustack.ai/binding", None)), "BindingMissing"),
            ("b", pod("b", ann("kvcache.gpustack.ai/binding", Some("other/chat"))), "CrossNamespaceBinding"),
            ("c", pod("c", ann("kvcache.gpustack.ai/binding", Some("nobody"))), "BindingNotFound"),
            ("d", pod("d", ann("kvcache.gpustack.ai/binding", Some("dangling"))), "DanglingReference"),
            ("e", pod("e", ann("kvcache.gpustack.ai/binding", Some("down"))), "LedgerNotReady"),
            ("f", pod("f", ann("kvcache.gpustack.ai/engine", None)), "EngineMissing"),
            ("f", pod("f2", ann("kvcache.gpustack.ai/manufacturer", Some("nvidia"))), "UnknownManufacturer"),
            ("g", pod("g", |p| p["spec"]["containers"].as_array_mut().expect("list").push(serde_json::json!({"name": "side", "image": "busybox"}))), "ContainerAmbiguous"),
            ("h", pod("h", |p| {
                p["spec"]["initContainers"] = serde_json::json!([{"name": "warmup", "image": "busybox"}]);
                p["metadata"]["annotations"]["kvcache.gpustack.ai/container"] = "warmup".into();
            }), "InitContainerNamed"),
            ("i", pod("i", |p| p["spec"]["containers"][0]["args"] = serde_json::json!(["--kv-transfer-config", "{}"])), "OwnedKeyPresent"),
            ("j", pod("j", |p| p["spec"]["containers"][0]["args"] = serde_json::json!(["--kv-cache-dtype", "fp8"])), "DtypeOwned"),
            ("k", pod("k", ann("kvcache.gpustack.ai/binding", Some("going"))), "BindingDeleting"),
            ("m", pod("m", |p| p["spec"]["volumes"] = serde_json::json!([{"name": "kvcache-client-config", "emptyDir": {}}])), "VolumeCollision"),
            ("n", pod("n", cmd(null.clone(), null.clone())), "NoLaunchCommand"),
            ("o", pod("o", cmd(null.clone(), serde_json::json!(["serve"]))), "EntrypointNotInspectable"),
            ("p", pod("p", cmd(serde_json::json!(["tini", "--"]), null.clone())), "LauncherWithoutProgram"),
            ("q", pod("q", cmd(serde_json::json!(["python3", "-m", "sglang.launch_server"]), null.clone())), "WrongProgram"),
            ("r", pod("r", cmd(serde_json::json!(["sh", "-c", "vllm serve m"]), null.clone())), "ShellLaunch"),
            ("s", pod("s", cmd(serde_json::json!(["env", "-S", "vllm serve m"]), null.clone())), "HiddenCommand"),
            ("t", pod("t", cmd(serde_json::json!(["./run.sh"]), null.clone())), "ScriptLaunch"),
            ("u", pod("u", ann("kvcache.gpustack.ai/bindng", Some("chat"))), "UnknownAnnotation"),
            ("v", pod("v", ann("kvcache.gpustack.ai/injected", Some("{}"))), "RecordSubmitted"),
            ("w", pod("w", ann("kvcache.gpustack.ai/domain", Some("chat"))), "DomainAnnotation"),
            ("x", pod("x", ann("kvcache.gpustack.ai/role", Some("Server"))), "InvalidRole"),
            ("y", pod("y", ann("kvcache.gpustack.ai/manufacturer", Some("ascend"))), "NotSupportedTransport"),
            ("own tenant", pod("own-tenant", sglang_env(serde_json::json!([{"name": "MOONCAKE_TENANT_ID", "value": "someone-else"}]))), "StoreSettingOverridden"),
            ("own master", pod("own-master", sglang_env(serde_json::json!([{"name": "MOONCAKE_MASTER", "value": "10.0.0.1:50051"}]))), "StoreSettingOverridden"),
            ("tenant twice", pod("tenant-twice", sglang_env(serde_json::json!([
                {"name": "MOONCAKE_TENANT_ID", "value": "chat"}, {"name": "MOONCAKE_TENANT_ID", "value": "chat"}]))), "DuplicateStoreSetting"),
        ];
        for (rule, p, reason) in cases {
            match pods.create(&dry, &p).await {
                Err(kube::Error::Api(s)) => assert!(
                    s.message.contains(reason) && s.message.contains("inject.kvcache.gpustack.ai"),
                    "case {rule}: expected {reason}, got {}",
                    s.message
                ),
                other => panic!("case {rule}: expected a refusal ({reason}), got {other:?}"),
            }
        }

        // The setting the injection gives, as the API server stores it (a field reference
        // defaulted to apiVersion v1), is no choice of the container's own: admitted.
        let same = pod("same-hostname", sglang_env(serde_json::json!([
            {"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}])));
        pods.create(&dry, &same)
            .await
            .unwrap_or_else(|e| panic!("an SGLang Pod setting MOONCAKE_LOCAL_HOSTNAME as the injection does: {e}"));

        // The freeze: the records and the label cannot change; other metadata can.
        let created = pods.create(&PostParams::default(), &pod("frozen", |_| {})).await?;
        let edit = |patch: serde_json::Value| {
            let pods = pods.clone();
            async move { pods.patch("frozen", &PatchParams::default(), &Patch::Merge(patch)).await }
        };
        edit(serde_json::json!({"metadata": {"labels": {"team": "a"}, "annotations": {"note": "fine"}}})).await?;
        for patch in [
            serde_json::json!({"metadata": {"annotations": {"kvcache.gpustack.ai/injected": null}}}),
            serde_json::json!({"metadata": {"annotations": {"kvcache.gpustack.ai/client-config": "{}"}}}),
            serde_json::json!({"metadata": {"labels": {"kvcache.gpustack.ai/inject": "false"}}}),
        ] {
            match edit(patch.clone()).await {
                Err(kube::Error::Api(s)) => assert!(s.message.contains("freeze.kvcache.gpustack.ai"), "{}", s.message),
                other => panic!("the freeze lets {patch} through: {other:?}"),
            }
        }
        assert!(created.metadata.annotations.is_some_and(|a| a.contains_key("kvcache.gpustack.ai/injected")));
        // A Pod without the label is not touched.
        let plain = pods
            .create(&dry, &pod("plain", |p| {
                p["metadata"]["labels"] = serde_json::json!({});
                p["metadata"]["annotations"] = serde_json::json!({});
            }))
            .await?;
        assert!(plain.metadata.annotations.unwrap_or_default().is_empty());
        bindings.patch("going", &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}))).await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The real 0.3.11.post1 master from PyPI (the wheel setup downloaded for the older-client
/// engine stand-in), unpacked into `dir`.
fn master_0_3_11(dir: &std::path::Path) -> PathBuf {
    let wheels = paths::cache_dir().join("wheels").join("0.3.11.post1");
    let wheel = std::fs::read_dir(&wheels)
        .expect("the 0.3.11.post1 wheels (cargo xtask setup)")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mooncake_transfer_engine"))
        })
        .expect("the mooncake wheel");
    // A wheel is a zip; Python's own module unpacks it.
    let status = std::process::Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(dir)
        .status()
        .expect("python3");
    assert!(status.success(), "unpacking {}", wheel.display());
    let master = dir.join("mooncake").join("mooncake_master");
    std::fs::set_permissions(&master, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    master
}

#[test]
fn a_backend_on_a_master_without_multi_tenancy_is_refused_before_any_pod_and_that_master_shows_why()
{
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    let text = "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: old-store}\nspec:\n  image: kvcacheai/mooncake:0.3.11.post1\n  connection:\n    managed:\n      leader: {}\n      members: [{medium: DRAM, capacityPerMember: 64Mi}]\n";
    let backend: KVCacheBackend = yaml(text);
    // Why: the flags the render gives this backend's leader, to the real 0.3.11.post1 master.
    let dir = paths::scratch("master-0.3.11").expect("dir");
    let master = master_0_3_11(&dir);
    let managed = backend.spec.connection.managed.clone().expect("managed");
    let mut flags =
        kvcache_render::objects::backend::master_flags(&managed, "gpustack-system", "old-store");
    let (rpc, metrics) = (free_port().expect("port"), free_port().expect("port"));
    flags.push(format!("-rpc_port={rpc}"));
    flags.push(format!("-metrics_port={metrics}"));
    let out = std::process::Command::new(&master)
        .args(&flags)
        .env(
            "LD_LIBRARY_PATH",
            dir.join("mooncake_transfer_engine_non_cuda.libs"),
        )
        .output()
        .expect("run the master");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it exits: {stderr}");
    assert!(
        stderr.contains("unknown command line flag 'enable_multi_tenants'"),
        "{stderr}"
    );
    // The same backend is refused at admission: nothing is created, no Pod starts.
    block_on(async move {
        let client = client().await?;
        wait_trusted(&client).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let message = refusal(backends.create(&PostParams::default(), &backend).await);
        assert!(
            message.contains("spec.connection.managed.leader.multiTenancy")
                && message.contains("0.3.11.post1")
                && message.contains("unknown command line flag"),
            "{message}"
        );
        assert!(backends.get_opt("old-store").await?.is_none());
        // Declared single-tenant, the same image is admitted.
        let mut single: KVCacheBackend = yaml(text);
        if let Some(m) = single.spec.connection.managed.as_mut() {
            m.leader.multi_tenancy = false;
        }
        backends
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &single,
            )
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_model_deployment_on_a_pool_of_mixed_protocols_is_refused_at_once_from_live_reads() {
    use kvcache_api::ModelDeployment;
    let _turn = hook().lock().unwrap_or_else(|p| p.into_inner());
    block_on(async {
        let client = client().await?;
        wait_trusted(&client).await?;
        // Created one after the other with no wait: the webhook reads them live
        // (docs/design.md#live-reads).
        Api::<KVCacheBackend>::all(client.clone())
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: mixed-store}\nspec:\n  image: gpustack/mirrored-mooncake:0.3.13.post1-cpu\n  connection:\n    managed:\n      leader: {}\n      members:\n        - {medium: DRAM, capacityPerMember: 64Mi, transport: {protocol: TCP}}\n        - {medium: DRAM, capacityPerMember: 64Mi, transport: {protocol: RDMA}, nodeSelector: {rdma: 'true'}}\n"))
            .await?;
        Api::<KVCachePool>::all(client.clone())
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: mixed}\nspec: {backends: [mixed-store], quota: {total: 1Gi}}\n"))
            .await?;
        namespace(&client, "mixed-a").await;
        Api::<KVCachePoolBinding>::namespaced(client.clone(), "mixed-a")
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {name: chat, namespace: mixed-a}\nspec:\n  poolRef: {name: mixed}\n  quota: {ceiling: 16Mi}\n  domain: {name: chat, blockSize: 64, dtype: bfloat16}\n"))
            .await?;
        let md = |binding: &str| -> ModelDeployment {
            yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata: {{name: chat, namespace: mixed-a}}\nspec:\n  model: {{name: Qwen/Qwen2.5-0.5B-Instruct}}\n  engine: {{name: vLLM, version: '0.29.0'}}\n  kvCache: {{poolRef: {{name: {binding}}}}}\n  roles:\n    - {{name: server, replicas: 0, instanceType: cpu}}\n"))
        };
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "mixed-a");
        let message = refusal(models.create(&PostParams::default(), &md("chat")).await);
        assert!(
            message.contains("spec.roles[0]")
                && message.contains("mixed protocols")
                && message.contains("tcp")
                && message.contains("rdma")
                && message.contains("KVCacheBackend mixed-store"),
            "{message}"
        );
        // Fabric interfaces per Pod on that pool (docs/design.md#fabric-interfaces): the groups'
        // protocols differ.
        let with_interfaces = |n: &str| -> ModelDeployment {
            yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata: {{name: chat, namespace: mixed-a}}\nspec:\n  model: {{name: Qwen/Qwen2.5-0.5B-Instruct}}\n  engine: {{name: vLLM, version: '0.29.0'}}\n  kvCache: {{poolRef: {{name: chat}}}}\n  roles:\n    - {{name: server, replicas: 0, instanceType: cpu, resources: {{interface: {n}}}}}\n"))
        };
        let message = refusal(models.create(&PostParams::default(), &with_interfaces("2")).await);
        assert!(
            message.contains("spec.roles[0].resources.interface")
                && message.contains("differing protocols (RDMA, TCP)")
                && message.contains("KVCacheBackend mixed-store"),
            "{message}"
        );
        // A negative count never reaches the webhook: the schema refuses it.
        let message = refusal(models.create(&PostParams::default(), &with_interfaces("-1")).await);
        assert!(
            message.contains("spec.roles[0].resources.interface"),
            "{message}"
        );
        // A deployment naming a Binding that does not exist (yet) is admitted: it reports
        // BindingNotFound until the Binding arrives.
        models
            .create(&PostParams { dry_run: true, ..Default::default() }, &md("later"))
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Creates `n` injected Pods (dry run) and one Binding through the API server; each create's
/// latency. Every one must be admitted.
async fn admit_some(
    client: &Client,
    ns: &str,
    binding: &str,
    round: &str,
    n: usize,
) -> Result<Vec<Duration>, Error> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut took = Vec::new();
    for i in 0..n {
        let mut p = serde_json::to_value(pod(&format!("flood-{round}-{i}"), |p| {
            p["metadata"]["annotations"]["kvcache.gpustack.ai/binding"] = binding.into();
        }))
        .expect("JSON");
        p["metadata"]["namespace"] = ns.into();
        let p: Pod = serde_json::from_value(p).expect("a Pod");
        let t = std::time::Instant::now();
        let out = pods
            .create(&dry, &p)
            .await
            .unwrap_or_else(|e| panic!("{round}: an injected Pod in {ns} is admitted: {e}"));
        took.push(t.elapsed());
        assert!(
            out.metadata
                .annotations
                .unwrap_or_default()
                .contains_key("kvcache.gpustack.ai/injected"),
            "{round}: the Pod is injected"
        );
    }
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
    let name = format!("flood-{round}");
    let b: KVCachePoolBinding = yaml(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  poolRef: {{name: flood-pool}}\n  quota: {{ceiling: 16Mi}}\n  domain: {{name: {name}, blockSize: 64, dtype: bfloat16}}\n"
    ));
    let t = std::time::Instant::now();
    bindings
        .create(&PostParams::default(), &b)
        .await
        .unwrap_or_else(|e| panic!("{round}: a Binding in {ns} is admitted: {e}"));
    took.push(t.elapsed());
    Ok(took)
}

/// The flood that OOM-killed both operator replicas (issue 48), from one source address
/// (127.0.0.2: the API server calls from 127.0.0.1): 600 connections each sending 1.5 MB of a
/// 2 MB review at once and then a byte every 2 s; then 600 idle connections; then forged
/// reviews as fast as they are answered, each naming a Binding that does not exist (a live read
/// each). Meanwhile injected Pods and a Binding in another namespace are admitted, the operator
/// never restarts, and its peak memory stays under the installation's 256 Mi limit. The
/// latencies are printed (figures: `cargo xtask bench admission --flood`), not asserted.
#[test]
fn a_flood_from_one_source_leaves_admission_to_everyone_else() {
    use kvcache_e2e::flood::{Target, forged, forged_review, idle, peak_memory, slow_bodies};
    use kvcache_e2e::store::multi_tenant_store;
    const LIMIT: u64 = 256 << 20;
    let mut h = hook().lock().unwrap_or_else(|p| p.into_inner());
    let dir = paths::scratch("webhook-flood").expect("dir");
    let (master, _member) =
        multi_tenant_store(&dir, "flood-store", 64 << 20, WAIT).expect("a store");
    let (client_addr, admin_addr) = (
        master.address(),
        format!("127.0.0.1:{}", master.metrics_port),
    );
    let pid = h.operator.proc.pid();
    let target = Target {
        addr: format!("127.0.0.1:{}", h.port)
            .parse()
            .expect("the webhook's address"),
        source: "127.0.0.2".parse().expect("v4"),
        path: "/mutate-pods",
    };
    block_on(async move {
        let client = client().await?;
        wait_trusted(&client).await?;
        Api::<KVCacheBackend>::all(client.clone())
            .create(&PostParams::default(), &yaml(&format!("apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: flood-store}}\nspec:\n  connection:\n    external:\n      endpoints: [{{name: Client, address: '{client_addr}'}}, {{name: Admin, address: '{admin_addr}'}}]\n")))
            .await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        pools
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: flood-pool}\nspec: {backends: [flood-store], quota: {total: 1Gi}}\n"))
            .await?;
        namespace(&client, "flood-b").await;
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "flood-b");
        bindings
            .create(&PostParams::default(), &yaml("apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {name: chat, namespace: flood-b}\nspec:\n  poolRef: {name: flood-pool}\n  quota: {ceiling: 16Mi}\n  domain: {name: flood-chat, blockSize: 64, dtype: bfloat16}\n"))
            .await?;
        wait_object(&pools, "flood-pool", "QuotaLedgerAvailable=True and a client endpoint", WAIT, |p| {
            has_condition(p, "QuotaLedgerAvailable=True")
                && p.status.as_ref().is_some_and(|s| s.client_endpoint.is_some())
        })
        .await?;
        let quiet = admit_some(&client, "flood-b", "chat", "unloaded", 5).await?;
        eprintln!("flood: unloaded admission {quiet:?}");

        // 1. Slow bodies: the flood runs for 20 s while admission goes on.
        let slow = {
            let target = target.clone();
            tokio::spawn(async move {
                slow_bodies(&target, 600, 2_000_000, 1_500_000, Duration::from_secs(2), Duration::from_secs(20)).await
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        let during = admit_some(&client, "flood-b", "chat", "slow-bodies", 5).await?;
        let slow = slow.await.expect("the flood ends");
        eprintln!("flood: slow bodies {slow:?}; admission {during:?}");
        assert!(slow.refused + slow.closed > 0, "the flood met the bounds: {slow:?}");

        // 2. Idle connections.
        let idle_flood = {
            let target = target.clone();
            tokio::spawn(async move { idle(&target, 600, Duration::from_secs(15)).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = admit_some(&client, "flood-b", "chat", "idle", 5).await?;
        let idle_flood = idle_flood.await.expect("the flood ends");
        eprintln!("flood: idle {idle_flood:?}; admission {during:?}");

        // 3. Forged reviews naming a Binding that does not exist (each a live read).
        let review = forged_review(
            "flood-b",
            serde_json::to_value(pod("forged", |p| {
                p["metadata"]["namespace"] = "flood-b".into();
                p["metadata"]["annotations"]["kvcache.gpustack.ai/binding"] =
                    "no-such-binding".into();
            }))
            .expect("JSON"),
        );
        let forging = {
            let target = target.clone();
            tokio::spawn(async move { forged(&target, 32, 3_000, &review).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = admit_some(&client, "flood-b", "chat", "forged", 5).await?;
        let forging = forging.await.expect("the flood ends");
        eprintln!("flood: forged {forging:?}; admission {during:?}");
        assert!(forging.statuses.get(&200).copied().unwrap_or(0) > 0, "forged reviews were answered (refused inside the review): {forging:?}");
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.operator.proc.pid(),
        pid,
        "the operator was never restarted"
    );
    assert!(
        !h.operator.proc.exited(),
        "the operator is still running: {}",
        h.operator.log_text()
    );
    let peak = peak_memory(pid).expect("the operator's VmHWM");
    eprintln!("flood: operator peak memory {} MiB", peak >> 20);
    assert!(
        peak < LIMIT,
        "the operator's peak memory {} MiB stays under the installation's limit of 256 MiB",
        peak >> 20
    );
    let text = h
        .operator
        .wait_metrics(
            "webhook connections refused past the flood's share",
            WAIT,
            |t| {
                // Read with the exposition reader: the webhook server's own count of this reason.
                kvcache_e2e::store::metric_sum(
                    t,
                    "kvcache_operator_connections_refused_total",
                    &[("server", "webhook"), ("reason", "source_full")],
                )
                .is_some_and(|v| v > 0.0)
            },
        )
        .expect("the refusals counted");
    drop(text);
}
