//! The CRDs as installed: one snapshot each, and the committed `deploy/crds/` must match.

use std::path::Path;

use kvcache_api::crd;

#[test]
fn crd_snapshots() {
    for c in crd::all() {
        let yaml = crd::to_yaml(&c).expect("CRD serializes");
        insta::assert_snapshot!(c.spec.names.kind.clone(), yaml);
    }
}

#[test]
fn committed_crds_are_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    for c in crd::all() {
        let path = dir.join(crd::file_name(&c));
        let want = crd::to_yaml(&c).expect("CRD serializes");
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is stale or missing: run `cargo xtask crds` and commit the result",
            path.display()
        );
    }
}

#[test]
fn every_refused_flag_family_has_its_rule() {
    let yaml = crd::to_yaml(&<kvcache_api::KVCacheBackend as kube::CustomResourceExt>::crd())
        .expect("CRD serializes");
    for family in kvcache_api::rules::REFUSED_LEADER_FLAGS {
        for key in family.keys {
            assert!(yaml.contains(key), "no CEL rule mentions {key}");
        }
    }
}

#[test]
fn names_scopes_and_columns() {
    let all = crd::all();
    let find = |kind: &str| {
        all.iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("{kind} CRD"))
    };
    let columns = |kind: &str| -> Vec<String> {
        find(kind).spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.to_uppercase())
            .collect()
    };
    assert_eq!(find("KVCacheBackend").spec.scope, "Cluster");
    assert_eq!(find("KVCachePool").spec.scope, "Cluster");
    assert_eq!(find("KVCachePoolBinding").spec.scope, "Namespaced");
    assert_eq!(find("ModelDeployment").spec.scope, "Namespaced");
    assert_eq!(find("InstanceType").spec.scope, "Cluster");
    assert_eq!(
        find("KVCacheBackend").spec.names.short_names,
        Some(vec!["kvcb".to_string()])
    );
    assert_eq!(
        find("ModelDeployment").spec.names.short_names,
        Some(vec!["md".to_string()])
    );
    // NAME is implicit in kubectl; AGE is the creation timestamp column.
    assert_eq!(
        columns("KVCacheBackend"),
        ["TYPE", "TENANCY", "PHASE", "ENDPOINT", "CAPACITY"]
    );
    assert_eq!(
        columns("KVCachePoolBinding"),
        [
            "POOL",
            "DOMAIN",
            "EFFECTIVE",
            "USAGE",
            "HIT RATIO",
            "PHASE",
            "AGE"
        ]
    );
}

/// Every description in a schema, with its path.
fn descriptions(path: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    let Some(map) = v.as_object() else { return };
    if let Some(d) = map.get("description").and_then(|d| d.as_str()) {
        out.push((path.to_owned(), d.to_owned()));
    }
    if let Some(props) = map.get("properties").and_then(|p| p.as_object()) {
        for (k, child) in props {
            descriptions(&format!("{path}.{k}"), child, out);
        }
    }
    if let Some(items) = map.get("items") {
        if map.contains_key("description") {
            assert!(
                items.get("description").is_none(),
                "{path}: the list and its items both carry a description, so kubectl explain runs them together"
            );
        }
        descriptions(&format!("{path}[]"), items, out);
    }
    if let Some(extra) = map.get("additionalProperties") {
        descriptions(&format!("{path}{{}}"), extra, out);
    }
}

#[test]
fn explain_text_reads_as_paragraphs() {
    let mut checked = 0;
    for c in crd::all() {
        let json = serde_json::to_value(&c).expect("json");
        let mut all = Vec::new();
        descriptions(
            &c.spec.names.kind.to_lowercase(),
            &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            &mut all,
        );
        for (path, text) in &all {
            checked += 1;
            let mut fenced = false;
            for (i, line) in text.split('\n').enumerate() {
                if line.trim_start().starts_with("```") {
                    fenced = !fenced;
                }
                let next = text.split('\n').nth(i + 1);
                // A line break is a paragraph break, a list item, or inside a fenced block.
                let ok = fenced
                    || line.is_empty()
                    || next.is_none_or(|n| {
                        n.is_empty()
                            || n.starts_with("- ")
                            || n.starts_with("* ")
                            || n.starts_with("```")
                            || n.split_once(". ").is_some_and(|(d, _)| {
                                !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                            })
                    });
                assert!(ok, "{path}: a line break inside a paragraph: {text:?}");
            }
        }
    }
    assert!(checked > 100, "descriptions were found ({checked})");
    // The case a user met first.
    let binding = crd::all()
        .into_iter()
        .find(|c| c.spec.names.kind == "KVCachePoolBinding")
        .expect("binding CRD");
    let json = serde_json::to_value(&binding).expect("json");
    let text = json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["domain"]["properties"]["name"]["description"]
        .as_str()
        .expect("a description");
    assert!(!text.contains('\n'), "{text:?}");
}
