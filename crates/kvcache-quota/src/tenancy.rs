//! Tenancy: which namespaces share a backend's store (docs/isolation.md#tenancy).
//!
//! The store has no authentication: a process that reaches it names its tenant itself
//! (`MOONCAKE_TENANT_ID`), so every namespace bound to one backend can read, remove or pre-plant
//! every other's blocks. A Binding stays the authorization point: one that brings a further
//! namespace to a shared backend is admitted with a warning saying so, and a backend declared
//! `spec.tenancy: {mode: Dedicated, namespace: N}` admits Bindings of `N` alone.

use std::collections::BTreeSet;
use std::fmt;

use kvcache_api::KVCacheBackend;

/// How many namespaces (or Bindings) a warning or refusal names; past it, "and others". The
/// admission webhook hands the judgement one Binding of at most `NAMED + 1` other namespaces,
/// so a request costs the same however many namespaces share the backend.
pub const NAMED: usize = 5;

/// A Binding refused because its pool's backend is dedicated to another namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedicatedElsewhere {
    /// Name of the KVCacheBackend.
    pub backend: String,
    /// The pool the Binding names, which uses that backend.
    pub pool: String,
    /// The namespace `spec.tenancy` admits.
    pub admits: String,
    /// The refused Binding's namespace.
    pub namespace: String,
}

impl fmt::Display for DedicatedElsewhere {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KVCachePool {} uses KVCacheBackend {}, whose spec.tenancy (mode: Dedicated) admits namespace {} only; bind namespace {} to a pool on another backend, or change that backend's spec.tenancy",
            self.pool, self.backend, self.admits, self.namespace
        )
    }
}

/// `names` sorted, at most [`NAMED`] of them, then "and others" when there were more.
fn listed<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: BTreeSet<&str> = names.into_iter().collect();
    let mut out: Vec<&str> = names.iter().copied().take(NAMED).collect();
    if names.len() > NAMED {
        out.push("and others");
    }
    out.join(", ")
}

/// Binding admission (docs/isolation.md#tenancy): a new Binding in `namespace` on a pool of
/// `backend` (`None` while that backend is not known), beside the namespaces that already hold
/// Bindings on it (`on_backend`). Refused when the backend is dedicated to another namespace;
/// a warning when it is shared and the Binding brings a namespace to it that was not there,
/// naming those already there, what each can do to the other and the way to keep apart.
pub fn binding(
    backend: &str,
    known: Option<&KVCacheBackend>,
    pool: &str,
    namespace: &str,
    on_backend: &BTreeSet<String>,
) -> Result<Option<String>, DedicatedElsewhere> {
    if let Some(admits) = known.and_then(|b| b.spec.tenancy.dedicated_to()) {
        if admits == namespace {
            return Ok(None);
        }
        return Err(DedicatedElsewhere {
            backend: backend.to_owned(),
            pool: pool.to_owned(),
            admits: admits.to_owned(),
            namespace: namespace.to_owned(),
        });
    }
    if on_backend.is_empty() || on_backend.contains(namespace) {
        return Ok(None);
    }
    Ok(Some(format!(
        "namespace {namespace} will share KVCacheBackend {backend} with namespaces {}: the store has no authentication, so a Pod of any of them can set MOONCAKE_TENANT_ID to another's spec.domain.name and read, remove or pre-plant its blocks, and can reach the members' transfer ports; to keep {namespace} apart, bind it to a backend of its own with spec.tenancy: {{mode: Dedicated, namespace: {namespace}}}",
        listed(on_backend.iter().map(String::as_str))
    )))
}

/// A backend refused `Dedicated` tenancy because other namespaces' Bindings use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundElsewhere {
    /// The namespace `spec.tenancy` would admit.
    pub admits: String,
    /// `namespace/name` of Bindings of other namespaces on the backend.
    pub bindings: Vec<String>,
}

impl fmt::Display for BoundElsewhere {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mode: Dedicated would admit namespace {} only, but KVCachePoolBindings of other namespaces use this backend ({}); delete them first (each release frees its tenant), or keep mode: Shared",
            self.admits,
            listed(self.bindings.iter().map(String::as_str))
        )
    }
}

/// Backend admission (docs/isolation.md#tenancy): a backend declared, or changed to,
/// `Dedicated` to `admits` while Bindings of other namespaces (`bindings`: each Binding on the
/// backend as `namespace/name`) use it is refused, naming them. Bindings of `admits` itself and
/// a shared backend pass. The webhook judges it against its caches: a Binding created in the
/// same instant can pass both checks.
pub fn dedicate(admits: Option<&str>, bindings: &[String]) -> Result<(), BoundElsewhere> {
    let Some(admits) = admits else {
        return Ok(());
    };
    let elsewhere: Vec<String> = bindings
        .iter()
        .filter(|b| b.split_once('/').is_none_or(|(ns, _)| ns != admits))
        .cloned()
        .collect();
    if elsewhere.is_empty() {
        return Ok(());
    }
    Err(BoundElsewhere {
        admits: admits.to_owned(),
        bindings: elsewhere,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(tenancy: serde_json::Value) -> KVCacheBackend {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "dram"},
            "spec": {"tenancy": tenancy, "connection": {"external": {"endpoints": [
                {"name": "Client", "address": "m:50051"}, {"name": "Admin", "address": "m:9003"}]}}}
        }))
        .expect("backend")
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_second_namespace_on_a_shared_backend_is_warned_naming_those_already_there() {
        let shared = backend(serde_json::json!({"mode": "Shared"}));
        let warning = binding("dram", Some(&shared), "p", "team-b", &set(&["team-a"]))
            .expect("admitted")
            .expect("a warning");
        assert!(
            warning.starts_with(
                "namespace team-b will share KVCacheBackend dram with namespaces team-a: "
            ) && warning.contains("MOONCAKE_TENANT_ID")
                && warning.contains("read, remove or pre-plant")
                && warning.contains("transfer ports")
                && warning.contains("spec.tenancy: {mode: Dedicated, namespace: team-b}"),
            "{warning}"
        );
        assert!(!warning.contains('\n'), "one line: {warning}");
        // The backend not known yet: still shared as far as anyone knows.
        assert!(
            binding("dram", None, "p", "team-b", &set(&["team-a"]))
                .expect("admitted")
                .is_some()
        );
    }

    #[test]
    fn one_namespace_alone_or_again_on_a_shared_backend_is_not_warned() {
        let shared = backend(serde_json::json!({}));
        assert_eq!(
            binding("dram", Some(&shared), "p", "team-a", &set(&[])),
            Ok(None)
        );
        // A second Binding of a namespace already there changes nobody's reach.
        assert_eq!(
            binding(
                "dram",
                Some(&shared),
                "p",
                "team-a",
                &set(&["team-a", "team-b"])
            ),
            Ok(None)
        );
    }

    #[test]
    fn past_five_namespaces_the_warning_names_five_and_others() {
        let on = set(&["n1", "n2", "n3", "n4", "n5", "n6"]);
        let warning = binding("dram", None, "p", "new", &on)
            .expect("admitted")
            .expect("a warning");
        assert!(
            warning.contains("with namespaces n1, n2, n3, n4, n5, and others:"),
            "{warning}"
        );
        let five = set(&["n1", "n2", "n3", "n4", "n5"]);
        let warning = binding("dram", None, "p", "new", &five)
            .expect("admitted")
            .expect("a warning");
        assert!(
            warning.contains("with namespaces n1, n2, n3, n4, n5:"),
            "{warning}"
        );
    }

    #[test]
    fn a_dedicated_backend_refuses_another_namespace_naming_the_field_and_admits_its_own() {
        let dedicated = backend(serde_json::json!({"mode": "Dedicated", "namespace": "team-a"}));
        let refused = binding("dram", Some(&dedicated), "p", "team-b", &set(&[]))
            .expect_err("another namespace");
        let text = refused.to_string();
        assert!(
            text.contains("KVCacheBackend dram, whose spec.tenancy (mode: Dedicated) admits namespace team-a only")
                && text.contains("bind namespace team-b to a pool on another backend"),
            "{text}"
        );
        // Its own namespace: admitted, and no warning, even beside a raced Binding elsewhere.
        assert_eq!(
            binding("dram", Some(&dedicated), "p", "team-a", &set(&["team-b"])),
            Ok(None)
        );
    }

    #[test]
    fn dedicating_a_backend_others_use_is_refused_naming_their_bindings() {
        let bindings = ["team-a/cache".to_owned(), "team-b/cache".to_owned()];
        let refused = dedicate(Some("team-a"), &bindings).expect_err("team-b uses it");
        assert_eq!(refused.bindings, ["team-b/cache"]);
        assert!(
            refused
                .to_string()
                .contains("admit namespace team-a only, but KVCachePoolBindings of other namespaces use this backend (team-b/cache)"),
            "{refused}"
        );
        assert_eq!(dedicate(Some("team-a"), &bindings[..1]), Ok(()));
        assert_eq!(dedicate(Some("team-a"), &[]), Ok(()));
        assert_eq!(dedicate(None, &bindings), Ok(()));
    }
}
