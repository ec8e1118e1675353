//! A ModelDeployment as Kubernetes objects: one Deployment per role running the engine, its
//! store settings injected when `kvCache` is set, and a Service for the serving role.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, HTTPGetAction, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::backend::Protocol;
use kvcache_api::manifest::ObjectRef;
use kvcache_api::model::{
    EngineName, EngineNetworkPolicy, InstanceType, ModelDeployment, Role, RoleKind,
};
use kvcache_api::quantity::parse_millicores;
use kvcache_inject::{
    CLIENT_CONFIG_ANNOTATION, INJECTED_ANNOTATION, LOCAL_BUFFER_BYTES, Ledger, Request, Source,
};

use crate::error::Error;
use crate::names;
use crate::objects::backend::pull_policy;
use crate::objects::desired::{DesiredSet, ObjectKind};
use crate::objects::engine_access;

pub use crate::names::SERVING_PORT;
/// `/dev/shm` per role.
pub(crate) const SHM_SIZE: &str = "16Gi";

/// The resolved cache attachment of a deployment.
#[derive(Clone, Debug)]
pub struct Attachment {
    /// Name of the KVCachePoolBinding, in the deployment's namespace.
    pub binding: String,
    /// The Binding's tenant id: its `spec.domain.name`, `default` when empty.
    pub domain: String,
    /// The Binding's `spec.domain.dtype`, handed to engines as `--kv-cache-dtype` when
    /// `dtype_owned`.
    pub dtype: String,
    /// Whether the backend keeps a tenant ledger, as declared (`leader.multiTenancy`; assumed
    /// for an external backend). The Pod webhook uses the pool's `QuotaLedgerAvailable` instead.
    pub ledger: Ledger,
    /// The pool's client endpoint.
    pub client_endpoint: Option<String>,
    /// The effective protocols of the backend's groups.
    pub protocols: Vec<Protocol>,
    /// The store version, from the backend's image.
    pub store_version: Option<String>,
    /// The `model-deployment-kv-cache-dtype-owned` setting: whether the operator sets
    /// `--kv-cache-dtype` and refuses a role's own.
    pub dtype_owned: bool,
}

/// What rendering a deployment takes.
#[derive(Clone, Debug)]
pub struct ModelInputs<'a> {
    /// The ModelDeployment to render: one Deployment per role.
    pub deployment: &'a ModelDeployment,
    /// InstanceTypes by name.
    pub instance_types: &'a BTreeMap<String, InstanceType>,
    /// The cache attachment, when `spec.kvCache` is set.
    pub attachment: Option<&'a Attachment>,
}

/// The objects of one deployment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelObjects {
    /// One per role.
    pub deployments: Vec<Deployment>,
    /// For the serving role.
    pub services: Vec<Service>,
    /// One per role unless `spec.networkPolicy` is `Unmanaged` (crate::objects::engine_access).
    pub network_policies: Vec<NetworkPolicy>,
}

/// Every kind a ModelDeployment's role objects come in, the order its sweep lists them in.
pub(crate) const MODEL_KINDS: &[ObjectKind] = &[
    ObjectKind::of::<Deployment>(),
    ObjectKind::of::<Service>(),
    ObjectKind::of::<NetworkPolicy>(),
];

impl ModelObjects {
    /// The objects in the order a pass writes them ([`DesiredSet`]): the policies first, so a
    /// role's Pods never run before what closes them.
    pub fn desired(&self) -> DesiredSet {
        let mut set = DesiredSet::new(MODEL_KINDS);
        set.apply_all(&self.network_policies);
        set.apply_all(&self.deployments);
        set.apply_all(&self.services);
        set
    }
}

/// The runner image for an engine version on an accelerator
/// (`gpustack/runner:<backend><runtime>-<engine><version>`).
pub(crate) fn runner_image(
    engine: EngineName,
    version: &str,
    manufacturer: Option<&str>,
) -> String {
    let backend = match manufacturer {
        Some("nvidia") => "cuda12.9",
        Some("ascend") => "cann8.2",
        Some("amd") => "rocm6.4",
        _ => "cpu",
    };
    let engine = match engine {
        EngineName::Vllm => "vllm",
        EngineName::Sglang => "sglang",
    };
    format!("gpustack/runner:{backend}-{engine}{version}")
}

fn labels(md: &str, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::NAME_LABEL.into(), names::MODEL_NAME.into()),
        (names::INSTANCE_LABEL.into(), names::label_value(md)),
        (names::COMPONENT_LABEL.into(), names::label_value(role)),
        (names::MANAGED_BY_LABEL.into(), names::OPERATOR.into()),
    ])
}

/// The ports a role's container declares: the engine's `http` (where it serves: the role's own
/// `--port` when its arguments set one, else [`SERVING_PORT`]), then `roles[].ports`. The
/// readiness probe, the Service and the role's NetworkPolicy follow `http`.
fn declared_ports(md: &ModelDeployment, role: &Role) -> Result<Vec<ContainerPort>, Error> {
    let parser =
        kvcache_inject::engines::row(md.spec.engine.name, None).map_err(injection_error(
            md.metadata.namespace.as_deref().unwrap_or("default"),
            md.metadata.name.as_deref().unwrap_or_default(),
            role,
        ))?;
    let serving = if role.command.is_empty() {
        kvcache_inject::argv::value_of(&role.extra_args, "--port", parser)
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|p| (1..=65535).contains(p))
            .unwrap_or(SERVING_PORT)
    } else {
        SERVING_PORT
    };
    Ok(std::iter::once(ContainerPort {
        name: Some("http".into()),
        container_port: serving,
        protocol: Some("TCP".into()),
        ..Default::default()
    })
    .chain(role.ports.iter().cloned())
    .collect())
}

/// The labels that select a role's Pods (those of [`labels`] but `managed-by`).
fn pod_selector(md: &str, role: &str) -> BTreeMap<String, String> {
    labels(md, role)
        .into_iter()
        .filter(|(k, _)| k != names::MANAGED_BY_LABEL)
        .collect()
}

/// Renders a deployment's objects.
pub fn render(inputs: &ModelInputs<'_>) -> Result<ModelObjects, Error> {
    let md = inputs.deployment;
    let name = md.metadata.name.clone().unwrap_or_default();
    let ns = md
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let owner = md.metadata.uid.clone().map(|uid| {
        vec![OwnerReference {
            api_version: format!("{}/{}", kvcache_api::GROUP, kvcache_api::VERSION),
            kind: "ModelDeployment".into(),
            name: name.clone(),
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    });
    let mut out = ModelObjects::default();
    for role in &md.spec.roles {
        out.deployments
            .push(role_deployment(inputs, &name, &ns, owner.clone(), role)?);
        if md.spec.network_policy == EngineNetworkPolicy::DeclaredPorts {
            let declared = declared_ports(md, role)?;
            out.network_policies
                .push(engine_access::engine_policy(&engine_access::EnginePods {
                    name: &names::object(&name, &role.name),
                    namespace: &ns,
                    labels: labels(&name, &role.name),
                    owner: owner.clone(),
                    selector: pod_selector(&name, &role.name),
                    own: BTreeMap::from([
                        (names::NAME_LABEL.into(), names::MODEL_NAME.into()),
                        (names::INSTANCE_LABEL.into(), names::label_value(&name)),
                    ]),
                    declared: &declared,
                }));
        }
    }
    if let Some(serving) = md.spec.roles.iter().find(|r| r.kind == RoleKind::Server) {
        out.services.push(Service {
            metadata: ObjectMeta {
                name: Some(names::object(&name, "")),
                namespace: Some(ns.clone()),
                labels: Some(labels(&name, &serving.name)),
                owner_references: owner,
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(pod_selector(&name, &serving.name)),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: SERVING_PORT,
                    target_port: Some(IntOrString::String("http".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    Ok(out)
}

/// An injection failure, naming the deployment and role.
fn injection_error(
    ns: &str,
    name: &str,
    role: &Role,
) -> impl FnOnce(kvcache_inject::Error) -> Error {
    let (deployment, role) = (format!("{ns}/{name}"), role.name.clone());
    move |source| Error::Injection {
        deployment,
        role,
        source,
    }
}

/// The engine's command line: the role's own when it takes over (`roles[].command`), else the
/// engine's launcher with the model, a host and port unless the role sets them, then its
/// `extraArgs`.
fn launch(
    md: &ModelDeployment,
    role: &Role,
    ns: &str,
    name: &str,
) -> Result<(Vec<String>, Vec<String>), Error> {
    if !role.command.is_empty() {
        return Ok((role.command.clone(), role.extra_args.clone()));
    }
    let engine = md.spec.engine.name;
    let (command, mut args): (Vec<String>, Vec<String>) = match engine {
        EngineName::Vllm => (
            vec!["vllm".into(), "serve".into()],
            vec![md.spec.model.name.clone()],
        ),
        EngineName::Sglang => (
            vec!["python3".into(), "-m".into(), "sglang.launch_server".into()],
            vec!["--model-path".into(), md.spec.model.name.clone()],
        ),
    };
    // The engine's own parser decides whether the role already sets these (`--port=8000`,
    // an abbreviation argparse accepts, vLLM's underscores).
    let parser =
        kvcache_inject::engines::row(engine, None).map_err(injection_error(ns, name, role))?;
    if kvcache_inject::argv::find(&role.extra_args, "--host", parser).is_none() {
        args.extend(["--host".into(), "0.0.0.0".into()]);
    }
    if kvcache_inject::argv::find(&role.extra_args, "--port", parser).is_none() {
        args.extend(["--port".into(), SERVING_PORT.to_string()]);
    }
    args.extend(role.extra_args.iter().cloned());
    Ok((command, args))
}

/// What a role's replica asks for: the InstanceType's per-accelerator CPU and memory times the
/// accelerators it uses (at least one share), and the accelerators as a limit.
struct Sizing {
    millicores: u64,
    memory_bytes: u64,
    limits: BTreeMap<String, K8sQuantity>,
}

fn sizing(it: &InstanceType, role: &Role) -> Result<Sizing, Error> {
    let cards = role
        .resources
        .as_ref()
        .and_then(|r| r.accelerator)
        .unwrap_or(0)
        .max(0);
    let per = u64::try_from(cards.max(1)).unwrap_or(1);
    let memory = it.spec.resources.memory.bytes(&format!(
        "InstanceType {}.spec.resources.memory",
        role.instance_type
    ))?;
    let cpu = parse_millicores(&it.spec.resources.cpu.0).map_err(|source| Error::Cpu {
        instance_type: role.instance_type.clone(),
        value: it.spec.resources.cpu.0.clone(),
        source,
    })?;
    let mut limits = BTreeMap::new();
    if cards > 0
        && let Some(acc) = &it.spec.accelerator
    {
        limits.insert(acc.resource_name.clone(), K8sQuantity(cards.to_string()));
    }
    Ok(Sizing {
        millicores: cpu.saturating_mul(per),
        memory_bytes: memory.saturating_mul(per),
        limits,
    })
}

/// The engine container before any cache settings: image, command, the serving port and its
/// health probe, shared memory.
fn engine_container(
    role: &Role,
    ports: Vec<ContainerPort>,
    image: &str,
    command: Vec<String>,
    args: Vec<String>,
) -> Container {
    Container {
        name: "engine".into(),
        image: Some(image.to_owned()),
        image_pull_policy: Some(pull_policy(role.image_pull_policy, image)),
        command: Some(command),
        args: Some(args),
        env: (!role.env.is_empty()).then(|| role.env.clone()),
        ports: Some(ports),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/health".into()),
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "shm".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// What attaching a role to its cache changes in the Pod.
struct Attached {
    container: Container,
    volume: Option<Volume>,
    annotations: BTreeMap<String, String>,
    extra_memory_bytes: u64,
}

/// The store settings for an attached role, through the same `kvcache-inject` entry point the
/// Pod webhook uses.
fn attach(
    md: &ModelDeployment,
    att: &Attachment,
    role: &Role,
    manufacturer: Option<&str>,
    container: &Container,
    (ns, name): (&str, &str),
) -> Result<Attached, Error> {
    let row =
        kvcache_inject::engines::row(md.spec.engine.name, manufacturer.filter(|m| *m == "ascend"))
            .map_err(injection_error(ns, name, role))?;
    let req = Request {
        source: Source::ModelDeployment,
        engine: row,
        role: role.kind,
        binding: &att.binding,
        domain: &att.domain,
        ledger: att.ledger.clone(),
        dtype: &att.dtype,
        dtype_owned: att.dtype_owned,
        client_endpoint: att.client_endpoint.as_deref(),
        protocols: &att.protocols,
        store_version: att.store_version.as_deref(),
        engine_version: md
            .spec
            .engine
            .version
            .as_deref()
            .filter(|_| role.image.is_none()),
        container: &Container {
            args: Some(role.extra_args.clone()),
            env: Some(role.env.clone()),
            ..Default::default()
        },
        pod_volumes: &[],
        launch_args_forwarded: false,
    };
    let injection = kvcache_inject::inject(&req).map_err(injection_error(ns, name, role))?;
    let mut annotations = BTreeMap::new();
    let mut extra_memory_bytes = 0;
    if let Some(doc) = &injection.client_config {
        annotations.insert(CLIENT_CONFIG_ANNOTATION.to_owned(), doc.clone());
        extra_memory_bytes = LOCAL_BUFFER_BYTES;
    }
    annotations.insert(INJECTED_ANNOTATION.to_owned(), injection.record_json());
    Ok(Attached {
        container: injection.apply(container),
        volume: injection.volume.clone(),
        annotations,
        extra_memory_bytes,
    })
}

/// The engine's shared memory: an in-memory `emptyDir` of [`SHM_SIZE`] at `/dev/shm`.
fn shm_volume() -> Volume {
    Volume {
        name: "shm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(K8sQuantity(SHM_SIZE.into())),
        }),
        ..Default::default()
    }
}

/// A role container's requests (its CPU and memory) and limits (its accelerators).
fn requirements(size: Sizing) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            (
                "cpu".to_owned(),
                K8sQuantity(format!("{}m", size.millicores)),
            ),
            (
                "memory".to_owned(),
                K8sQuantity(kvcache_api::quantity::format_bytes(size.memory_bytes)),
            ),
        ])),
        limits: (!size.limits.is_empty()).then_some(size.limits),
        ..Default::default()
    }
}

fn role_deployment(
    inputs: &ModelInputs<'_>,
    name: &str,
    ns: &str,
    owner: Option<Vec<OwnerReference>>,
    role: &Role,
) -> Result<Deployment, Error> {
    let md = inputs.deployment;
    let it = inputs
        .instance_types
        .get(&role.instance_type)
        .ok_or_else(|| Error::Missing {
            referrer: Box::new(ObjectRef::new("ModelDeployment", &md.metadata)),
            field: "spec.roles[].instanceType",
            kind: "InstanceType",
            name: role.instance_type.clone(),
            hint: "; kubectl get instancetype lists those that do",
        })?;
    let manufacturer = it
        .spec
        .accelerator
        .as_ref()
        .and_then(|a| a.manufacturer.as_deref());
    let version = md.spec.engine.version.clone().unwrap_or_default();
    let image = role
        .image
        .clone()
        .unwrap_or_else(|| runner_image(md.spec.engine.name, &version, manufacturer));
    let (command, args) = launch(md, role, ns, name)?;
    let mut size = sizing(it, role)?;
    let mut container = engine_container(role, declared_ports(md, role)?, &image, command, args);
    let mut volumes = vec![shm_volume()];
    let mut annotations = BTreeMap::new();
    // A role that takes over its command gets no store settings (the escape hatch).
    if let (Some(att), true) = (inputs.attachment, role.command.is_empty()) {
        let attached = attach(md, att, role, manufacturer, &container, (ns, name))?;
        container = attached.container;
        volumes.extend(attached.volume);
        annotations = attached.annotations;
        size.memory_bytes = size
            .memory_bytes
            .saturating_add(attached.extra_memory_bytes);
        // Fabric interfaces per Pod, on the one fabric protocol admission let through
        // (docs/design.md#fabric-interfaces).
        let interfaces = role.resources.as_ref().and_then(|r| r.interface);
        if let (Some(n), [p, rest @ ..]) = (interfaces.filter(|n| *n > 0), &att.protocols[..])
            && matches!(p, Protocol::Rdma | Protocol::Efa)
            && rest.iter().all(|q| q == p)
        {
            size.limits
                .extend(crate::objects::backend::fabric_device(*p, n));
        }
    }
    container.resources = Some(requirements(size));
    let labels = labels(name, &role.name);
    let selector = pod_selector(name, &role.name);
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(names::object(name, &role.name)),
            namespace: Some(ns.to_owned()),
            labels: Some(labels.clone()),
            owner_references: owner,
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(role.replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: (!annotations.is_empty()).then_some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    node_selector: (!it.spec.node_selector.is_empty())
                        .then(|| it.spec.node_selector.clone()),
                    tolerations: (!it.spec.tolerations.is_empty())
                        .then(|| it.spec.tolerations.clone()),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}
