//! The API server's audit log read for what the operator's account did: which of its grants
//! (the installation's ClusterRole and Role, `kvcache_render::install`) it used and which call
//! RBAC refused. The harness's API servers log every call of that account (see
//! [`crate::cluster`]); `tests/tests/rbac_audit.rs` reads the logs the end-to-end binaries
//! leave and fails on a grant no run used and on any refused call.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::rbac::v1::PolicyRule;

/// The account the installation runs the operator under (`kvcache_render::install`), in the
/// namespace every end-to-end binary installs it into.
pub const OPERATOR_ACCOUNT: &str = "system:serviceaccount:gpustack-system:kvcache-operator";

/// Which role of the installation allowed a call (the audit's `authorization.k8s.io/reason`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RoleName {
    /// A ClusterRole, through a ClusterRoleBinding or a RoleBinding.
    Cluster(String),
    /// A Role in `namespace`.
    Namespaced { namespace: String, name: String },
}

impl fmt::Display for RoleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoleName::Cluster(name) => write!(f, "ClusterRole {name}"),
            RoleName::Namespaced { namespace, name } => write!(f, "Role {namespace}/{name}"),
        }
    }
}

/// An API group as a reader names it (`core` for the unnamed core group).
fn group_name(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

/// One request of the account, as the audit log records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Call {
    pub verb: String,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource, with its subresource after a `/` (`pods/eviction`).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The role whose binding allowed it (`None`: refused, or not an RBAC decision).
    pub allowed_by: Option<RoleName>,
    /// Whether the authorizer refused it.
    pub refused: bool,
    /// A server-side apply that made the object (a `patch` answered 201): the API server asked
    /// the authorizer for `create` too, which the log does not show as a request of its own.
    pub created: bool,
    /// When the API server received it (RFC 3339, as the log writes it).
    pub at: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = group_name(&self.group);
        write!(f, "{} {}/{}", self.verb, group, self.resource)?;
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, " {ns}/{name}"),
            (Some(ns), None) => write!(f, " in {ns}"),
            (None, Some(name)) => write!(f, " {name}"),
            (None, None) => Ok(()),
        }
    }
}

/// The role named in an RBAC reason: `RBAC: allowed by ClusterRoleBinding "b" of ClusterRole
/// "r" to ...` or `RBAC: allowed by RoleBinding "b/ns" of Role "r" to ...` (a RoleBinding of a
/// ClusterRole names the ClusterRole).
fn allowed_by(reason: &str) -> Option<RoleName> {
    let rest = reason.strip_prefix("RBAC: allowed by ")?;
    let (binding, rest) = rest.split_once(" of ")?;
    let quoted = |s: &str| -> Option<String> {
        let s = s.trim().strip_prefix('"')?;
        Some(s.split_once('"')?.0.to_owned())
    };
    if let Some(role) = rest.strip_prefix("ClusterRole ") {
        return Some(RoleName::Cluster(quoted(role)?));
    }
    let role = rest.strip_prefix("Role ")?;
    // `RoleBinding "name/namespace"`: the Role is in the binding's namespace.
    let binding = quoted(binding.strip_prefix("RoleBinding ")?)?;
    let (_, namespace) = binding.split_once('/')?;
    Some(RoleName::Namespaced {
        namespace: namespace.to_owned(),
        name: quoted(role)?,
    })
}

/// The calls of `user` in an audit log's JSON lines, each request once (a watch is logged when
/// its response starts and when it ends). A line that is not an event is an error naming it
/// and `source` (the log's path).
pub fn calls(text: &str, source: &str, user: &str) -> crate::Result<Vec<Call>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: serde_json::Value =
            serde_json::from_str(line).map_err(|err| crate::Error::Invalid {
                path: source.to_owned(),
                what: "audit log (JSON lines)",
                reason: format!("line {}: {err}", i + 1),
            })?;
        if e["user"]["username"] != user {
            continue;
        }
        let id = e["auditID"].as_str().unwrap_or_default().to_owned();
        if !seen.insert(id) {
            continue;
        }
        let Some(r) = e["objectRef"].as_object() else {
            // A non-resource request (`/version`, discovery): no grant of the roles covers it.
            continue;
        };
        let text = |k: &str| r.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let resource = match (text("resource"), text("subresource")) {
            (Some(res), Some(sub)) => format!("{res}/{sub}"),
            (Some(res), None) => res,
            (None, _) => continue,
        };
        let annotations = &e["annotations"];
        out.push(Call {
            verb: e["verb"].as_str().unwrap_or_default().to_owned(),
            group: text("apiGroup").unwrap_or_default(),
            resource,
            namespace: text("namespace"),
            name: text("name"),
            allowed_by: annotations["authorization.k8s.io/reason"]
                .as_str()
                .and_then(allowed_by),
            refused: annotations["authorization.k8s.io/decision"] == "forbid",
            created: e["verb"] == "patch" && e["responseStatus"]["code"] == 201,
            at: e["requestReceivedTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        });
    }
    Ok(out)
}

/// A time when the installation's rights were gone: from the deletion of one of its roles or
/// role bindings (an uninstall) until every one deleted was written again (`until`: `None` if
/// never).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub from: String,
    pub until: Option<String>,
}

/// When the installation's roles and role bindings (`name`, cluster-wide or in any namespace)
/// were gone, from any account's writes in the log: a window opens at the first deletion of
/// one of them (an uninstall removes the ClusterRole and the bindings in its own order) and
/// closes once each deleted one is written again. Lines that do not parse were reported by
/// [`calls`].
pub fn removals(text: &str, name: &str) -> Vec<Removal> {
    let mut out: Vec<Removal> = Vec::new();
    let mut gone: std::collections::BTreeSet<(String, String)> = Default::default();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let r = &e["objectRef"];
        let rbac = matches!(
            r["resource"].as_str(),
            Some("clusterroles" | "roles" | "clusterrolebindings" | "rolebindings")
        );
        let ok = e["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| c < 300);
        if !rbac || r["name"] != name || !ok || e["stage"] != "ResponseComplete" {
            continue;
        }
        let at = e["requestReceivedTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let which = (
            r["resource"].as_str().unwrap_or_default().to_owned(),
            r["namespace"].as_str().unwrap_or_default().to_owned(),
        );
        match e["verb"].as_str() {
            Some("delete") => {
                if gone.is_empty() {
                    out.push(Removal {
                        from: at,
                        until: None,
                    });
                }
                gone.insert(which);
            }
            Some("create" | "update" | "patch") => {
                if gone.remove(&which)
                    && gone.is_empty()
                    && let Some(w) = out.last_mut()
                {
                    w.until = Some(at);
                }
            }
            _ => {}
        }
    }
    out
}

/// One verb on one resource granted by one role.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub role: RoleName,
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = group_name(&self.group);
        write!(
            f,
            "{}: {} {}/{}",
            self.role, self.verb, group, self.resource
        )
    }
}

/// Every verb on every resource that `rules` of `role` grant.
pub fn grants(role: &RoleName, rules: &[PolicyRule]) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.push(Grant {
                        role: role.clone(),
                        group: group.clone(),
                        resource: resource.clone(),
                        verb: verb.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The grants no call used: a call uses a grant when the role that allowed it grants its verb
/// on its resource (an apply that made its object uses `create` too). A Role's grant that the
/// ClusterRole also holds is never used (RBAC finds the ClusterRole's first), so it shows here
/// too.
pub fn unused<'g>(grants: &'g [Grant], calls: &[Call]) -> Vec<&'g Grant> {
    let mut used: BTreeSet<(&RoleName, &str, &str, &str)> = BTreeSet::new();
    for c in calls {
        let Some(role) = c.allowed_by.as_ref() else {
            continue;
        };
        used.insert((role, &c.group, &c.resource, &c.verb));
        if c.created {
            used.insert((role, &c.group, &c.resource, "create"));
        }
    }
    grants
        .iter()
        .filter(|g| {
            !used.contains(&(
                &g.role,
                g.group.as_str(),
                g.resource.as_str(),
                g.verb.as_str(),
            ))
        })
        .collect()
}

/// The calls RBAC refused, each kind of call once, but for those made while the installation's
/// rights were removed (`removals`: the Pods of an uninstalled operator still running for
/// moments).
pub fn refused<'c>(calls: &'c [Call], removals: &[Removal]) -> Vec<&'c Call> {
    let mut seen = BTreeSet::new();
    let removed = |at: &str| {
        removals
            .iter()
            .any(|w| w.from.as_str() <= at && w.until.as_deref().is_none_or(|u| at < u))
    };
    calls
        .iter()
        .filter(|c| c.refused && !removed(&c.at))
        .filter(|c| seen.insert((&c.verb, &c.group, &c.resource, &c.namespace)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OP: &str = OPERATOR_ACCOUNT;

    fn line(id: &str, user: &str, verb: &str, object: &str, annotations: &str) -> String {
        format!(
            r#"{{"kind":"Event","auditID":"{id}","stage":"ResponseComplete","verb":"{verb}","user":{{"username":"{user}"}},"objectRef":{object},"responseStatus":{{"code":200}},"annotations":{annotations}}}"#
        )
    }

    const BY_ROLE: &str = r#"{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC: allowed by RoleBinding \"kvcache-operator/gpustack-system\" of Role \"kvcache-operator\" to ServiceAccount \"kvcache-operator/gpustack-system\""}"#;
    const BY_CLUSTER_ROLE: &str = r#"{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC: allowed by ClusterRoleBinding \"kvcache-operator\" of ClusterRole \"kvcache-operator\" to ServiceAccount \"kvcache-operator/gpustack-system\""}"#;
    const FORBID: &str =
        r#"{"authorization.k8s.io/decision":"forbid","authorization.k8s.io/reason":""}"#;

    fn role() -> RoleName {
        RoleName::Namespaced {
            namespace: "gpustack-system".into(),
            name: "kvcache-operator".into(),
        }
    }

    fn cluster_role() -> RoleName {
        RoleName::Cluster("kvcache-operator".into())
    }

    #[test]
    fn reads_the_role_that_allowed_each_call_once_per_request() {
        let log = [
            line(
                "1",
                OP,
                "watch",
                r#"{"resource":"leases","namespace":"gpustack-system","apiGroup":"coordination.k8s.io"}"#,
                BY_ROLE,
            ),
            // The same watch, logged again when it ends.
            line(
                "1",
                OP,
                "watch",
                r#"{"resource":"leases","namespace":"gpustack-system","apiGroup":"coordination.k8s.io"}"#,
                BY_ROLE,
            ),
            line(
                "2",
                OP,
                "patch",
                r#"{"resource":"kvcachebackends","subresource":"status","name":"b","apiGroup":"worker.gpustack.ai"}"#,
                BY_CLUSTER_ROLE,
            ),
            line(
                "3",
                "system:serviceaccount:gpustack-system:other",
                "get",
                r#"{"resource":"pods"}"#,
                BY_ROLE,
            ),
            line("4", OP, "get", r#"{"resource":"nodes","name":"n"}"#, FORBID),
        ]
        .join("\n");
        let calls = calls(&log, "audit.log", OP).expect("readable");
        assert_eq!(calls.len(), 3, "{calls:#?}");
        assert_eq!(calls[0].allowed_by, Some(role()));
        assert_eq!(calls[1].resource, "kvcachebackends/status");
        assert_eq!(calls[1].allowed_by, Some(cluster_role()));
        assert!(calls[2].refused && calls[2].allowed_by.is_none());
        assert_eq!(refused(&calls, &[]), vec![&calls[2]]);
        assert_eq!(calls[2].to_string(), "get core/nodes n");
    }

    #[test]
    fn a_call_refused_while_the_installation_was_removed_is_the_uninstalls() {
        let event = |at: &str, user: &str, verb: &str, object: &str, code: u16| {
            format!(
                r#"{{"auditID":"{at}{verb}","stage":"ResponseComplete","requestReceivedTimestamp":"{at}","verb":"{verb}","user":{{"username":"{user}"}},"objectRef":{object},"responseStatus":{{"code":{code}}},"annotations":{FORBID}}}"#
            )
        };
        let binding = r#"{"resource":"clusterrolebindings","name":"kvcache-operator","apiGroup":"rbac.authorization.k8s.io"}"#;
        let role = r#"{"resource":"clusterroles","name":"kvcache-operator","apiGroup":"rbac.authorization.k8s.io"}"#;
        let secret = r#"{"resource":"secrets","namespace":"gpustack-system","name":"kvcache-operator-webhook-tls"}"#;
        // The ClusterRole goes first and comes back first: the window spans both.
        let log = [
            event("2026-12-04T10:00:00.000000Z", OP, "get", secret, 403),
            event("2026-12-04T10:00:59.000000Z", "admin", "delete", role, 200),
            event("2026-12-04T10:00:59.500000Z", OP, "get", secret, 403),
            event(
                "2026-12-04T10:01:00.000000Z",
                "admin",
                "delete",
                binding,
                200,
            ),
            event("2026-12-04T10:01:01.000000Z", OP, "get", secret, 403),
            event("2026-12-04T10:01:59.000000Z", "admin", "create", role, 201),
            event("2026-12-04T10:01:59.500000Z", OP, "get", secret, 403),
            event(
                "2026-12-04T10:02:00.000000Z",
                "admin",
                "create",
                binding,
                201,
            ),
            event("2026-12-04T10:03:00.000000Z", OP, "list", secret, 403),
        ]
        .join("\n");
        let removed = removals(&log, "kvcache-operator");
        assert_eq!(
            removed,
            [Removal {
                from: "2026-12-04T10:00:59.000000Z".into(),
                until: Some("2026-12-04T10:02:00.000000Z".into())
            }]
        );
        let calls = calls(&log, "audit.log", OP).expect("readable");
        assert_eq!(calls.len(), 5);
        // Before the uninstall and after the reinstall: refused; during it: the uninstall's.
        let verbs: Vec<&str> = refused(&calls, &removed)
            .iter()
            .map(|c| c.verb.as_str())
            .collect();
        assert_eq!(verbs, ["get", "list"]);
        assert_eq!(
            refused(&calls, &[]).len(),
            2,
            "one get and one list, each once"
        );
    }

    #[test]
    fn a_line_that_is_not_json_is_an_error_not_a_skip() {
        assert!(calls("{\"kind\":\"Event\"}\nnot json", "audit.log", OP).is_err());
    }

    #[test]
    fn a_grant_is_used_only_by_a_call_its_own_role_allowed() {
        let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
            api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
            resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
            verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        let mut all = grants(&cluster_role(), &[rule(&[""], &["pods"], &["get", "list"])]);
        all.extend(grants(
            &role(),
            &[rule(&[""], &["pods"], &["list", "delete"])],
        ));
        assert_eq!(all.len(), 4);
        let call = |verb: &str, by: RoleName| Call {
            verb: verb.into(),
            group: String::new(),
            resource: "pods".into(),
            namespace: Some("gpustack-system".into()),
            name: None,
            allowed_by: Some(by),
            refused: false,
            created: false,
            at: String::new(),
        };
        // The ClusterRole allowed the list: the Role's list (shadowed) and get are unused.
        let calls = [call("list", cluster_role()), call("delete", role())];
        let unused: Vec<String> = unused(&all, &calls).iter().map(|g| g.to_string()).collect();
        assert_eq!(
            unused,
            [
                "ClusterRole kvcache-operator: get core/pods",
                "Role gpustack-system/kvcache-operator: list core/pods",
            ]
        );
    }

    #[test]
    fn an_apply_that_made_its_object_uses_the_create_grant_too() {
        let grant = |verb: &str| Grant {
            role: role(),
            group: String::new(),
            resource: "serviceaccounts".into(),
            verb: verb.into(),
        };
        let all = [grant("create"), grant("patch")];
        let log = |code: u16| {
            format!(
                r#"{{"auditID":"{code}","verb":"patch","user":{{"username":"{OP}"}},"objectRef":{{"resource":"serviceaccounts","namespace":"gpustack-system"}},"responseStatus":{{"code":{code}}},"annotations":{BY_ROLE}}}"#
            )
        };
        // An apply onto an object that exists uses patch alone.
        let applied = calls(&log(200), "audit.log", OP).expect("readable");
        assert_eq!(unused(&all, &applied), vec![&all[0]]);
        // One that made it (201) used create as well.
        let made = calls(&log(201), "audit.log", OP).expect("readable");
        assert!(made[0].created);
        assert!(unused(&all, &made).is_empty());
    }

    #[test]
    fn reads_both_forms_of_the_rbac_reason() {
        assert_eq!(
            allowed_by(
                r#"RBAC: allowed by RoleBinding "rb/ns1" of ClusterRole "view" to ServiceAccount "a/ns1""#
            ),
            Some(RoleName::Cluster("view".into()))
        );
        assert_eq!(
            allowed_by(r#"RBAC: allowed by RoleBinding "rb/ns1" of Role "r" to User "u""#),
            Some(RoleName::Namespaced {
                namespace: "ns1".into(),
                name: "r".into()
            })
        );
        assert_eq!(allowed_by("allowed because it is Tuesday"), None);
    }
}
