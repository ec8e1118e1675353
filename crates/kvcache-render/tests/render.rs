//! One snapshot per input file: the whole object set the operator would create.

use kvcache_api::Settings;
use kvcache_api::manifest;
use kvcache_render::plan::resolve::{DEFAULT_NAMESPACE, Environment, render_all};

/// The objects the operator would create from the manifest at `path`, as the API server's
/// YAML documents.
fn render_file(path: &std::path::Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).expect("input");
    render_text(&path.display().to_string(), &text)
}

/// The objects the operator would create from the manifest `text` (read from `name`).
fn render_text(name: &str, text: &str) -> Vec<serde_yaml::Value> {
    let objects: Vec<_> = manifest::parse(name, text)
        .expect("input parses")
        .into_iter()
        .map(|m| m.object)
        .collect();
    let settings = Settings::default();
    let env = Environment {
        namespace: DEFAULT_NAMESPACE,
        settings: &settings,
    };
    render_all(&objects, &env).unwrap_or_else(|e| {
        panic!(
            "{name}: {:?}",
            e.iter().map(ToString::to_string).collect::<Vec<_>>()
        )
    })
}

#[test]
fn rendered_object_sets() {
    insta::glob!("inputs/*.yaml", |path| {
        let docs = render_file(path);
        let yaml: Vec<String> = docs
            .iter()
            .map(|d| serde_yaml::to_string(d).expect("yaml"))
            .collect();
        insta::assert_snapshot!(yaml.join("---\n"));
    });
}

#[test]
fn a_groups_extra_env_replaces_the_rendered_rpc_timeout_and_is_listed_once() {
    let docs = render_file(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/inputs/two-groups.yaml"
    )));
    let timeouts = |component: &str| -> Vec<String> {
        let set = docs
            .iter()
            .find(|d| {
                d["kind"] == "DaemonSet"
                    && d["metadata"]["labels"]["app.kubernetes.io/component"] == component
            })
            .unwrap_or_else(|| panic!("the {component} DaemonSet"));
        set["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .filter(|e| e["name"] == "MC_RPC_TIMEOUT_MS")
            .map(|e| e["value"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(timeouts("member-0"), vec!["2000".to_owned()]);
    assert_eq!(timeouts("member-1"), vec!["5000".to_owned()]);
}

/// The rendered documents of `kind` in `docs`, parsed.
fn of_kind<K: serde::de::DeserializeOwned>(docs: &[serde_yaml::Value], kind: &str) -> Vec<K> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| serde_yaml::from_value(d.clone()).expect("a rendered object parses"))
        .collect()
}

#[test]
fn each_role_is_closed_but_for_the_ports_its_container_declares_unless_unmanaged() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/inputs/model-own-port.yaml"
    ));
    let docs = render_file(path);
    let deployments: Vec<Deployment> = of_kind(&docs, "Deployment");
    let policies: Vec<NetworkPolicy> = of_kind(&docs, "NetworkPolicy");
    assert_eq!(policies.len(), deployments.len(), "one policy per role");
    for d in &deployments {
        let template = d.spec.as_ref().expect("a spec").template.clone();
        let pod_labels = template
            .metadata
            .and_then(|m| m.labels)
            .expect("Pod labels");
        let policy = policies
            .iter()
            .find(|p| p.metadata.name == d.metadata.name)
            .expect("the role's policy, named as its Deployment");
        let spec = policy.spec.clone().expect("a spec");
        let selects = spec
            .pod_selector
            .and_then(|s| s.match_labels)
            .expect("a selector");
        assert!(
            selects.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "the policy selects the role's Pods: {selects:?} of {pod_labels:?}"
        );
        let declared: Vec<(i32, String)> = template
            .spec
            .expect("a Pod spec")
            .containers
            .iter()
            .flat_map(|c| c.ports.clone().unwrap_or_default())
            .map(|p| (p.container_port, p.protocol.unwrap_or_else(|| "TCP".into())))
            .collect();
        // The role serves where its own `--port=9000` says: the port declared and opened.
        assert_eq!(declared, vec![(9000, "TCP".to_owned())]);
        let ingress = spec.ingress.expect("ingress rules");
        let open: Vec<(i32, String)> = ingress
            .iter()
            .filter(|r| r.from.is_none())
            .flat_map(|r| r.ports.clone().unwrap_or_default())
            .map(|p| match p.port {
                Some(IntOrString::Int(n)) => (n, p.protocol.unwrap_or_default()),
                other => panic!("a numbered port, not {other:?}"),
            })
            .collect();
        assert_eq!(open, declared, "from any source, only the declared ports");
        assert!(
            ingress
                .iter()
                .all(|r| r.from.is_none() == r.ports.is_some()),
            "no rule opens every port to every source: {ingress:?}"
        );
    }

    // `Unmanaged`: no policy at all.
    let text = std::fs::read_to_string(path)
        .expect("input")
        .replace("  roles:\n", "  networkPolicy: Unmanaged\n  roles:\n");
    let docs = render_text("unmanaged.yaml", &text);
    assert!(of_kind::<NetworkPolicy>(&docs, "NetworkPolicy").is_empty());
    assert_eq!(of_kind::<Deployment>(&docs, "Deployment").len(), 1);
}
