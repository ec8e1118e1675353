//! A managed KVCacheBackend as Kubernetes objects: the leader Deployment, its Service, the Lease,
//! per-role RBAC, the tenant policy ConfigMap and one DaemonSet per member group.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, ExecAction, HTTPGetAction, HostPathVolumeSource, Lifecycle,
    LifecycleHandler, LocalObjectReference, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
    TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::{Managed, Medium, MemberAddressing, MemberGroup, PullPolicy};
use kvcache_api::rules::{BUCKET_BYTES, BUCKET_KEYS, DRAM_DEVICE_VISIBILITY_ENV};
use kvcache_quota::policy::{POLICY_KEY, POLICY_PATH, PolicyDocument};

use crate::names::{self, backend_labels, backend_selector};
use crate::{Error, fingerprint};

/// The leader's RPC port (engines and members dial it).
pub const RPC_PORT: i32 = 50051;
/// The leader's admin port (health, metrics, segments, tenant ledger).
pub const ADMIN_PORT: i32 = 9003;
/// The elector's readiness port.
pub const ELECTOR_PORT: i32 = 8090;
/// A member group's REST port is this plus its index.
pub const MEMBER_BASE_PORT: i32 = 8080;
/// The default staging buffer per member.
pub const DEFAULT_LOCAL_BUFFER: u64 = 16 << 20;
/// The staging buffer of a disk tier (the store's default is 1.25 GiB): two buckets.
pub const TIER_STAGING_BYTES: u64 = 2 * BUCKET_BYTES;
/// The annotation holding a member template's fingerprint.
pub const POD_SPEC_HASH: &str = "kvcache.gpustack.ai/pod-spec-hash";
/// Where the elector binary is delivered inside store Pods.
pub const ELECTOR_PATH: &str = "/kvcache/bin/kvcache-elector";
/// Shutdown budget beyond a tier's grace period.
pub const SHUTDOWN_MARGIN_SECONDS: i64 = 60;
/// The Lease duration the elector is given.
pub const LEASE_SECONDS: i32 = 6;

/// What rendering a backend takes.
#[derive(Clone, Debug)]
pub struct BackendInputs<'a> {
    /// The backend.
    pub backend: &'a KVCacheBackend,
    /// The resolved store image (`spec.image`, else the cluster setting).
    pub store_image: &'a str,
    /// The operator's namespace (default `gpustack-system`).
    pub namespace: &'a str,
    /// The operator's own image (it carries `kvcache-elector`).
    pub operator_image: &'a str,
    /// The tenant policy from the pools on this backend (empty when there are none yet).
    pub policy: Option<&'a PolicyDocument>,
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
    /// The leader Deployment.
    pub deployment: Option<Deployment>,
    /// The leader Service.
    pub service: Option<Service>,
    /// One DaemonSet per member group.
    pub daemon_sets: Vec<DaemonSet>,
}

/// `<backend>-leader`.
pub fn leader_name(backend: &str) -> String {
    names::object(backend, "leader")
}

/// The address engines and members dial: `<backend>-leader.<namespace>.svc:50051`.
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

fn meta(name: &str, ns: &str, labels: BTreeMap<String, String>, b: &KVCacheBackend) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        labels: Some(labels),
        owner_references: owner(b),
        ..Default::default()
    }
}

fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..Default::default()
        }),
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

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

/// The pull policy: as declared, else derived from the tag like the API server does.
pub fn pull_policy(declared: Option<PullPolicy>, image: &str) -> String {
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

/// The container that copies `kvcache-elector` out of the operator image.
fn elector_install(operator_image: &str) -> Container {
    Container {
        name: "elector-install".into(),
        image: Some(operator_image.into()),
        command: Some(vec![
            "kvcache-elector".into(),
            "install".into(),
            "/kvcache/bin".into(),
        ]),
        volume_mounts: Some(vec![mount("elector", "/kvcache/bin", false)]),
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
    out.service = Some(Service {
        metadata: meta(&leader, ns, backend_labels(&name, "leader"), b),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(backend_selector(&name, "leader")),
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
    });
    for (i, group) in managed.members.iter().enumerate() {
        out.daemon_sets
            .push(member_daemon_set(inputs, managed, &name, i, group)?);
    }
    Ok(out)
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

/// The master's flags, in the documented order, `extraArgs` last (the store takes the last
/// duplicate, so a user `default_kv_lease_ttl` wins).
pub fn master_flags(managed: &Managed) -> Vec<String> {
    let leader = &managed.leader;
    let mut flags = vec![
        format!("-rpc_port={RPC_PORT}"),
        format!("-metrics_port={ADMIN_PORT}"),
        "-default_kv_lease_ttl=5m".to_owned(),
        format!(
            "-allocation_strategy={}",
            leader.allocation_strategy.flag_value()
        ),
    ];
    if leader.multi_tenancy {
        flags.push("-enable_multi_tenants=true".into());
        flags.push("-tenant_quota_connector_type=file".into());
        flags.push(format!("-tenant_quota_connector_uri={POLICY_PATH}"));
    }
    if managed.members.iter().any(|g| g.tier().is_some()) {
        flags.push("-enable_offload=true".into());
        flags.push("-offload_on_evict=true".into());
    }
    flags.extend(
        leader
            .extra_args
            .iter()
            .map(|a| format!("-{}", a.trim_start_matches('-'))),
    );
    flags
}

fn leader_deployment(
    inputs: &BackendInputs<'_>,
    managed: &Managed,
    name: &str,
    leader: &str,
) -> Result<Deployment, Error> {
    let b = inputs.backend;
    let l = &managed.leader;
    let elects = l.elects();
    let replicas = if elects { l.replicas.max(1) } else { 1 };
    let image = inputs.store_image;
    let mut env = vec![
        field("POD_NAME", "metadata.name"),
        field("POD_NAMESPACE", "metadata.namespace"),
        field("POD_IP", "status.podIP"),
    ];
    let mut volumes = Vec::new();
    let mut init = Vec::new();
    let mut mounts = Vec::new();
    let master: Vec<String> = std::iter::once("mooncake_master".to_owned())
        .chain(master_flags(managed))
        .collect();
    let command = if elects {
        env.extend([
            var("KVCACHE_ELECTOR_LEASE", leader),
            field("KVCACHE_ELECTOR_NAMESPACE", "metadata.namespace"),
            field("KVCACHE_ELECTOR_IDENTITY", "metadata.name"),
            var("KVCACHE_ELECTOR_ADDRESS", format!("$(POD_IP):{RPC_PORT}")),
            var(
                "KVCACHE_ELECTOR_CHILD_HEALTH_URL",
                format!("http://127.0.0.1:{ADMIN_PORT}/health"),
            ),
            var(
                "KVCACHE_ELECTOR_READY_ADDR",
                format!("0.0.0.0:{ELECTOR_PORT}"),
            ),
            var("KVCACHE_ELECTOR_LABEL_POD", "true"),
        ]);
        volumes.push(empty_dir("elector"));
        init.push(elector_install(inputs.operator_image));
        mounts.push(mount("elector", "/kvcache/bin", true));
        std::iter::once(ELECTOR_PATH.to_owned())
            .chain(["leader".to_owned(), "--".to_owned()])
            .chain(master)
            .collect()
    } else {
        master
    };
    env.extend(l.extra_env.iter().map(EnvVar::from));
    if l.multi_tenancy {
        let cm = names::object(name, "tenant-policy");
        volumes.push(empty_dir("tenant-policy"));
        volumes.push(Volume {
            name: "tenant-policy-seed".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm,
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("tenant-policy", "/var/lib/mooncake", false));
        init.push(Container {
            name: "tenant-policy-seed".into(),
            image: Some(image.into()),
            image_pull_policy: Some(pull_policy(b.spec.image_pull_policy, image)),
            command: Some(vec!["sh".into(), "-c".into(), "if [ -f \"$SEED\" ]; then cp \"$SEED\" \"$TARGET\"; else printf '%s\\n' \"$EMPTY\" > \"$TARGET\"; fi".into()]),
            env: Some(vec![
                var("SEED", format!("/seed/{POLICY_KEY}")),
                var("TARGET", POLICY_PATH),
                var("EMPTY", PolicyDocument::empty().to_yaml().trim_end()),
            ]),
            volume_mounts: Some(vec![mount("tenant-policy", "/var/lib/mooncake", false), mount("tenant-policy-seed", "/seed", true)]),
            ..Default::default()
        });
    }
    let (ready, live) = if elects {
        (
            probe_http("/readyz", ELECTOR_PORT),
            probe_http("/healthz", ELECTOR_PORT),
        )
    } else {
        (
            probe_http("/get_all_segments", ADMIN_PORT),
            probe_http("/health", ADMIN_PORT),
        )
    };
    let mut ports = vec![port("rpc", RPC_PORT), port("admin", ADMIN_PORT)];
    if elects {
        ports.push(port("elector", ELECTOR_PORT));
    }
    let container = Container {
        name: "master".into(),
        image: Some(image.into()),
        image_pull_policy: Some(pull_policy(b.spec.image_pull_policy, image)),
        command: Some(command),
        env: Some(env),
        ports: Some(ports),
        readiness_probe: Some(ready),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(10),
            ..live
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let labels = backend_labels(name, "leader");
    let strategy = if replicas == 1 {
        DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        }
    } else {
        DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(replicas)),
            }),
        }
    };
    Ok(Deployment {
        metadata: meta(leader, inputs.namespace, labels.clone(), b),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(backend_selector(name, "leader")),
                ..Default::default()
            },
            strategy: Some(strategy),
            // One replica is ever available under election, so the deadline cannot be met:
            // RolloutComplete answers instead.
            progress_deadline_seconds: Some(i32::MAX),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: elects.then(|| leader.to_owned()),
                    automount_service_account_token: Some(elects),
                    image_pull_secrets: pull_secrets(b),
                    init_containers: (!init.is_empty()).then_some(init),
                    containers: vec![container],
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn port(name: &str, n: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: n,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn probe_http(path: &str, port: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            ..Default::default()
        }),
        period_seconds: Some(5),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

fn member_daemon_set(
    inputs: &BackendInputs<'_>,
    managed: &Managed,
    name: &str,
    i: usize,
    g: &MemberGroup,
) -> Result<DaemonSet, Error> {
    let b = inputs.backend;
    let field_path = format!("spec.connection.managed.members[{i}]");
    let component = format!("member-{i}");
    let image = g.image.as_deref().unwrap_or(inputs.store_image);
    let protocol = g.protocol(b.spec.transport.protocol);
    let fabric = protocol.is_fabric();
    let port = MEMBER_BASE_PORT + i32::try_from(i).unwrap_or(0);
    let segment = bytes(
        &format!("{field_path}.capacityPerMember"),
        &g.capacity_per_member,
    )?;
    let buffer = match &g.local_buffer_size {
        Some(q) => bytes(&format!("{field_path}.localBufferSize"), q)?,
        None => DEFAULT_LOCAL_BUFFER,
    };
    let lease_members = managed.leader.effective_member_addressing() == MemberAddressing::Lease;
    let leader = leader_name(name);

    let mut env = vec![var("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE")];
    if !lease_members {
        env.push(var(
            "MOONCAKE_MASTER",
            client_endpoint(name, inputs.namespace),
        ));
    }
    env.extend([
        var("MOONCAKE_PROTOCOL", protocol.artifact()),
        field("POD_IP", "status.podIP"),
        field("MOONCAKE_LOCAL_HOSTNAME", "status.podIP"),
        var("MOONCAKE_GLOBAL_SEGMENT_SIZE", segment.to_string()),
        var("MOONCAKE_LOCAL_BUFFER_SIZE", buffer.to_string()),
        var("MC_TE_METRIC", "1"),
    ]);
    if g.medium == Medium::Dram {
        env.extend(DRAM_DEVICE_VISIBILITY_ENV.iter().map(|v| var(v, "void")));
    }
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let mut init = Vec::new();
    let mut request = match g.medium {
        Medium::Dram => segment.saturating_add(buffer),
        Medium::Vram => buffer,
    };
    let mut lifecycle = None;
    let mut grace = SHUTDOWN_MARGIN_SECONDS;
    if let Some(tier) = g.tier() {
        let bucket = BUCKET_BYTES.min(segment.max(1));
        env.extend([
            var("MOONCAKE_OFFLOAD_ENABLED", "true"),
            var("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", tier.path.as_str()),
            var(
                "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
                bucket.to_string(),
            ),
            var(
                "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
                BUCKET_KEYS.to_string(),
            ),
            var(
                "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES",
                TIER_STAGING_BYTES.to_string(),
            ),
        ]);
        request = request.saturating_add(TIER_STAGING_BYTES);
        if let Some(c) = &tier.capacity {
            let cap = bytes(&format!("{field_path}.localDisks[0].capacity"), c)?;
            env.push(var(
                "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                cap.to_string(),
            ));
            env.push(var(
                "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
                cap.to_string(),
            ));
        }
        if let Some(k) = tier.key_limit {
            env.push(var("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", k.to_string()));
        }
        if let Some(e) = &tier.eviction {
            env.push(var(
                "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION",
                if e.enabled { "true" } else { "false" },
            ));
            if let Some(p) = e.policy {
                env.push(var("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", p.as_str()));
            }
            if let Some(w) = &e.watermark {
                env.push(var(
                    "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                    format!("{:.2}", f64::from(w.high) / 100.0),
                ));
                env.push(var(
                    "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
                    format!("{:.2}", f64::from(w.low) / 100.0),
                ));
            }
        }
        volumes.push(Volume {
            name: "local-disk".into(),
            host_path: Some(HostPathVolumeSource {
                path: tier.path.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
        mounts.push(mount("local-disk", &tier.path, false));
        let seconds = i64::from(
            managed
                .scale_in
                .as_ref()
                .map_or(0, |s| s.grace_period_seconds),
        );
        grace = seconds + SHUTDOWN_MARGIN_SECONDS;
        let script = format!(
            "import json, urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{port}/api/unmount_local_disk', data=json.dumps({{'grace_period_seconds': {seconds}}}).encode(), headers={{'Content-Type': 'application/json'}}, method='POST'), timeout={})",
            seconds + 10
        );
        lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["python3".into(), "-c".into(), script]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        init.push(Container {
            name: "tier-survey".into(),
            image: Some(image.into()),
            image_pull_policy: Some(pull_policy(b.spec.image_pull_policy, image)),
            command: Some(vec!["sh".into(), "-c".into(), "n=$(ls -A \"$TIER\" | wc -l); echo \"entries=$n path=$TIER\" | tee /dev/termination-log".into()]),
            env: Some(vec![var("TIER", tier.path.as_str())]),
            volume_mounts: Some(vec![mount("local-disk", &tier.path, true)]),
            termination_message_policy: Some("File".into()),
            ..Default::default()
        });
    }
    for (j, h) in g.host_paths.iter().enumerate() {
        let vname = format!("host-{j}");
        volumes.push(Volume {
            name: vname.clone(),
            host_path: Some(HostPathVolumeSource {
                path: h.path.clone(),
                type_: h.r#type.clone().filter(|t| !t.is_empty()),
            }),
            ..Default::default()
        });
        mounts.push(mount(&vname, &h.mount_path, h.read_only));
    }
    env.extend(g.extra_env.iter().map(EnvVar::from));

    let mut args = Vec::new();
    if i > 0 {
        args.extend(["--port".to_owned(), port.to_string()]);
    }
    for a in &g.extra_args {
        args.extend(["-D".to_owned(), a.clone()]);
    }
    let store = vec!["mc_store_rest_server".to_owned()];
    let command = if lease_members {
        env.extend([
            var("KVCACHE_ELECTOR_LEASE", &leader),
            field("KVCACHE_ELECTOR_NAMESPACE", "metadata.namespace"),
        ]);
        volumes.push(empty_dir("elector"));
        init.insert(0, elector_install(inputs.operator_image));
        mounts.push(mount("elector", "/kvcache/bin", true));
        [
            ELECTOR_PATH.to_owned(),
            "member".to_owned(),
            "--".to_owned(),
        ]
        .into_iter()
        .chain(store)
        .collect()
    } else {
        store
    };

    let mut limits = BTreeMap::new();
    if fabric {
        let count = g.fabric_interface_count.unwrap_or(1).max(1);
        match (protocol, count) {
            (kvcache_api::backend::Protocol::Efa, n) => {
                limits.insert(
                    "vpc.amazonaws.com/efa".to_owned(),
                    K8sQuantity(n.to_string()),
                );
            }
            (_, 1) => {
                limits.insert(
                    "device.gpustack.ai/rdma.shared".to_owned(),
                    K8sQuantity("1".into()),
                );
            }
            (_, n) => {
                limits.insert(
                    "device.gpustack.ai/rdma".to_owned(),
                    K8sQuantity(n.to_string()),
                );
            }
        }
    }
    let mut security = if fabric {
        SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["IPC_LOCK".into(), "SYS_RESOURCE".into()]),
                drop: None,
            }),
            ..Default::default()
        }
    } else {
        SecurityContext::default()
    };
    if let Some(user) = &g.security_context {
        merge_security(&mut security, user);
    }
    let container = Container {
        name: "member".into(),
        image: Some(image.into()),
        image_pull_policy: Some(pull_policy(b.spec.image_pull_policy, image)),
        command: Some(command),
        args: (!args.is_empty()).then_some(args),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("rest".into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port),
                host: None,
            }),
            period_seconds: Some(5),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "memory".to_owned(),
                K8sQuantity(kvcache_api::quantity::format_bytes(request)),
            )])),
            limits: (!limits.is_empty()).then(|| limits.clone()),
            ..Default::default()
        }),
        lifecycle,
        security_context: (security != SecurityContext::default()).then_some(security),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let labels = backend_labels(name, &component);
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            node_selector: (!g.node_selector.is_empty()).then(|| g.node_selector.clone()),
            service_account_name: lease_members.then(|| names::object(name, "member")),
            automount_service_account_token: Some(lease_members),
            host_network: fabric.then_some(true),
            dns_policy: Some(
                if fabric {
                    "ClusterFirstWithHostNet"
                } else {
                    "ClusterFirst"
                }
                .into(),
            ),
            runtime_class_name: g.runtime_class_name.clone(),
            image_pull_secrets: pull_secrets(b),
            termination_grace_period_seconds: Some(grace),
            init_containers: (!init.is_empty()).then_some(init),
            containers: vec![container],
            volumes: (!volumes.is_empty()).then_some(volumes),
            ..Default::default()
        }),
    };
    let hash = fingerprint(&template);
    if let Some(m) = template.metadata.as_mut() {
        m.annotations = Some(BTreeMap::from([(POD_SPEC_HASH.to_owned(), hash)]));
    }
    Ok(DaemonSet {
        metadata: meta(
            &names::object(name, &component),
            inputs.namespace,
            labels,
            b,
        ),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(backend_selector(name, &component)),
                ..Default::default()
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }),
            template,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The user's security context over what the protocol grants, field by field;
/// `capabilities.add` is unioned.
fn merge_security(base: &mut SecurityContext, user: &SecurityContext) {
    let granted: Vec<String> = base
        .capabilities
        .as_ref()
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    let mut merged = user.clone();
    if !granted.is_empty() || user.capabilities.is_some() {
        let mut caps = user.capabilities.clone().unwrap_or_default();
        let mut add = granted;
        for c in caps.add.take().unwrap_or_default() {
            if !add.contains(&c) {
                add.push(c);
            }
        }
        caps.add = Some(add);
        merged.capabilities = Some(caps);
    }
    *base = merged;
}
