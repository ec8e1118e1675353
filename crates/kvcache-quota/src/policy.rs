//! The tenant policy document the master reads (`--tenant_quota_connector_type=file`): rendered
//! whole from every Binding of every pool on one backend, or not at all.

use std::collections::BTreeMap;

use kvcache_api::admission::{MAX_QUOTA_BYTES, domain_name_problem};
use serde::{Deserialize, Serialize};

pub use crate::ceiling::BindingCeiling;
use crate::error::Error;

/// Where the master reads the document, in its writable volume.
pub const POLICY_PATH: &str = "/var/lib/mooncake/tenant-quota-policy.yaml";
/// The key of the seed ConfigMap that holds it.
pub const POLICY_KEY: &str = "tenant-quota-policy.yaml";

/// One tenant's line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TenantQuota {
    /// The tenant id (a Binding's domain name).
    pub name: String,
    /// The ceiling, bytes.
    pub quota: u64,
}

/// The document: `version: 1` (a missing version crashes the master) and the tenants, sorted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyDocument {
    /// Always 1.
    pub version: u32,
    /// Sorted by name; empty is valid (a pool with no Bindings yet).
    pub tenants: Vec<TenantQuota>,
}

impl PolicyDocument {
    /// A document with no tenants (what a multi-tenant leader starts with before any pool).
    pub fn empty() -> Self {
        PolicyDocument {
            version: 1,
            tenants: Vec::new(),
        }
    }

    /// The YAML the master reads. Deterministic: the same tenants give the same bytes.
    pub fn to_yaml(&self) -> String {
        let mut out = format!("version: {}\n", self.version);
        if self.tenants.is_empty() {
            out.push_str("tenants: []\n");
        } else {
            out.push_str("tenants:\n");
            for t in &self.tenants {
                // Names are DNS labels (validated), so they need no quoting.
                out.push_str(&format!("  - name: {}\n    quota: {}\n", t.name, t.quota));
            }
        }
        out
    }

    /// Reads a document back (the master's own file, say).
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        serde_yaml::from_str(text).map_err(|e| Error::Unreadable {
            context: "tenant policy document".into(),
            message: e.to_string(),
        })
    }
}

/// Renders the document for `backend` from the Bindings of every pool on it.
///
/// Bindings that raced onto one tenant: the one whose `namespace/name` sorts first sets the
/// ceiling (so the result does not depend on input order); the race itself is reported through
/// `DomainExclusive`. Any entry the master would refuse refuses the whole render, so the previous
/// document stays in force; the error names every offending Binding.
pub fn render(backend: &str, bindings: &[BindingCeiling]) -> Result<PolicyDocument, Error> {
    let mut problems = Vec::new();
    let mut by_tenant: BTreeMap<&str, &BindingCeiling> = BTreeMap::new();
    for b in bindings {
        if let Some(problem) = tenant_problem(&b.tenant) {
            problems.push(format!(
                "Binding {} domain {:?} {problem}",
                b.binding, b.tenant
            ));
            continue;
        }
        if b.ceiling_bytes == 0 || b.ceiling_bytes > MAX_QUOTA_BYTES {
            problems.push(format!(
                "Binding {} ceiling {} bytes is outside 1..=9223372036854775807 (the master refuses it)",
                b.binding, b.ceiling_bytes
            ));
            continue;
        }
        by_tenant
            .entry(b.tenant.as_str())
            .and_modify(|held| {
                if b.binding < held.binding {
                    *held = b;
                }
            })
            .or_insert(b);
    }
    if !problems.is_empty() {
        problems.sort();
        return Err(Error::PolicyRefused {
            backend: backend.to_owned(),
            problems,
        });
    }
    Ok(PolicyDocument {
        version: 1,
        tenants: by_tenant
            .into_values()
            .map(|b| TenantQuota {
                name: b.tenant.clone(),
                quota: b.ceiling_bytes,
            })
            .collect(),
    })
}

/// Why the master (or the DNS-1123 label rule) refuses a tenant name.
pub(crate) fn tenant_problem(name: &str) -> Option<&'static str> {
    if name.chars().any(char::is_control) {
        return Some("must not contain control characters");
    }
    domain_name_problem(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(binding: &str, tenant: &str, gib: u64) -> BindingCeiling {
        BindingCeiling {
            binding: binding.into(),
            tenant: tenant.into(),
            ceiling_bytes: gib << 30,
        }
    }

    #[test]
    fn empty_document_is_valid_yaml_with_a_version() {
        let doc = render("b", &[]).expect("renders");
        assert_eq!(doc.to_yaml(), "version: 1\ntenants: []\n");
        assert_eq!(
            PolicyDocument::from_yaml(&doc.to_yaml()).expect("reads back"),
            doc
        );
    }

    #[test]
    fn refused_entries_refuse_the_whole_render() {
        let err = render(
            "mooncake-dram",
            &[
                b("a/ok", "chat", 1),
                b("b/bad", "_system", 1),
                b("c/zero", "z", 0),
            ],
        )
        .expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("b/bad") && text.contains("'_'"), "{text}");
        assert!(text.contains("c/zero"), "{text}");
        assert!(text.contains("mooncake-dram"), "{text}");
    }

    #[test]
    fn raced_duplicates_resolve_by_binding_name() {
        let doc = render("b", &[b("z/late", "chat", 2), b("a/early", "chat", 1)]).expect("renders");
        assert_eq!(
            doc.tenants,
            vec![TenantQuota {
                name: "chat".into(),
                quota: 1 << 30
            }]
        );
    }
}
