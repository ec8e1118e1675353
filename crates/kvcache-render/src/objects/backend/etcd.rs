//! The etcd of a warm-failover backend (`leader.electionBackend: Etcd`): a StatefulSet of one
//! or three members behind a headless Service, each with its own claim, and the endpoint list the
//! masters are given. Mooncake keeps its master view at one fixed key
//! (`mooncake-store/master_view`), so every backend has an etcd of its own.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, HTTPGetAction, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SecurityContext as ContainerSecurity, Service, ServicePort, ServiceSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::Leader;
use kvcache_inject::field_env;

use super::pod::{meta, mount, pull_policy, pull_secrets};
use crate::error::Error;
use crate::names::{self, ETCD_CLIENT_PORT, backend_labels, backend_selector, etcd_name};

/// etcd's peer port.
pub(crate) const ETCD_PEER_PORT: i32 = 2380;
/// The claim each etcd Pod gets unless `leader.etcd.storageSize` says otherwise.
pub(crate) const DEFAULT_ETCD_STORAGE: &str = "1Gi";
/// The user etcd runs as (the image's, as the store's).
const ETCD_UID: i64 = super::pod::STORE_UID;
/// Where the claim is mounted; etcd's data directory is a folder inside it, which etcd creates
/// with the mode it insists on.
const DATA_MOUNT: &str = "/var/lib/etcd";

/// The etcd's database quota for a claim of `claim_bytes`: half of it, at most 8 GiB (etcd's
/// own recommended ceiling).
pub(crate) fn etcd_quota(claim_bytes: u64) -> u64 {
    (claim_bytes / 2).min(8 << 30)
}

/// The etcd's objects.
pub(super) struct EtcdObjects {
    pub service: Service,
    pub stateful_set: StatefulSet,
    pub policy: NetworkPolicy,
}

/// Who may reach the etcd (Mooncake's etcd client has no TLS and the etcd no authentication):
/// on the client port the backend's own Pods alone (the masters elect and keep their operation
/// log there; the members' Pods are selected too, by the backend's labels), on the peer port the
/// etcd Pods alone. No bound namespace: engines and members dial the leader Service
/// ([`super::pod::client_endpoint`]), and a tenant that could write the master view would choose
/// where every client of the backend goes.
fn etcd_policy(b: &KVCacheBackend, namespace: &str, backend: &str) -> NetworkPolicy {
    let port = |n: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(n)),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let own = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            "kv-cache-backend".to_owned(),
        ),
        (
            "app.kubernetes.io/instance".to_owned(),
            names::label_value(backend),
        ),
    ]);
    let client_from = vec![NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(own),
            ..Default::default()
        }),
        ..Default::default()
    }];
    NetworkPolicy {
        metadata: meta(
            &etcd_name(backend),
            namespace,
            backend_labels(backend, "etcd"),
            b,
        ),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(backend_selector(backend, "etcd")),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(client_from),
                    ports: Some(vec![port(ETCD_CLIENT_PORT)]),
                },
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        pod_selector: Some(LabelSelector {
                            match_labels: Some(backend_selector(backend, "etcd")),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ports: Some(vec![port(ETCD_PEER_PORT)]),
                },
            ]),
            ..Default::default()
        }),
    }
}

/// The headless Service (peers find each other by name before any is ready), the StatefulSet
/// and the NetworkPolicy of a warm backend's etcd.
pub(super) fn etcd(
    b: &KVCacheBackend,
    namespace: &str,
    leader: &Leader,
    image: &str,
) -> Result<EtcdObjects, Error> {
    let backend = b.metadata.name.clone().unwrap_or_default();
    let spec = leader.etcd.clone().unwrap_or_default();
    let size = spec
        .storage_size
        .map_or_else(|| DEFAULT_ETCD_STORAGE.to_owned(), |q| q.0);
    // The size is checked at admission; judged again so a stored odd value names its field.
    let claim_bytes = kvcache_api::quantity::parse_bytes(&size).map_err(|reason| {
        Error::from(kvcache_api::Error::Quantity {
            field: "spec.connection.managed.leader.etcd.storageSize".into(),
            value: size.clone(),
            reason,
        })
    })?;
    let member = EtcdMember {
        backend: &backend,
        namespace,
        replicas: leader.etcd_replicas().max(1),
    };
    let claim = etcd_claim(&backend, spec.storage_class_name.clone(), size);
    let container = etcd_container(b, &member, image, claim_bytes);
    Ok(EtcdObjects {
        policy: etcd_policy(b, namespace, &backend),
        service: etcd_service(b, &member),
        stateful_set: etcd_stateful_set(b, &member, container, claim),
    })
}

/// What the etcd's objects share: whose it is, where, and how many members.
struct EtcdMember<'a> {
    backend: &'a str,
    namespace: &'a str,
    replicas: i32,
}

/// The etcd container: its flags name every member as an initial peer (a member finds the
/// others under the headless Service), the cluster token is the backend's, and the database
/// quota is half the claim.
fn etcd_container(
    b: &KVCacheBackend,
    member: &EtcdMember<'_>,
    image: &str,
    claim_bytes: u64,
) -> Container {
    let EtcdMember {
        backend,
        namespace,
        replicas,
    } = *member;
    let set = etcd_name(backend);
    let peers = (0..replicas)
        .map(|i| format!("{set}-{i}=http://{set}-{i}.{set}.{namespace}.svc:{ETCD_PEER_PORT}"))
        .collect::<Vec<_>>()
        .join(",");
    let own = format!("$(POD_NAME).{set}.{namespace}.svc");
    let args = vec![
        "--name=$(POD_NAME)".to_owned(),
        format!("--data-dir={DATA_MOUNT}/data"),
        format!("--listen-client-urls=http://0.0.0.0:{ETCD_CLIENT_PORT}"),
        format!("--advertise-client-urls=http://{own}:{ETCD_CLIENT_PORT}"),
        format!("--listen-peer-urls=http://0.0.0.0:{ETCD_PEER_PORT}"),
        format!("--initial-advertise-peer-urls=http://{own}:{ETCD_PEER_PORT}"),
        format!("--initial-cluster={peers}"),
        "--initial-cluster-state=new".to_owned(),
        // A token per backend: members of another backend's etcd can never join this one.
        format!(
            "--initial-cluster-token={}",
            b.metadata.uid.as_deref().unwrap_or(backend)
        ),
        // etcd refuses writes (an alarm, not a crash) once its database reaches the quota; half
        // the claim leaves room for the write-ahead log and snapshots beside it.
        format!("--quota-backend-bytes={}", etcd_quota(claim_bytes)),
        "--auto-compaction-mode=periodic".to_owned(),
        "--auto-compaction-retention=10m".to_owned(),
    ];
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(ETCD_CLIENT_PORT),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    Container {
        name: "etcd".into(),
        image: Some(image.into()),
        image_pull_policy: Some(pull_policy(b.spec.image_pull_policy, image)),
        command: Some(vec!["etcd".into()]),
        args: Some(args),
        env: Some(vec![field_env("POD_NAME", "metadata.name")]),
        ports: Some(vec![
            ContainerPort {
                name: Some("client".into()),
                container_port: ETCD_CLIENT_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("peer".into()),
                container_port: ETCD_PEER_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        // `/readyz` fails without a quorum; `/livez` only when the server itself is stuck.
        readiness_probe: Some(probe("/readyz", 2, 3)),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(15),
            ..probe("/livez", 10, 6)
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                (
                    "cpu".to_owned(),
                    K8sQuantity(kvcache_api::resources::ETCD_CPU_REQUEST.into()),
                ),
                ("memory".to_owned(), K8sQuantity("64Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(ContainerSecurity {
            run_as_non_root: Some(true),
            ..super::pod::restricted_container()
        }),
        volume_mounts: Some(vec![mount("data", DATA_MOUNT, false)]),
        ..Default::default()
    }
}

/// The claim template each etcd member gets (`data`, of `size`).
fn etcd_claim(
    backend: &str,
    storage_class_name: Option<String>,
    size: String,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            labels: Some(backend_labels(backend, "etcd")),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name,
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), K8sQuantity(size))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The headless Service: it publishes members before they are ready, since peers must find
/// each other by name to form the cluster at all.
fn etcd_service(b: &KVCacheBackend, member: &EtcdMember<'_>) -> Service {
    let set = etcd_name(member.backend);
    Service {
        metadata: meta(
            &set,
            member.namespace,
            backend_labels(member.backend, "etcd"),
            b,
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(backend_selector(member.backend, "etcd")),
            ports: Some(vec![
                ServicePort {
                    name: Some("client".into()),
                    port: ETCD_CLIENT_PORT,
                    target_port: Some(IntOrString::String("client".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("peer".into()),
                    port: ETCD_PEER_PORT,
                    target_port: Some(IntOrString::String("peer".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The StatefulSet: `Parallel` so that three members start together and form their cluster,
/// claims deleted with the backend, members preferring separate nodes.
fn etcd_stateful_set(
    b: &KVCacheBackend,
    member: &EtcdMember<'_>,
    container: Container,
    claim: PersistentVolumeClaim,
) -> StatefulSet {
    let backend = member.backend;
    let set = etcd_name(backend);
    let labels = backend_labels(backend, "etcd");
    StatefulSet {
        metadata: meta(&set, member.namespace, labels.clone(), b),
        spec: Some(StatefulSetSpec {
            replicas: Some(member.replicas),
            service_name: Some(set.clone()),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(backend_selector(backend, "etcd")),
                ..Default::default()
            },
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Delete".into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(etcd_pod(b, backend, container)),
            },
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An etcd member's Pod: one member per node where the nodes allow it (a node lost costs one
/// member, and the quorum survives it), no service-account token, the store's priority class.
fn etcd_pod(b: &KVCacheBackend, backend: &str, container: Container) -> PodSpec {
    PodSpec {
        affinity: Some(names::prefer_separate_nodes(backend_selector(
            backend, "etcd",
        ))),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        priority_class_name: b
            .spec
            .connection
            .managed
            .as_ref()
            .and_then(|m| m.priority_class_name.clone()),
        image_pull_secrets: pull_secrets(b),
        // The store Pods' restricted settings (etcd's image runs as the same user), with the
        // claim owned by that user.
        security_context: Some(PodSecurityContext {
            fs_group: Some(ETCD_UID),
            ..super::pod::restricted_pod()
        }),
        containers: vec![container],
        ..Default::default()
    }
}
