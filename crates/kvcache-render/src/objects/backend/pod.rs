//! What every store Pod and object of a backend shares: its ports, names and addresses, its
//! metadata and owner, the restricted security contexts, the scratch volumes, the image pull
//! settings, the elector's install container, the template fingerprint.

use crate::error::Error;
use crate::names::{self};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, LocalObjectReference, PodSecurityContext,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::PullPolicy;
use kvcache_api::resources::StoreResources;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

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

pub(crate) fn owner(b: &KVCacheBackend) -> Option<Vec<OwnerReference>> {
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

pub(crate) fn meta(
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

pub(crate) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
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

pub(crate) fn empty_dir(name: &str) -> Volume {
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

pub(crate) fn bytes(field: &str, q: &kvcache_api::Quantity) -> Result<u64, Error> {
    q.bytes(field).map_err(Error::from)
}

pub(crate) fn pull_secrets(b: &KVCacheBackend) -> Option<Vec<LocalObjectReference>> {
    (!b.spec.image_pull_secrets.is_empty()).then(|| b.spec.image_pull_secrets.clone())
}

/// The container that copies `kvcache-elector` out of the elector image.
pub(crate) fn elector_install(elector_image: &str) -> Container {
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

/// The first and last port a member's transfer engine may listen on, for its handshake and
/// its TCP data listener alike (each a port picked at random in the range, one per process).
/// Eight, not two: a port the member held is kept in `TIME_WAIT` for a minute after its
/// process ends, and a store restarted in the same Pod within that minute needs two others
/// (seen with the 0.3.13.post1 wheel: with a range of two the restarted member failed
/// "P2P: No valid port found for local TCP service" until the minute passed). The members'
/// NetworkPolicy names these ports (`access.rs`).
pub const TRANSFER_PORTS: (i32, i32) = (15000, 15007);

/// The variables that carry [`TRANSFER_PORTS`] (the store's names for the range it picks its
/// transfer engine's ports from): rendered for a group off the host network unless its
/// `extraEnv` names them. A fabric group on the host network keeps the store's default range:
/// no policy covers it, and the node's other store processes pick from the same ports.
pub const TRANSFER_PORT_ENV: [&str; 2] = ["MC_MIN_RPC_PORT", "MC_MAX_RPC_PORT"];
