//! The operator's least-privilege RBAC: its ClusterRole, its Role in its own namespace, and
//! what their bindings name.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role, RoleRef, Subject};

use super::meta::{NAME, WEBHOOK_CA_SECRET, WEBHOOK_SECRET, meta};

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

pub(super) fn role_ref(kind: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: NAME.into(),
    }
}

/// What the operator does with the objects it renders: applies them server-side (`patch`; the
/// API server also asks for `create` when the apply makes the object), reads and watches them,
/// and sweeps those it no longer renders.
const APPLIED: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// The operator's own account, which both role bindings grant.
pub(super) fn subject(namespace: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// Cluster-wide rights: its own kinds, what the injection and admission read, events.
pub(super) fn cluster_role() -> ClusterRole {
    let group = kvcache_api::GROUP;
    ClusterRole {
        metadata: meta(NAME, None),
        rules: Some(vec![
            // Our kinds: cached (list, watch), read live by the webhook (get), the release
            // finalizer added and removed (patch); never created or replaced.
            rule(
                &[group],
                &["kvcachebackends", "kvcachepools", "kvcachepoolbindings"],
                &["get", "list", "watch", "patch"],
            ),
            // A ModelDeployment carries no finalizer of ours: read only.
            rule(&[group], &["modeldeployments"], &["list", "watch"]),
            rule(&[group], &["instancetypes"], &["get", "list", "watch"]),
            // One writer per status, by patch.
            rule(
                &[group],
                &[
                    "kvcachebackends/status",
                    "kvcachepools/status",
                    "kvcachepoolbindings/status",
                    "modeldeployments/status",
                ],
                &["patch"],
            ),
            // What it renders blocks its owner's deletion (a backend's store objects, a
            // ModelDeployment's Deployments and Service): where the API server enforces owner
            // references (OwnerReferencesPermissionEnforcement) that takes `update` on the
            // owner's finalizers.
            rule(
                &[group],
                &["kvcachebackends/finalizers", "modeldeployments/finalizers"],
                &["update"],
            ),
            // A ModelDeployment's engines run in its own namespace, whichever that is: their
            // Deployments and Service are applied, read, swept and watched there (README.md
            // #what-the-operator-may-do).
            rule(&["apps"], &["deployments"], APPLIED),
            // Services are read and swept, never watched.
            rule(
                &[""],
                &["services"],
                &["get", "list", "create", "patch", "delete"],
            ),
            // Who may reach a store (docs/isolation.md), in its own namespace, and a
            // ModelDeployment's engines, in theirs (docs/isolation.md#engine-pods): read, applied
            // and swept, never watched.
            rule(
                &["networking.k8s.io"],
                &["networkpolicies"],
                &["get", "list", "create", "patch", "delete"],
            ),
            // Its engines' Pods (their metrics and readiness) and the store's, listed and
            // watched.
            rule(&[""], &["pods"], &["list", "watch"]),
            // Node maintenance: members on a node leaving are drained first
            // (controllers/backend.rs).
            rule(&[""], &["nodes"], &["list", "watch"]),
            // A ModelDeployment's engine Pods are those of its own Deployments' ReplicaSets
            // (ownership, not labels, chooses the Pods whose metrics it reads): listed.
            rule(&["apps"], &["replicasets"], &["list"]),
            // Events about our objects, where they live (a repeat patches its series).
            rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
            // At start: are the CRDs installed?
            rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &["get"],
            ),
            // Its own two webhook configurations only, to keep their caBundle (the watch
            // names them with a field selector, which resourceNames allows); the
            // ValidatingAdmissionPolicy below lets it change nothing else in them.
            PolicyRule {
                resource_names: Some(vec![NAME.into()]),
                ..rule(
                    &["admissionregistration.k8s.io"],
                    &[
                        "validatingwebhookconfigurations",
                        "mutatingwebhookconfigurations",
                    ],
                    &["get", "list", "watch", "update"],
                )
            },
        ]),
        ..Default::default()
    }
}

/// Rights in its own namespace only: the store workloads and what their Pods are granted (a
/// Role can only grant what its creator holds).
pub(super) fn namespace_role(namespace: &str) -> Role {
    Role {
        metadata: meta(NAME, Some(namespace)),
        rules: Some(vec![
            // Member DaemonSets, and the etcd StatefulSet of a backend with warm failover:
            // applied, watched (their readiness is in the status) and swept.
            rule(
                &["apps"],
                &["daemonsets", "statefulsets"],
                &["list", "watch", "create", "patch", "delete"],
            ),
            // The settings ConfigMap is watched; the tenant policy's is applied and swept.
            rule(
                &[""],
                &["configmaps"],
                &["list", "watch", "create", "patch", "delete"],
            ),
            // The store workloads' disruption budgets: applied and swept, never watched
            // (docs/high-availability.md#disruption-budgets).
            rule(
                &["policy"],
                &["poddisruptionbudgets"],
                &["list", "create", "patch", "delete"],
            ),
            // The elector's account: applied and swept (the store's NetworkPolicies are the
            // ClusterRole's).
            rule(
                &[""],
                &["serviceaccounts"],
                &["list", "create", "patch", "delete"],
            ),
            // Member Pods whose template changed are deleted (DaemonSets are OnDelete), a drain
            // recorded on each first (docs/design.md#member-rollout); a backend's isolation
            // probe Pod is created and deleted once read (docs/isolation.md#enforcement-checked);
            // reading them is the ClusterRole's.
            rule(&[""], &["pods"], &["create", "patch", "delete"]),
            // The leader Service's endpoints tell when the serving leader moves.
            rule(
                &["discovery.k8s.io"],
                &["endpointslices"],
                &["list", "watch"],
            ),
            // The store Leases (made once, then the electors' own; swept with their backend)
            // and the operator's own (campaigned for: read, created, renewed). `update` is the
            // electors': a Role can grant only what its creator holds.
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            // The webhook's serving pair and its CA (two Secrets, made on first start): those
            // alone, by name (the watch selects the serving one by `metadata.name`); a create
            // cannot be limited by name, so it is a rule of its own.
            PolicyRule {
                resource_names: Some(vec![
                    WEBHOOK_SECRET.to_owned(),
                    WEBHOOK_CA_SECRET.to_owned(),
                ]),
                ..rule(&[""], &["secrets"], &["get", "list", "watch", "update"])
            },
            rule(&[""], &["secrets"], &["create"]),
            // The elector's rights, granted to its account (a Role can only grant what its
            // creator holds: Leases above).
            rule(
                &["rbac.authorization.k8s.io"],
                &["roles", "rolebindings"],
                &["list", "create", "patch", "delete"],
            ),
        ]),
    }
}
