//! The rendered objects in the real API server: every input case applies (schemas, Pod
//! templates, RBAC), the installation passes a server-side dry run, and the rendered Roles grant
//! exactly what the store processes need.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kvcache_api::{Settings, manifest};
use kvcache_e2e::shared;
use kvcache_render::plan::resolve::{DEFAULT_NAMESPACE, Environment, render_all};

const INPUTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../crates/kvcache-render/tests/inputs"
);

async fn ensure_namespace(client: &Client, name: &str) {
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("ns");
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
}

async fn apply(client: &Client, doc: &serde_yaml::Value, dry_run: bool) -> Result<(), String> {
    let obj: DynamicObject = serde_yaml::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let types = obj.types.clone().ok_or("no type meta")?;
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| e.to_string())?;
    let (ar, caps) = pinned_kind(client, &gvk).await.map_err(|e| e.to_string())?;
    let api: Api<DynamicObject> = match (&obj.metadata.namespace, caps.scope) {
        (Some(ns), kube::discovery::Scope::Namespaced) => {
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    };
    let mut pp = PatchParams::apply("kvcache-e2e").force();
    if dry_run {
        pp = pp.dry_run();
    }
    let name = obj.metadata.name.clone().unwrap_or_default();
    api.patch(&name, &pp, &Patch::Apply(&obj))
        .await
        .map(|_| ())
        .map_err(|e| format!("{} {name}: {e}", types.kind))
}

#[tokio::test]
async fn every_rendered_case_applies_and_the_installation_dry_runs() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    ensure_namespace(&client, DEFAULT_NAMESPACE).await;
    ensure_namespace(&client, "team-a").await;
    let settings = Settings::default();
    let env = Environment {
        namespace: DEFAULT_NAMESPACE,
        settings: &settings,
    };
    let mut files: Vec<_> = std::fs::read_dir(INPUTS)
        .expect("inputs")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut applied = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let objects: Vec<_> = manifest::parse(&f.display().to_string(), &text)
            .expect("parse")
            .into_iter()
            .map(|m| m.object)
            .collect();
        let docs = render_all(&objects, &env).unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        for d in &docs {
            apply(&client, d, false)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            applied += 1;
        }
    }
    assert!(applied > 40, "{applied} objects applied");

    let install = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/operator.yaml"
    ))
    .expect("operator.yaml");
    for doc in serde_yaml::Deserializer::from_str(&install) {
        let value = serde::Deserialize::deserialize(doc).expect("yaml");
        apply(&client, &value, true)
            .await
            .expect("the installation passes a server-side dry run");
    }
}

async fn allowed(
    client: &Client,
    user: &str,
    verb: &str,
    group: &str,
    resource: &str,
    name: Option<&str>,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{DEFAULT_NAMESPACE}"),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(DEFAULT_NAMESPACE.into()),
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                name: name.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("review");
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn rendered_roles_grant_exactly_the_lease() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    ensure_namespace(&client, DEFAULT_NAMESPACE).await;
    let settings = Settings::default();
    let env = Environment {
        namespace: DEFAULT_NAMESPACE,
        settings: &settings,
    };
    let text = std::fs::read_to_string(format!("{INPUTS}/lease-addressing.yaml")).expect("input");
    let objects: Vec<_> = manifest::parse("lease", &text)
        .expect("parse")
        .into_iter()
        .map(|m| m.object)
        .collect();
    for d in render_all(&objects, &env).expect("renders") {
        apply(&client, &d, false).await.expect("applies");
    }
    let leader = format!("system:serviceaccount:{DEFAULT_NAMESPACE}:mooncake-dram-leader");
    let member = format!("system:serviceaccount:{DEFAULT_NAMESPACE}:mooncake-dram-member");
    let lease = Some("mooncake-dram-leader");
    let c = "coordination.k8s.io";
    assert!(allowed(&client, &leader, "get", c, "leases", lease).await);
    assert!(allowed(&client, &leader, "update", c, "leases", lease).await);
    assert!(
        !allowed(
            &client,
            &leader,
            "update",
            c,
            "leases",
            Some("another-lease")
        )
        .await,
        "pinned to its own Lease"
    );
    assert!(!allowed(&client, &leader, "delete", c, "leases", lease).await);
    assert!(
        !allowed(
            &client,
            &leader,
            "patch",
            "",
            "pods",
            Some("any-leader-pod")
        )
        .await,
        "a store Pod may not relabel Pods"
    );
    assert!(allowed(&client, &member, "get", c, "leases", lease).await);
    // The member watches its one Lease (a watch with a metadata.name field selector is
    // authorized by that name), and no other.
    assert!(allowed(&client, &member, "watch", c, "leases", lease).await);
    assert!(allowed(&client, &member, "list", c, "leases", lease).await);
    assert!(
        !allowed(
            &client,
            &member,
            "watch",
            c,
            "leases",
            Some("another-lease")
        )
        .await,
        "pinned to its own Lease"
    );
    assert!(
        !allowed(&client, &member, "update", c, "leases", lease).await,
        "members cannot take the Lease"
    );
    assert!(!allowed(&client, &member, "patch", "", "pods", Some("x")).await);
}
