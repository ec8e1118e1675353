//! The admission webhook for real: the API server calls `kvcache-operator run`'s webhook over
//! TLS (the operator made the CA and the serving certificate, kept them in a Secret, and wrote
//! the CA into the webhook configuration), and refuses or warns as the catalogue says.

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
use kvcache_e2e::{Error, paths};

const WAIT: Duration = Duration::from_secs(60);
const OPERATOR_NS: &str = "kvcache-webhook";
const SECRET: &str = "kvcache-operator-webhook-tls";

struct Hook {
    operator: Operator,
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
            let (_, mut validating) = kvcache_render::install::webhooks(OPERATOR_NS);
            let hooks = validating.webhooks.get_or_insert_with(Vec::new);
            hooks.retain(|w| w.name == "validate.kvcache.gpustack.ai");
            for w in hooks.iter_mut() {
                w.client_config.service = None;
                w.client_config.url = Some(format!("https://127.0.0.1:{port}/validate"));
            }
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .patch(
                    &validating.name_any(),
                    &PatchParams::apply("kvcache-e2e").force(),
                    &Patch::Apply(&validating),
                )
                .await?;
            Ok::<_, Error>(())
        })
        .map_err(|e| e.to_string())?;
        let operator = Operator::start_unscoped_with(
            &kc,
            OPERATOR_NS,
            &[],
            &dir,
            &[
                format!("--webhook-addr=127.0.0.1:{port}"),
                "--webhook-name=127.0.0.1".into(),
            ],
        )
        .map_err(|e| e.to_string())?;
        Ok(Mutex::new(Hook { operator }))
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
fn a_second_binding_claiming_a_domain_on_the_same_backend_is_refused_naming_the_first() {
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
                && message.contains("KVCacheBackend claims-store"),
            "{message}"
        );
        // Another name on the same backend is admitted.
        b.create(&PostParams::default(), &binding("claims-b", "llama")).await?;
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

#[test]
fn with_the_operator_stopped_other_groups_are_still_written_and_a_new_certificate_serves() {
    let mut h = hook().lock().unwrap_or_else(|p| p.into_inner());
    let first_ca =
        block_on(async { wait_trusted(&client().await?).await }).unwrap_or_else(|e| panic!("{e}"));
    h.operator.stop(Duration::from_secs(5));
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
        // A new pair: the Secret is gone, the operator makes a new CA and serves with it.
        Api::<Secret>::namespaced(client.clone(), OPERATOR_NS)
            .delete(SECRET, &DeleteParams::default())
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    h.operator.restart().expect("the operator restarts");
    drop(h);
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
}
