//! One snapshot per input file: the whole object set the operator would create.

use kvcache_api::Settings;
use kvcache_api::manifest;
use kvcache_render::resolve::{DEFAULT_NAMESPACE, Environment, render_all};

/// The objects the operator would create from the manifest at `path`, as the API server's
/// YAML documents.
fn render_file(path: &std::path::Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).expect("input");
    let objects: Vec<_> = manifest::parse(&path.display().to_string(), &text)
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
            "{}: {:?}",
            path.display(),
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
