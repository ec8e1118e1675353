//! One member group as a DaemonSet: the store client's environment, the optional disk tier,
//! the RDMA/EFA fabric, the security context, and the Pod that holds them. Each piece is its
//! own function; `member_daemon_set` only puts them together.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ExecAction, HostPathVolumeSource, Lifecycle,
    LifecycleHandler, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecurityContext,
    TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::backend::{LocalDisk, Managed, Medium, MemberAddressing, MemberGroup, Protocol};
use kvcache_api::resources::MEMBER_CPU_REQUEST;
use kvcache_api::rules::{BUCKET_BYTES, BUCKET_KEYS, DRAM_DEVICE_VISIBILITY_ENV};
use kvcache_inject::transport::TCP_TUNING;
use kvcache_inject::{env as env_value, field_env};

use super::inputs::BackendInputs;
use super::pod::{
    DEFAULT_LOCAL_BUFFER, ELECTOR_PATH, MEMBER_BASE_PORT, POD_SPEC_HASH, SHUTDOWN_MARGIN_SECONDS,
    TIER_STAGING_BYTES, account, bytes, client_endpoint, elector_install, empty_dir, leader_name,
    meta, mount, pull_policy, pull_secrets, store_resources,
};
use super::pod::{TRANSFER_PORT_ENV, TRANSFER_PORTS, fingerprint};
use crate::error::Error;
use crate::names::{self, backend_labels, backend_selector};

/// A member group with its figures resolved once.
struct Group<'a> {
    inputs: &'a BackendInputs<'a>,
    backend: &'a str,
    index: usize,
    group: &'a MemberGroup,
    field_path: String,
    image: &'a str,
    protocol: Protocol,
    port: i32,
    segment: u64,
    buffer: u64,
    lease_members: bool,
}

impl<'a> Group<'a> {
    fn new(
        inputs: &'a BackendInputs<'a>,
        managed: &Managed,
        backend: &'a str,
        index: usize,
        group: &'a MemberGroup,
    ) -> Result<Self, Error> {
        let field_path = format!("spec.connection.managed.members[{index}]");
        let segment = bytes(
            &format!("{field_path}.capacityPerMember"),
            &group.capacity_per_member,
        )?;
        let buffer = match &group.local_buffer_size {
            Some(q) => bytes(&format!("{field_path}.localBufferSize"), q)?,
            None => DEFAULT_LOCAL_BUFFER,
        };
        Ok(Group {
            inputs,
            backend,
            index,
            group,
            image: group.image.as_deref().unwrap_or(inputs.store_image),
            protocol: group.protocol(inputs.backend.spec.transport.protocol),
            port: MEMBER_BASE_PORT + i32::try_from(index).unwrap_or(0),
            segment,
            buffer,
            lease_members: managed.leader.effective_member_addressing() == MemberAddressing::Lease,
            field_path,
        })
    }

    fn fabric(&self) -> bool {
        self.protocol.is_fabric()
    }

    fn pull_policy(&self) -> String {
        pull_policy(self.inputs.backend.spec.image_pull_policy, self.image)
    }
}

/// The member's bound on one request to the master and on connecting to it, milliseconds: a
/// member's requests are metadata (mount, ping, remount, its REST puts' and gets' replica
/// lists), far under it; a group's `extraEnv` naming either variable replaces it
/// ([`RPC_TIMEOUT_ENV`]).
pub(crate) const MEMBER_RPC_TIMEOUT_MS: u32 = 2000;

/// The variables that carry [`MEMBER_RPC_TIMEOUT_MS`]: rendered unless the group's `extraEnv`
/// names them (one entry per name: with two the runtime picks the winner).
pub(crate) const RPC_TIMEOUT_ENV: [&str; 2] = ["MC_RPC_TIMEOUT_MS", "MC_RPC_CONNECT_TIMEOUT_MS"];

/// The store client's environment: where the master is, the transport, the segment.
fn store_env(g: &Group<'_>) -> Vec<EnvVar> {
    let mut env = vec![env_value("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE")];
    if !g.lease_members {
        env.push(env_value(
            "MOONCAKE_MASTER",
            client_endpoint(g.backend, g.inputs.namespace),
        ));
    }
    env.extend([
        env_value("MOONCAKE_PROTOCOL", g.protocol.artifact()),
        field_env("POD_IP", "status.podIP"),
        field_env("MOONCAKE_LOCAL_HOSTNAME", "status.podIP"),
        env_value("MOONCAKE_GLOBAL_SEGMENT_SIZE", g.segment.to_string()),
        env_value("MOONCAKE_LOCAL_BUFFER_SIZE", g.buffer.to_string()),
        env_value("MC_TE_METRIC", "1"),
    ]);
    // A ping already sent to a leader whose address vanished otherwise blocks for the client's
    // 30 s default before the member looks for the new master
    // (crates/kvcache-elector/README.md, "Engine reattach after a failover").
    env.extend(
        RPC_TIMEOUT_ENV
            .iter()
            .filter(|name| !g.group.extra_env.iter().any(|e| e.name == **name))
            .map(|name| env_value(name, MEMBER_RPC_TIMEOUT_MS.to_string())),
    );
    if !g.fabric() {
        let (first, last) = TRANSFER_PORTS;
        env.extend(
            TRANSFER_PORT_ENV
                .iter()
                .zip([first, last])
                .filter(|(name, _)| !g.group.extra_env.iter().any(|e| e.name == **name))
                .map(|(name, port)| env_value(name, port.to_string())),
        );
    }
    // The transport defaults engines get too (kvcache_inject::transport); the group's own
    // `extraEnv` entry of a name replaces it.
    if g.protocol.artifact() == "tcp" {
        env.extend(
            TCP_TUNING
                .iter()
                .filter(|t| !g.group.extra_env.iter().any(|e| e.name == t.name))
                .map(|t| env_value(t.name, t.value)),
        );
    }
    if g.group.medium == Medium::Dram {
        env.extend(
            DRAM_DEVICE_VISIBILITY_ENV
                .iter()
                .map(|v| env_value(v, "void")),
        );
    }
    env
}

/// The disk-tier survey, run as the image's user before the member starts: a folder that user
/// cannot write stops the Pod here with a message naming the fix (the store would otherwise
/// start and fail each offload later); otherwise it reports how many entries the folder held.
const TIER_SURVEY: &str = "probe=\"$TIER/.kvcache-write-check\"; if ! ( : > \"$probe\" ) 2>/dev/null; then u=$(id -u); echo \"tier path $TIER is not writable by the store image's user (uid $u): create it on the node owned by that user, e.g. install -d -o $u -g 0 -m 0750 $TIER\" | tee /dev/termination-log; exit 1; fi; rm -f \"$probe\"; n=$(ls -A \"$TIER\" | wc -l); echo \"entries=$n path=$TIER\" | tee /dev/termination-log";

/// What a disk tier adds to the member Pod.
struct TierParts {
    env: Vec<EnvVar>,
    volume: Volume,
    mount: VolumeMount,
    pre_stop: Lifecycle,
    survey: Container,
    grace_seconds: i64,
}

/// The store's offload settings for a disk tier, from its declaration (the master's offload
/// flags are derived from the same one).
fn tier_env(g: &Group<'_>, tier: &LocalDisk) -> Result<Vec<EnvVar>, Error> {
    let bucket = BUCKET_BYTES.min(g.segment.max(1));
    let mut env = vec![
        env_value("MOONCAKE_OFFLOAD_ENABLED", "true"),
        env_value("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", tier.path.as_str()),
        env_value(
            "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
            bucket.to_string(),
        ),
        env_value(
            "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
            BUCKET_KEYS.to_string(),
        ),
        env_value(
            "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES",
            TIER_STAGING_BYTES.to_string(),
        ),
    ];
    if let Some(c) = &tier.capacity {
        let cap = bytes(&format!("{}.localDisks[0].capacity", g.field_path), c)?;
        env.push(env_value(
            "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
            cap.to_string(),
        ));
        env.push(env_value(
            "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
            cap.to_string(),
        ));
    }
    if let Some(k) = tier.key_limit {
        env.push(env_value(
            "MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT",
            k.to_string(),
        ));
    }
    if let Some(e) = &tier.eviction {
        env.push(env_value(
            "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION",
            if e.enabled { "true" } else { "false" },
        ));
        if let Some(p) = e.policy {
            env.push(env_value(
                "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY",
                p.as_str(),
            ));
        }
        if let Some(w) = &e.watermark {
            env.push(env_value(
                "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                format!("{:.2}", f64::from(w.high) / 100.0),
            ));
            env.push(env_value(
                "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
                format!("{:.2}", f64::from(w.low) / 100.0),
            ));
        }
    }
    Ok(env)
}

/// The tier's offload settings (the master's offload flags are derived from the same
/// declaration), its hostPath, the preStop hook that deregisters it, and the init container that
/// reports what the folder held at start.
fn disk_tier(g: &Group<'_>, managed: &Managed, tier: &LocalDisk) -> Result<TierParts, Error> {
    let env = tier_env(g, tier)?;
    let seconds = i64::from(
        managed
            .scale_in
            .as_ref()
            .map_or(0, |s| s.grace_period_seconds),
    );
    let script = format!(
        "import json, urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{port}/api/unmount_local_disk', data=json.dumps({{'grace_period_seconds': {seconds}}}).encode(), headers={{'Content-Type': 'application/json'}}, method='POST'), timeout={})",
        seconds + 10,
        port = g.port,
    );
    Ok(TierParts {
        env,
        volume: Volume {
            name: "local-disk".into(),
            host_path: Some(HostPathVolumeSource {
                path: tier.path.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        },
        mount: mount("local-disk", &tier.path, false),
        pre_stop: Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["python3".into(), "-c".into(), script]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        survey: Container {
            name: "tier-survey".into(),
            image: Some(g.image.into()),
            image_pull_policy: Some(g.pull_policy()),
            command: Some(vec!["sh".into(), "-c".into(), TIER_SURVEY.into()]),
            env: Some(vec![env_value("TIER", tier.path.as_str())]),
            volume_mounts: Some(vec![mount("local-disk", &tier.path, false)]),
            termination_message_policy: Some("File".into()),
            security_context: Some(super::pod::restricted_container()),
            resources: Some(super::pod::init_resources()),
            ..Default::default()
        },
        grace_seconds: seconds + SHUTDOWN_MARGIN_SECONDS,
    })
}

/// The group's own hostPath volumes and their mounts.
fn host_paths(group: &MemberGroup) -> (Vec<Volume>, Vec<VolumeMount>) {
    group
        .host_paths
        .iter()
        .enumerate()
        .map(|(j, h)| {
            let name = format!("host-{j}");
            (
                Volume {
                    name: name.clone(),
                    host_path: Some(HostPathVolumeSource {
                        path: h.path.clone(),
                        type_: h.r#type.clone().filter(|t| !t.is_empty()),
                    }),
                    ..Default::default()
                },
                mount(&name, &h.mount_path, h.read_only),
            )
        })
        .unzip()
}

/// The device resources a fabric transport needs: EFA interfaces, or RDMA (shared for one
/// interface, exclusive for more).
fn fabric_limits(g: &Group<'_>) -> BTreeMap<String, K8sQuantity> {
    if !g.fabric() {
        return BTreeMap::new();
    }
    fabric_device(g.protocol, g.group.fabric_interface_count.unwrap_or(1))
}

/// The device request for `count` interfaces of a fabric protocol (docs/design.md#fabric-devices):
/// EFA interfaces, or RDMA (shared for one interface, exclusive for more). Members and engine Pods
/// (`roles[].resources.interface`) ask alike.
pub(crate) fn fabric_device(protocol: Protocol, count: i32) -> BTreeMap<String, K8sQuantity> {
    let (resource, n) = match (protocol, count.max(1)) {
        (Protocol::Efa, n) => ("vpc.amazonaws.com/efa", n),
        (_, 1) => ("device.gpustack.ai/rdma.shared", 1),
        (_, n) => ("device.gpustack.ai/rdma", n),
    };
    BTreeMap::from([(resource.to_owned(), K8sQuantity(n.to_string()))])
}

/// The restricted standard's container settings; a fabric group adds the two capabilities
/// RDMA needs to register memory (`IPC_LOCK` to pin it, `SYS_RESOURCE` to lift the locked
/// memory limit), the one exception the render makes (docs/isolation.md#pod-security); the
/// user's context is laid over it.
fn security(g: &Group<'_>) -> Option<SecurityContext> {
    let mut security = super::pod::restricted_container();
    if g.fabric()
        && let Some(caps) = security.capabilities.as_mut()
    {
        caps.add = Some(vec!["IPC_LOCK".into(), "SYS_RESOURCE".into()]);
    }
    if let Some(user) = &g.group.security_context {
        merge_security(&mut security, user);
    }
    Some(security)
}

/// The user's security context over the rendered one, field by field (what the user sets
/// wins); `capabilities.add` is unioned and `drop` is the user's when given.
fn merge_security(base: &mut SecurityContext, user: &SecurityContext) {
    let rendered = base.clone();
    let granted: Vec<String> = rendered
        .capabilities
        .as_ref()
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    let mut merged = user.clone();
    merged.allow_privilege_escalation = user
        .allow_privilege_escalation
        .or(rendered.allow_privilege_escalation);
    merged.read_only_root_filesystem = user
        .read_only_root_filesystem
        .or(rendered.read_only_root_filesystem);
    let mut caps = user.capabilities.clone().unwrap_or_default();
    let mut add = granted;
    for c in caps.add.take().unwrap_or_default() {
        if !add.contains(&c) {
            add.push(c);
        }
    }
    caps.add = (!add.is_empty()).then_some(add);
    caps.drop = caps
        .drop
        .or_else(|| rendered.capabilities.as_ref().and_then(|c| c.drop.clone()));
    merged.capabilities = Some(caps);
    *base = merged;
}

/// The member's arguments: its REST port (beyond the first group) and `-D` overrides.
fn store_args(g: &Group<'_>) -> Vec<String> {
    let mut args = Vec::new();
    if g.index > 0 {
        args.extend(["--port".to_owned(), g.port.to_string()]);
    }
    for a in &g.group.extra_args {
        args.extend(["-D".to_owned(), a.clone()]);
    }
    args
}

/// One member group's DaemonSet (`OnDelete`; the template's fingerprint in its annotation):
/// the member container, a disk tier's volume, survey and hook, the group's own hostPaths, and
/// the elector's delivery with Lease addressing.
pub(super) fn member_daemon_set(
    inputs: &BackendInputs<'_>,
    managed: &Managed,
    name: &str,
    i: usize,
    group: &MemberGroup,
) -> Result<DaemonSet, Error> {
    let g = Group::new(inputs, managed, name, i, group)?;
    let component = format!("member-{i}");
    let mut env = store_env(&g);
    let (mut volumes, mut mounts) = (Vec::new(), Vec::new());
    let mut init = Vec::new();
    // The same floor admission holds a written request to.
    let request = kvcache_api::backend::member_memory_floor(&g.field_path, group)?;
    let mut lifecycle = None;
    let mut grace = SHUTDOWN_MARGIN_SECONDS;
    if let Some(tier) = group.tier() {
        let parts = disk_tier(&g, managed, tier)?;
        env.extend(parts.env);
        volumes.push(parts.volume);
        mounts.push(parts.mount);
        lifecycle = Some(parts.pre_stop);
        init.push(parts.survey);
        grace = parts.grace_seconds;
    }
    let (host_volumes, host_mounts) = host_paths(group);
    volumes.extend(host_volumes);
    mounts.extend(host_mounts);
    env.extend(group.extra_env.iter().map(EnvVar::from));

    let store = vec!["mc_store_rest_server".to_owned()];
    let command = if g.lease_members {
        env.extend([
            env_value("KVCACHE_ELECTOR_LEASE", leader_name(name)),
            field_env("KVCACHE_ELECTOR_NAMESPACE", "metadata.namespace"),
            // Where the leader elector answers `/identity` (its readiness port).
            env_value(
                "KVCACHE_ELECTOR_LEADER_IDENTITY_PORT",
                super::pod::ELECTOR_PORT.to_string(),
            ),
        ]);
        volumes.push(empty_dir("elector"));
        init.insert(0, elector_install(inputs.elector_image));
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
    let (tmp, tmp_mount) = super::pod::scratch();
    volumes.push(tmp);
    mounts.push(tmp_mount);
    let container = member_container(&g, command, env, mounts, request, lifecycle);
    let labels = backend_labels(name, &component);
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..Default::default()
        }),
        spec: Some(member_pod_spec(
            &g, managed, init, container, volumes, grace,
        )),
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
            inputs.backend,
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

/// The member Pod: on the host network for a fabric group, the elector's account when members
/// find their master by the Lease, the restricted Pod settings, and a grace period that lets a
/// disk tier deregister.
fn member_pod_spec(
    g: &Group<'_>,
    managed: &Managed,
    init: Vec<Container>,
    container: Container,
    volumes: Vec<Volume>,
    grace: i64,
) -> PodSpec {
    let (name, group) = (g.backend, g.group);
    let fabric = g.fabric();
    PodSpec {
        node_selector: (!group.node_selector.is_empty()).then(|| group.node_selector.clone()),
        service_account_name: Some(account(
            g.lease_members
                .then(|| names::object(name, "member"))
                .as_deref(),
        )),
        automount_service_account_token: Some(g.lease_members),
        host_network: fabric.then_some(true),
        dns_policy: Some(
            if fabric {
                "ClusterFirstWithHostNet"
            } else {
                "ClusterFirst"
            }
            .into(),
        ),
        runtime_class_name: group.runtime_class_name.clone(),
        security_context: Some(super::pod::restricted_pod()),
        priority_class_name: managed.priority_class_name.clone(),
        image_pull_secrets: pull_secrets(g.inputs.backend),
        termination_grace_period_seconds: Some(grace),
        init_containers: (!init.is_empty()).then_some(init),
        containers: vec![container],
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..Default::default()
    }
}

/// A member container's requests and limits: the group's `resources` over the defaults (1 CPU,
/// the memory `request` of its segment and staging buffers), with the fabric's device limits
/// (Kubernetes takes an extended resource's request from its limit).
fn member_resources(
    g: &Group<'_>,
    request: u64,
    fabric: BTreeMap<String, K8sQuantity>,
) -> ResourceRequirements {
    let memory = kvcache_api::quantity::format_bytes(request);
    let mut resources = store_resources(g.group.resources.as_ref(), MEMBER_CPU_REQUEST, &memory);
    if !fabric.is_empty() {
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .extend(fabric);
    }
    resources
}

/// The member container: `mc_store_rest_server` (under `kvcache-elector member --` with Lease
/// addressing), its REST port and readiness on it, the memory request (segment, buffer, tier
/// staging), the fabric's devices and capabilities, the preStop hook of a tier.
fn member_container(
    g: &Group<'_>,
    command: Vec<String>,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    request: u64,
    lifecycle: Option<Lifecycle>,
) -> Container {
    let args = store_args(g);
    let limits = fabric_limits(g);
    Container {
        name: "member".into(),
        image: Some(g.image.into()),
        image_pull_policy: Some(g.pull_policy()),
        command: Some(command),
        args: (!args.is_empty()).then_some(args),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("rest".into()),
            container_port: g.port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(g.port),
                host: None,
            }),
            period_seconds: Some(5),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources: Some(member_resources(g, request, limits)),
        lifecycle,
        security_context: security(g),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}
