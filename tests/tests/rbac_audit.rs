//! The operator's RBAC held against what it did. Every API server of a `cargo xtask test` run
//! logs each call of the installation's account into its own folder under
//! `KVCACHE_AUDIT_DIR` (`kvcache_e2e::cluster`): the installed operator of the install binary
//! and the demo, and the operator that the on-nodes binaries run as that account
//! (`kvcache_e2e::operator`). This reads them all and fails on a grant of the installation's
//! ClusterRole or Role that no call used, and on any call RBAC refused.
//!
//! Ignored in a plain `cargo test`, which may run it before the binaries that write the logs;
//! `cargo xtask test` runs it after the rest of the suite.

use std::path::{Path, PathBuf};

use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kvcache_e2e::audit::{self, Grant, OPERATOR_ACCOUNT, RoleName};
use kvcache_e2e::cluster::ENV_AUDIT_DIR;

/// The audit logs under `dir`, rotated ones included.
fn logs(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![dir.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Every grant of the installation's ClusterRole and Role (`kvcache_render::install`).
fn installation_grants() -> Vec<Grant> {
    let mut grants = Vec::new();
    for doc in kvcache_render::install::operator("gpustack-system", "example.local/operator:1")
        .expect("the installation renders")
    {
        let value = serde_json::to_value(&doc).expect("JSON");
        match doc["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(value).expect("a ClusterRole");
                let name = RoleName::Cluster(role.metadata.name.clone().unwrap_or_default());
                grants.extend(audit::grants(
                    &name,
                    role.rules.as_deref().unwrap_or_default(),
                ));
            }
            Some("Role") => {
                let role: Role = serde_json::from_value(value).expect("a Role");
                let name = RoleName::Namespaced {
                    namespace: role.metadata.namespace.clone().unwrap_or_default(),
                    name: role.metadata.name.clone().unwrap_or_default(),
                };
                grants.extend(audit::grants(
                    &name,
                    role.rules.as_deref().unwrap_or_default(),
                ));
            }
            _ => {}
        }
    }
    grants
}

/// Grants the API server checks without a request of their own, so no audit event shows
/// them: with OwnerReferencesPermissionEnforcement (which the harness's API servers enable, as
/// OpenShift does) an object whose owner reference blocks its owner's deletion may be written
/// only by an account that may update the owner's `finalizers`. A backend owns its store
/// objects and a ModelDeployment its Deployments and Service that way
/// (`kvcache_render::objects::backend`, `kvcache_render::objects::model`); without these grants every such write
/// is refused, which the suite would show.
///
/// And a Role may grant only what its creator holds (RBAC's escalation check, also asked of the
/// authorizer without a request of its own): the electors' Role grants `update` on their Lease,
/// which the operator itself renews by patch (`kvcache_render::objects::backend`).
const CHECKED_NOT_CALLED: &[&str] = &[
    "ClusterRole kvcache-operator: update worker.gpustack.ai/kvcachebackends/finalizers",
    "ClusterRole kvcache-operator: update worker.gpustack.ai/modeldeployments/finalizers",
    "Role gpustack-system/kvcache-operator: update coordination.k8s.io/leases",
];

#[test]
fn every_grant_checked_without_a_call_is_a_grant_of_the_installation() {
    let grants: Vec<String> = installation_grants()
        .iter()
        .map(|g| g.to_string())
        .collect();
    for checked in CHECKED_NOT_CALLED {
        assert!(
            grants.iter().any(|g| g == checked),
            "{checked} is no longer granted: drop it from the list"
        );
    }
}

#[test]
#[ignore = "reads the audit logs of the whole suite; `cargo xtask test` runs it after the rest"]
fn every_grant_of_the_operator_was_used_and_no_call_was_refused() {
    let dir = std::env::var_os(ENV_AUDIT_DIR).unwrap_or_else(|| {
        panic!("{ENV_AUDIT_DIR} is not set: `cargo xtask test` sets it and runs this test last")
    });
    let dir = PathBuf::from(dir);
    let logs = logs(&dir);
    let mut calls = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    for log in &logs {
        let text = std::fs::read_to_string(log).expect("an audit log");
        let these =
            audit::calls(&text, &log.display().to_string(), OPERATOR_ACCOUNT).expect("readable");
        // An uninstall takes the rights before its Pods are gone: their refusals are its own.
        let removals = audit::removals(&text, "kvcache-operator");
        refused.extend(
            audit::refused(&these, &removals)
                .iter()
                .map(|c| format!("{c} ({})", log.display())),
        );
        calls.extend(these);
    }
    assert!(
        !calls.is_empty(),
        "no call of {OPERATOR_ACCOUNT} in the {} audit logs under {}: run the whole suite first (`cargo xtask test`)",
        logs.len(),
        dir.display()
    );
    let grants = installation_grants();
    let unused: Vec<String> = audit::unused(&grants, &calls)
        .iter()
        .map(|g| g.to_string())
        .filter(|g| !CHECKED_NOT_CALLED.contains(&g.as_str()))
        .collect();
    println!(
        "{} calls of {OPERATOR_ACCOUNT} in {} audit logs; {} grants",
        calls.len(),
        logs.len(),
        grants.len()
    );
    assert!(
        refused.is_empty() && unused.is_empty(),
        "RBAC refused these calls of the operator (grant what they need in crates/kvcache-render/src/install/rbac.rs):\n  {}\n\
         and no call used these grants (drop them there, or make an end-to-end test use them):\n  {}",
        refused.join("\n  "),
        unused.join("\n  ")
    );
}
