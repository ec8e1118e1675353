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
        ["TYPE", "PHASE", "ENDPOINT", "CAPACITY"]
    );
    assert_eq!(
        columns("KVCachePoolBinding"),
        ["POOL", "DOMAIN", "EFFECTIVE", "USAGE", "PHASE", "AGE"]
    );
}
