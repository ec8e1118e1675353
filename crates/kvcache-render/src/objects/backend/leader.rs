//! The leader: the master's flags and the Deployment that runs it (through the elector when it
//! has standbys).

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EnvVar, HTTPGetAction, PodSpec,
    PodTemplateSpec, Probe, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::backend::Managed;
use kvcache_api::resources::{LEADER_CPU_REQUEST, LEADER_MEMORY_REQUEST};
use kvcache_inject::{env as env_value, field_env};
use kvcache_quota::policy::{POLICY_KEY, POLICY_PATH, PolicyDocument};

use super::inputs::BackendInputs;
use super::pod::*;
use crate::error::Error;
use crate::names::{self, backend_labels, backend_selector};

/// With `electionBackend: Etcd`: Mooncake's own election on the backend's etcd and its
/// metadata operation log; the master binds and advertises its Pod IP (the etcd view holds the
/// address members and engines dial). Standbys replay the log, so the one that takes over
/// already knows every key (`docs/warm-failover.md`).
fn warm_flags(managed: &Managed, namespace: &str, backend: &str) -> Vec<String> {
    if !managed.leader.warm() {
        return Vec::new();
    }
    vec![
        "-rpc_address=$(POD_IP)".into(),
        "-enable_ha=true".into(),
        "-ha_backend_type=etcd".into(),
        format!(
            "-etcd_endpoints={}",
            crate::names::etcd_endpoints(backend, namespace, &managed.leader)
        ),
        "-enable_oplog=true".into(),
    ]
}

/// The master's flags, in the documented order, `extraArgs` last (the store takes the last
/// duplicate, so a user `default_kv_lease_ttl` wins). `namespace` and `backend` name the
/// etcd of a warm backend.
pub fn master_flags(managed: &Managed, namespace: &str, backend: &str) -> Vec<String> {
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
    flags.extend(warm_flags(managed, namespace, backend));
    flags.extend(
        leader
            .extra_args
            .iter()
            .map(|a| format!("-{}", a.trim_start_matches('-'))),
    );
    flags
}

/// The leader Deployment: `Recreate` at one replica, a surge of one above; the master container
/// (under the elector when it elects), the elector's delivery and the tenant policy's seed.
pub(super) fn leader_deployment(
    inputs: &BackendInputs<'_>,
    managed: &Managed,
    name: &str,
    leader: &str,
) -> Result<Deployment, Error> {
    let b = inputs.backend;
    let l = &managed.leader;
    let elects = l.elects();
    let replicas = if elects || l.warm() {
        l.replicas.max(1)
    } else {
        1
    };
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
    ];
    let mut volumes = Vec::new();
    let mut init = Vec::new();
    let mut mounts = Vec::new();
    if elects {
        env.extend(elector_env(leader));
        volumes.push(empty_dir("elector"));
        init.push(elector_install(inputs.elector_image));
        mounts.push(mount("elector", "/kvcache/bin", true));
    }
    env.extend(l.extra_env.iter().map(EnvVar::from));
    if l.multi_tenancy {
        volumes.push(empty_dir("tenant-policy"));
        volumes.push(Volume {
            name: "tenant-policy-seed".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::object(name, "tenant-policy"),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("tenant-policy", "/var/lib/mooncake", false));
        init.push(tenant_policy_seed(inputs));
    }
    let (tmp, tmp_mount) = super::pod::scratch();
    volumes.push(tmp);
    mounts.push(tmp_mount);
    let labels = backend_labels(name, "leader");
    Ok(Deployment {
        metadata: meta(leader, inputs.namespace, labels.clone(), b),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(backend_selector(name, "leader")),
                ..Default::default()
            },
            strategy: Some(strategy(replicas)),
            // One replica is ever available under election, so the deadline cannot be met:
            // RolloutComplete answers instead.
            progress_deadline_seconds: Some(i32::MAX),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(account(elects.then_some(leader))),
                    automount_service_account_token: Some(elects),
                    priority_class_name: managed.priority_class_name.clone(),
                    image_pull_secrets: pull_secrets(b),
                    security_context: Some(super::pod::restricted_pod()),
                    init_containers: (!init.is_empty()).then_some(init),
                    containers: vec![master_container(inputs, managed, env, mounts)],
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The elector's settings in leader mode: the Lease, its identity, the address it publishes,
/// the master's health to watch, its own readiness port.
fn elector_env(lease: &str) -> [EnvVar; 7] {
    [
        env_value("KVCACHE_ELECTOR_LEASE", lease),
        field_env("KVCACHE_ELECTOR_NAMESPACE", "metadata.namespace"),
        field_env("KVCACHE_ELECTOR_IDENTITY", "metadata.name"),
        env_value("KVCACHE_ELECTOR_ADDRESS", format!("$(POD_IP):{RPC_PORT}")),
        env_value(
            "KVCACHE_ELECTOR_CHILD_HEALTH_URL",
            format!("http://127.0.0.1:{ADMIN_PORT}/health"),
        ),
        env_value(
            "KVCACHE_ELECTOR_READY_ADDR",
            format!("0.0.0.0:{ELECTOR_PORT}"),
        ),
        env_value("KVCACHE_ELECTOR_LABEL_POD", "true"),
    ]
}

/// The init container that seeds the master's writable tenant policy from the ConfigMap, or
/// writes the empty document when the ConfigMap is not there yet.
fn tenant_policy_seed(inputs: &BackendInputs<'_>) -> Container {
    let image = inputs.store_image;
    Container {
        name: "tenant-policy-seed".into(),
        image: Some(image.into()),
        image_pull_policy: Some(pull_policy(inputs.backend.spec.image_pull_policy, image)),
        command: Some(vec!["sh".into(), "-c".into(), "if [ -f \"$SEED\" ]; then cp \"$SEED\" \"$TARGET\"; else printf '%s\\n' \"$EMPTY\" > \"$TARGET\"; fi".into()]),
        env: Some(vec![
            env_value("SEED", format!("/seed/{POLICY_KEY}")),
            env_value("TARGET", POLICY_PATH),
            env_value("EMPTY", PolicyDocument::empty().to_yaml().trim_end()),
        ]),
        volume_mounts: Some(vec![mount("tenant-policy", "/var/lib/mooncake", false), mount("tenant-policy-seed", "/seed", true)]),
        security_context: Some(super::pod::restricted_container()),
        resources: Some(super::pod::init_resources()),
        ..Default::default()
    }
}

/// The master container: `mooncake_master` with its flags, under `kvcache-elector leader --`
/// when it elects; probes on the elector then, on the master's admin port otherwise.
fn master_container(
    inputs: &BackendInputs<'_>,
    managed: &Managed,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    let elects = managed.leader.elects();
    let image = inputs.store_image;
    let master: Vec<String> = std::iter::once("mooncake_master".to_owned())
        .chain(master_flags(
            managed,
            inputs.namespace,
            inputs.backend.metadata.name.as_deref().unwrap_or_default(),
        ))
        .collect();
    let command = if elects {
        std::iter::once(ELECTOR_PATH.to_owned())
            .chain(["leader".to_owned(), "--".to_owned()])
            .chain(master)
            .collect()
    } else {
        master
    };
    let (mut ready, live) = if elects {
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
    // The leader Service sends clients to a new leader only once its Pod is Ready: probed
    // every second, a handover is not padded by up to a probe period. Falling out of the
    // Service still takes 10 failed probes (the elector answers 503 at once on losing the
    // Lease; a slow master is not dropped for a 3 s stall).
    ready.period_seconds = Some(1);
    ready.failure_threshold = Some(10);
    let mut ports = vec![port("rpc", RPC_PORT), port("admin", ADMIN_PORT)];
    if elects {
        ports.push(port("elector", ELECTOR_PORT));
    }
    Container {
        name: "master".into(),
        image: Some(image.into()),
        image_pull_policy: Some(pull_policy(inputs.backend.spec.image_pull_policy, image)),
        command: Some(command),
        env: Some(env),
        ports: Some(ports),
        readiness_probe: Some(ready),
        resources: Some(store_resources(
            managed.leader.resources.as_ref(),
            LEADER_CPU_REQUEST,
            LEADER_MEMORY_REQUEST,
        )),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(10),
            ..live
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(super::pod::restricted_container()),
        ..Default::default()
    }
}

/// `Recreate` at one replica (two masters never run side by side); above one a rolling update
/// with a surge of one that may take every old replica down (only one serves anyway).
fn strategy(replicas: i32) -> DeploymentStrategy {
    if replicas == 1 {
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
    }
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
