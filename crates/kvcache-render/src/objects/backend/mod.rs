//! A managed KVCacheBackend as Kubernetes objects: the leader Deployment, its Service, the Lease,
//! per-role RBAC, the tenant policy ConfigMap and one DaemonSet per member group.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, EmptyDirVolumeSource, EnvVar, LocalObjectReference,
    PodSecurityContext, ResourceRequirements, SeccompProfile, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::{MemberAddressing, PullPolicy};
use kvcache_api::resources::StoreResources;
use kvcache_quota::policy::{POLICY_KEY, PolicyDocument};

pub mod access;
mod etcd;
mod leader;
mod member;
pub mod probe;
pub use crate::names::etcd_endpoints;
pub(crate) use member::fabric_device;

pub use access::StoreAccess;
use leader::leader_deployment;
pub use leader::master_flags;
use member::member_daemon_set;

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::names::{self, backend_labels, backend_selector};
use crate::objects::desired::{DesiredSet, ObjectKind, Write};

/// The leader's RPC port (engines and members dial it).
pub const RPC_PORT: i32 = 50051;
/// The leader's admin port (health, metrics, segments, tenant ledger).
pub const ADMIN_PORT: i32 = 9003;
/// The elector's readiness port.
pub(crate) const ELECTOR_PORT: i32 = 8090;
/// A member group's REST port is this plus its index.
pub(crate) const MEMBER_BASE_PORT: i32 = 8080;
pub(crate) use crate::names::{ELECTOR_PATH, POD_SPEC_HASH};
pub use kvcache_api::resources::{DEFAULT_LOCAL_BUFFER, TIER_STAGING_BYTES};
/// Shutdown budget beyond a tier's grace period.
pub(crate) const SHUTDOWN_MARGIN_SECONDS: i64 = 60;
/// The Lease duration the elector is given.
pub const LEASE_SECONDS: i32 = 6;
/// A store container's requests and limits: what `written` says, each request it leaves out
/// from its default (`cpu`, `memory`, from `kvcache_api::resources`), and only the limits it
/// writes. Without a request a store container gets the kernel's smallest CPU weight and,
/// beside engines prefilling on every core, the store starves (crates/kvcache-operator/README.md).
pub(crate) fn store_resources(
    written: Option<&StoreResources>,
    cpu: &str,
    memory: &str,
) -> ResourceRequirements {
    let request_cpu = written
        .and_then(StoreResources::cpu_request)
        .map_or(cpu, |q| q.as_str());
    let request_memory = written
        .and_then(StoreResources::memory_request)
        .map_or(memory, |q| q.as_str());
    let mut limits = BTreeMap::new();
    if let Some(q) = written.and_then(StoreResources::cpu_limit) {
        limits.insert("cpu".to_owned(), K8sQuantity(q.as_str().to_owned()));
    }
    if let Some(q) = written.and_then(StoreResources::memory_limit) {
        limits.insert("memory".to_owned(), K8sQuantity(q.as_str().to_owned()));
    }
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), K8sQuantity(request_cpu.to_owned())),
            ("memory".to_owned(), K8sQuantity(request_memory.to_owned())),
        ])),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    }
}

/// What rendering a backend takes.
#[derive(Clone, Debug)]
pub struct BackendInputs<'a> {
    /// The KVCacheBackend to render; an external one renders nothing.
    pub backend: &'a KVCacheBackend,
    /// The resolved store image (`spec.image`, else the cluster setting).
    pub store_image: &'a str,
    /// The operator's namespace (default `gpustack-system`).
    pub namespace: &'a str,
    /// The image that delivers `kvcache-elector` (the `kv-cache-elector-image` setting):
    /// apart from the operator's, so that an operator upgrade changes no store template.
    pub elector_image: &'a str,
    /// The etcd image (the `kv-cache-etcd-image` setting) a backend with `electionBackend: Etcd`
    /// runs.
    pub etcd_image: &'a str,
    /// The namespaces holding a Binding to a pool on this backend (their engines reach the
    /// master's RPC port and the members' transfer ports), sorted.
    pub bound_namespaces: &'a [String],
    /// The tenant policy from the pools on this backend (empty when there are none yet).
    pub policy: Option<&'a PolicyDocument>,
    /// Who else may reach the store (the operator outside a Pod, the monitoring).
    pub access: &'a StoreAccess,
}

/// The store image a backend runs: its own, else the setting.
pub fn store_image<'a>(
    b: &'a KVCacheBackend,
    settings: &'a kvcache_api::Settings,
) -> Option<&'a str> {
    b.spec.image.as_deref().or(settings.backend_image())
}

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
];

/// What a backend's teardown deletes and awaits, in order (the rest goes with its owner
/// reference): the leader, the members, then a warm backend's etcd last of the workloads (its
/// claims go with it, by the StatefulSet's retention policy), then the Services.
pub const BACKEND_TEARDOWN: &[ObjectKind] = &[
    ObjectKind::workload::<Deployment>(),
    ObjectKind::workload::<DaemonSet>(),
    ObjectKind::workload::<StatefulSet>(),
    ObjectKind::of::<Service>(),
];

impl BackendObjects {
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
        set.apply_all(&self.deployment);
        set.apply_all(&self.service);
        // The etcd (its policy first) before the members that dial it.
        set.apply_all(&self.etcd_policy);
        set.apply_all(&self.etcd_service);
        set.apply_all(&self.etcd);
        set.apply_all(&self.daemon_sets);
        set
    }
}

/// The fingerprint a member DaemonSet's Pod template carries (empty when it has none).
pub fn pod_spec_hash(ds: &DaemonSet) -> String {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(POD_SPEC_HASH).cloned())
        .unwrap_or_default()
}

/// `<backend>-leader`.
pub fn leader_name(backend: &str) -> String {
    names::object(backend, "leader")
}

/// The address engines and members dial: `<backend>-leader.<namespace>.svc:50051`, whatever
/// the election. The leader Service selects only a Ready leader Pod, and only the serving master
/// is Ready (the elector's readiness, or with `electionBackend: Etcd` the master's
/// `/get_all_segments`, which a standby answers 503), so a client that dials the Service finds
/// the serving master without reading the etcd. The store's client with a plain address (not
/// `etcd://`) reconnects to the same address after three failed pings and remounts when the
/// master says so (upstream `mooncake-store/src/client_service.cpp`, v0.3.12.post1,
/// `Client::ConnectToMaster` and the ping loop's "non-HA" branch), which is how it follows the
/// Service to a new master. Keeping the etcd to the backend's own Pods is then possible: it
/// has no authentication, and whoever writes its master view decides where every client goes
/// (`access.rs`).
pub fn client_endpoint(backend: &str, namespace: &str) -> String {
    format!("{}.{namespace}.svc:{RPC_PORT}", leader_name(backend))
}

fn owner(b: &KVCacheBackend) -> Option<Vec<OwnerReference>> {
    let uid = b.metadata.uid.clone()?;
    Some(vec![OwnerReference {
        api_version: format!("{}/{}", kvcache_api::GROUP, kvcache_api::VERSION),
        kind: "KVCacheBackend".into(),
        name: b.metadata.name.clone().unwrap_or_default(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    }])
}

/// The label that marks an object as this backend's (its uid): what the operator prunes and
/// tears down by, never by the identity labels alone.
pub const OWNER_LABEL: &str = "kvcache.gpustack.ai/backend-uid";

fn meta(
    name: &str,
    ns: &str,
    mut labels: BTreeMap<String, String>,
    b: &KVCacheBackend,
) -> ObjectMeta {
    if let Some(uid) = &b.metadata.uid {
        labels.insert(OWNER_LABEL.to_owned(), uid.clone());
    }
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        labels: Some(labels),
        owner_references: owner(b),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The user and group the store and elector images run as (the published store image's).
pub(crate) const STORE_UID: i64 = 65532;

/// A store Pod under the restricted Pod Security Standard (docs/isolation.md#pod-security):
/// never root (uid and gid 65532, the images' own), the runtime's default seccomp profile.
pub(crate) fn restricted_pod() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(STORE_UID),
        run_as_group: Some(STORE_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A store container under the restricted standard: no privilege escalation, every capability
/// dropped, a read-only root (what the processes write goes to their volumes and to `/tmp`, an
/// emptyDir of its own: [`scratch`]).
pub(crate) fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    }
}

/// What a short init step (a copy, a seed, a survey) requests and may use: it runs before the
/// store starts, so it takes nothing from it.
pub(crate) fn init_resources() -> ResourceRequirements {
    let q = |v: &str| K8sQuantity(v.into());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), q("10m")),
            ("memory".to_owned(), q("32Mi")),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), q("500m")),
            ("memory".to_owned(), q("128Mi")),
        ])),
        ..Default::default()
    }
}

/// The writable `/tmp` a store container with a read-only root gets (the master's and the
/// client's logs and sockets).
pub(crate) fn scratch() -> (Volume, VolumeMount) {
    (empty_dir("tmp"), mount("tmp", "/tmp", false))
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// The pull policy: as declared, else derived from the tag like the API server does.
pub(crate) fn pull_policy(declared: Option<PullPolicy>, image: &str) -> String {
    if let Some(p) = declared {
        return p.as_str().into();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    let tagged = last.contains(':') || image.contains('@');
    if !tagged || last.ends_with(":latest") {
        "Always".into()
    } else {
        "IfNotPresent".into()
    }
}

fn bytes(field: &str, q: &kvcache_api::Quantity) -> Result<u64, Error> {
    q.bytes(field).map_err(Error::from)
}

fn pull_secrets(b: &KVCacheBackend) -> Option<Vec<LocalObjectReference>> {
    (!b.spec.image_pull_secrets.is_empty()).then(|| b.spec.image_pull_secrets.clone())
}

/// The container that copies `kvcache-elector` out of the elector image.
fn elector_install(elector_image: &str) -> Container {
    Container {
        name: "elector-install".into(),
        image: Some(elector_image.into()),
        command: Some(vec![
            "kvcache-elector".into(),
            "install".into(),
            "/kvcache/bin".into(),
        ]),
        volume_mounts: Some(vec![mount("elector", "/kvcache/bin", false)]),
        security_context: Some(restricted_container()),
        resources: Some(init_resources()),
        ..Default::default()
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
    Ok(out)
}

/// The leader's ClusterIP Service `<backend>-leader` on the RPC and admin ports: it selects
/// the leader Pods, and only a Ready (serving) one gets traffic.
fn leader_service(b: &KVCacheBackend, ns: &str, name: &str, leader: &str) -> Service {
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

fn rbac(
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

/// The account a store Pod runs as, always named: its own, or the namespace's `default`. Left
/// unset, an apply that drops the field (electionBackend set to `None`) would not clear it: the
/// API server keeps the deprecated `serviceAccount` twin it filled in, converts it back, and the
/// Pods keep asking for the account the same apply pruned (their creation is then refused).
pub(crate) fn account(own: Option<&str>) -> String {
    own.unwrap_or("default").to_owned()
}

/// The fingerprint of a Pod template: its JSON without the node selector (widening a selector
/// restarts nothing) and without the fingerprint annotation itself.
pub fn fingerprint(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> String {
    let mut t = template.clone();
    if let Some(spec) = t.spec.as_mut() {
        spec.node_selector = None;
    }
    if let Some(meta) = t.metadata.as_mut()
        && let Some(a) = meta.annotations.as_mut()
    {
        a.remove(POD_SPEC_HASH);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    let json = serde_json::to_vec(&t).unwrap_or_default();
    let digest = Sha256::digest(&json);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
