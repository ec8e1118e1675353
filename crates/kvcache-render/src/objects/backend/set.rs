//! A managed backend's whole object set, rendered (`render`), and the order a pass writes it in
//! (`BackendObjects::desired`).

use super::access;
use super::disruption;
use super::etcd;
use super::inputs::BackendInputs;
use super::leader::leader_deployment;
use super::member::member_daemon_set;
use super::pod::*;
use crate::error::Error;
use crate::names::{self, backend_labels, backend_selector};
use crate::objects::desired::{DesiredSet, ObjectKind, Write};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::MemberAddressing;
use kvcache_quota::policy::{POLICY_KEY, PolicyDocument};
use std::collections::BTreeMap;

/// Every object of a managed backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendObjects {
    /// ServiceAccounts (leader; members with Lease addressing).
    pub service_accounts: Vec<ServiceAccount>,
    /// Roles.
    pub roles: Vec<Role>,
    /// RoleBindings.
    pub role_bindings: Vec<RoleBinding>,
    /// The Lease (election on).
    pub lease: Option<Lease>,
    /// The tenant policy seed (multi-tenancy on).
    pub config_map: Option<ConfigMap>,
    /// The leader (master) Deployment, `<backend>-leader`; `None` for an external backend.
    pub deployment: Option<Deployment>,
    /// The leader's ClusterIP Service, `<backend>-leader`, on the RPC (50051) and admin (9003)
    /// ports; `None` for an external backend.
    pub service: Option<Service>,
    /// One DaemonSet per member group.
    pub daemon_sets: Vec<DaemonSet>,
    /// The etcd's headless Service `<backend>-etcd` (`electionBackend: Etcd`).
    pub etcd_service: Option<Service>,
    /// The etcd StatefulSet `<backend>-etcd` (`electionBackend: Etcd`).
    pub etcd: Option<StatefulSet>,
    /// Who may reach the etcd, `<backend>-etcd` (`electionBackend: Etcd`).
    pub etcd_policy: Option<NetworkPolicy>,
    /// Who may reach the leader and the members: `<backend>-leader`, and `<backend>-members`
    /// unless every member group is on the host network ([`access`]).
    pub network_policies: Vec<NetworkPolicy>,
    /// The disruption budgets of the store workloads, each named after its workload
    /// ([`super::disruption`]): none for a workload of one Pod.
    pub pdbs: Vec<PodDisruptionBudget>,
}

/// Every kind a managed backend's objects come in, the order its sweep lists them in.
pub(crate) const BACKEND_KINDS: &[ObjectKind] = &[
    ObjectKind::of::<ServiceAccount>(),
    ObjectKind::of::<Role>(),
    ObjectKind::of::<RoleBinding>(),
    ObjectKind::of::<Lease>(),
    ObjectKind::of::<ConfigMap>(),
    ObjectKind::workload::<Deployment>(),
    ObjectKind::of::<Service>(),
    ObjectKind::of::<NetworkPolicy>(),
    ObjectKind::workload::<StatefulSet>(),
    ObjectKind::workload::<DaemonSet>(),
    ObjectKind::of::<PodDisruptionBudget>(),
];

/// What a backend's teardown deletes and awaits, in order (the rest goes with its owner
/// reference): the disruption budgets, the leader, the members, then a warm backend's etcd last of the workloads (its
/// claims go with it, by the StatefulSet's retention policy), then the Services.
pub const BACKEND_TEARDOWN: &[ObjectKind] = &[
    // The budgets first: nothing of a backend torn down is kept from eviction.
    ObjectKind::of::<PodDisruptionBudget>(),
    ObjectKind::workload::<Deployment>(),
    ObjectKind::workload::<DaemonSet>(),
    ObjectKind::workload::<StatefulSet>(),
    ObjectKind::of::<Service>(),
];

impl BackendObjects {
    /// The disruption budgets of these workloads as they stand ([`disruption::budgets`]);
    /// `scheduled` holds each member group's `desiredNumberScheduled` by index.
    pub(crate) fn budgets(&self, scheduled: &[Option<i32>]) -> Vec<PodDisruptionBudget> {
        disruption::budgets(
            self.deployment.as_ref(),
            self.etcd.as_ref(),
            &self.daemon_sets,
            scheduled,
        )
    }

    /// The objects in the order a pass writes them ([`DesiredSet`]); `write_policy: false`
    /// leaves the tenant policy seed already written as it is (a refused policy is never
    /// written, nor a partial one).
    pub fn desired(&self, write_policy: bool) -> DesiredSet {
        let mut set = DesiredSet::new(BACKEND_KINDS);
        set.apply_all(&self.service_accounts);
        set.apply_all(&self.roles);
        set.apply_all(&self.role_bindings);
        // The Lease is created once; its holder fields belong to the elector.
        if let Some(l) = &self.lease {
            set.push(l, Write::CreateOnce);
        }
        match &self.config_map {
            Some(m) if write_policy => set.push(m, Write::Apply),
            _ if write_policy => {}
            _ => set.leave::<ConfigMap>(),
        }
        // The store's policies before its Pods: a leader or member is never reachable
        // unguarded.
        set.apply_all(&self.network_policies);
        // Each workload's budget right after it.
        set.apply_all(&self.deployment);
        set.apply_all(self.budget_of(self.deployment.as_ref().map(|d| &d.metadata)));
        set.apply_all(&self.service);
        // The etcd (its policy first) before the members that dial it.
        set.apply_all(&self.etcd_policy);
        set.apply_all(&self.etcd_service);
        set.apply_all(&self.etcd);
        set.apply_all(self.budget_of(self.etcd.as_ref().map(|s| &s.metadata)));
        for ds in &self.daemon_sets {
            set.push(ds, Write::Apply);
            set.apply_all(self.budget_of(Some(&ds.metadata)));
        }
        set
    }

    /// The budget of the workload with `meta` (it has the workload's name), if it has one.
    fn budget_of(&self, meta: Option<&ObjectMeta>) -> Option<&PodDisruptionBudget> {
        let name = meta?.name.as_ref();
        self.pdbs.iter().find(|p| p.metadata.name.as_ref() == name)
    }
}

/// Renders every object of a backend (nothing for an external one).
pub fn render(inputs: &BackendInputs<'_>) -> Result<BackendObjects, Error> {
    let b = inputs.backend;
    let Some(managed) = &b.spec.connection.managed else {
        return Ok(BackendObjects::default());
    };
    let name = b.metadata.name.clone().unwrap_or_default();
    let ns = inputs.namespace;
    let leader = leader_name(&name);
    let elects = managed.leader.elects();
    let lease_members = managed.leader.effective_member_addressing() == MemberAddressing::Lease;
    let mut out = BackendObjects::default();

    if elects {
        out.lease = Some(Lease {
            metadata: meta(&leader, ns, backend_labels(&name, "leader"), b),
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(LEASE_SECONDS),
                ..Default::default()
            }),
        });
        rbac(
            &mut out,
            b,
            ns,
            &leader,
            "leader",
            vec![PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".into()]),
                resources: Some(vec!["leases".into()]),
                resource_names: Some(vec![leader.clone()]),
                verbs: vec!["get".into(), "update".into()],
                ..Default::default()
            }],
        );
        if lease_members {
            let member_sa = names::object(&name, "member");
            rbac(
                &mut out,
                b,
                ns,
                &member_sa,
                "member",
                vec![PolicyRule {
                    api_groups: Some(vec!["coordination.k8s.io".into()]),
                    resources: Some(vec!["leases".into()]),
                    resource_names: Some(vec![leader.clone()]),
                    // A watch with a `metadata.name` field selector is authorized by name.
                    verbs: vec!["get".into(), "list".into(), "watch".into()],
                    ..Default::default()
                }],
            );
        }
    }
    if managed.leader.multi_tenancy {
        let doc = inputs.policy.cloned().unwrap_or_else(PolicyDocument::empty);
        out.config_map = Some(ConfigMap {
            metadata: meta(
                &names::object(&name, "tenant-policy"),
                ns,
                backend_labels(&name, "leader"),
                b,
            ),
            data: Some(BTreeMap::from([(POLICY_KEY.to_owned(), doc.to_yaml())])),
            ..Default::default()
        });
    }
    out.deployment = Some(leader_deployment(inputs, managed, &name, &leader)?);
    out.service = Some(leader_service(b, ns, &name, &leader));
    for (i, group) in managed.members.iter().enumerate() {
        out.daemon_sets
            .push(member_daemon_set(inputs, managed, &name, i, group)?);
    }
    out.network_policies = access::store_policies(
        b,
        ns,
        &name,
        inputs.bound_namespaces,
        inputs.access,
        &out.daemon_sets,
    );
    if managed.leader.warm() {
        let e = etcd::etcd(b, ns, &managed.leader, inputs.etcd_image)?;
        out.etcd_service = Some(e.service);
        out.etcd = Some(e.stateful_set);
        out.etcd_policy = Some(e.policy);
    }
    // The members' budgets need the nodes each group runs on: the pass sizes them
    // (`crate::plan::backend`).
    out.pdbs = out.budgets(&[]);
    Ok(out)
}

/// The leader's ClusterIP Service `<backend>-leader` on the RPC and admin ports: it selects
/// the leader Pods, and only a Ready (serving) one gets traffic.
pub(crate) fn leader_service(b: &KVCacheBackend, ns: &str, name: &str, leader: &str) -> Service {
    Service {
        metadata: meta(leader, ns, backend_labels(name, "leader"), b),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(backend_selector(name, "leader")),
            ports: Some(vec![
                ServicePort {
                    name: Some("rpc".into()),
                    port: RPC_PORT,
                    target_port: Some(IntOrString::String("rpc".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("admin".into()),
                    port: ADMIN_PORT,
                    target_port: Some(IntOrString::String("admin".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn rbac(
    out: &mut BackendObjects,
    b: &KVCacheBackend,
    ns: &str,
    account: &str,
    component: &str,
    rules: Vec<PolicyRule>,
) {
    let backend = b.metadata.name.clone().unwrap_or_default();
    let labels = backend_labels(&backend, component);
    out.service_accounts.push(ServiceAccount {
        metadata: meta(account, ns, labels.clone(), b),
        ..Default::default()
    });
    out.roles.push(Role {
        metadata: meta(account, ns, labels.clone(), b),
        rules: Some(rules),
    });
    out.role_bindings.push(RoleBinding {
        metadata: meta(account, ns, labels, b),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: account.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    });
}
