//! One snapshot per input file: the whole object set the operator would create.

use kvcache_api::Settings;
use kvcache_api::manifest;
use kvcache_render::resolve::{DEFAULT_NAMESPACE, Environment, render_all};

#[test]
fn rendered_object_sets() {
    insta::glob!("inputs/*.yaml", |path| {
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
        let docs = render_all(&objects, &env).unwrap_or_else(|e| {
            panic!(
                "{}: {:?}",
                path.display(),
                e.iter().map(ToString::to_string).collect::<Vec<_>>()
            )
        });
        let yaml: Vec<String> = docs
            .iter()
            .map(|d| serde_yaml::to_string(d).expect("yaml"))
            .collect();
        insta::assert_snapshot!(yaml.join("---\n"));
    });
}
