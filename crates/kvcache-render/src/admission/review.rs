//! The admission judgement of objects, as one pure decision that both the offline
//! `kvcache-operator validate` and the admission webhook make: single-object admission
//! (`kvcache-api`), cross-object claims (`kvcache-quota`), owned keys on attached roles
//! (`kvcache-inject`) and unknown fields.
//!
//! It lives here because this is the one pure crate that already sees all three rule sources;
//! a crate of its own would repeat this crate's dependencies for one module.

use std::fmt;

use crate::world::World;
use kvcache_api::Settings;
use kvcache_api::admission::Verdict;
use kvcache_api::backend::Protocol;
use kvcache_api::manifest::{Manifest, Object, ObjectRef};
use kvcache_quota::claims::{self, FindingKind};

/// Whether the object is new or replaces a stored one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No stored object of that kind, namespace and name.
    Create,
    /// Judged as an update of the stored object.
    Update,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Create => "create",
            Mode::Update => "update",
        })
    }
}

/// The API server's cause type for a refused field (`metav1.CauseType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// `FieldValueInvalid`.
    Invalid,
    /// `FieldValueDuplicate`: the value is already held by another object.
    Duplicate,
    /// `FieldValueForbidden`: not allowed given other objects.
    Forbidden,
    /// `FieldValueNotSupported`: a field the kind does not have (strict decoding).
    UnknownField,
}

impl Cause {
    /// The `metav1.CauseType` string.
    pub fn cause_type(self) -> &'static str {
        match self {
            Cause::Invalid => "FieldValueInvalid",
            Cause::Duplicate => "FieldValueDuplicate",
            Cause::Forbidden => "FieldValueForbidden",
            Cause::UnknownField => "FieldValueNotSupported",
        }
    }
}

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The manifest path (`spec.domain.name`).
    pub field: String,
    /// The API server's cause type for the field, e.g. `FieldValueDuplicate`.
    pub cause: Cause,
    /// Why, and what to do instead.
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            Cause::Duplicate => write!(f, "{}: Duplicate: {}", self.field, self.message),
            _ => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

/// The judgement of one object: what the CLI prints and the webhook answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Review {
    /// The object judged, printed as `kind namespace/name`.
    pub object: ObjectRef,
    /// Create or update.
    pub mode: Mode,
    /// Every refused field; the object is admitted only when this is empty.
    pub refusals: Vec<Refusal>,
    /// Admitted, but the user should know.
    pub warnings: Vec<String>,
}

impl Review {
    /// Whether the object is admitted.
    pub fn allowed(&self) -> bool {
        self.refusals.is_empty()
    }
}

/// The owned-key rules on each attached, non-take-over role (kvcache-inject's table).
fn role_keys(md: &kvcache_api::ModelDeployment, settings: &Settings) -> Vec<Refusal> {
    if md.spec.kv_cache.is_none() {
        return Vec::new();
    }
    let row = match kvcache_inject::engines::row(md.spec.engine.name, None) {
        Ok(row) => row,
        Err(e) => {
            return vec![Refusal {
                field: "spec.engine.name".into(),
                cause: Cause::Invalid,
                message: e.to_string(),
            }];
        }
    };
    md.spec
        .roles
        .iter()
        .enumerate()
        .filter(|(_, r)| r.command.is_empty())
        .filter_map(|(i, r)| {
            kvcache_inject::check_role_keys(
                row,
                &r.extra_args,
                &r.env,
                settings.kv_cache_dtype_owned,
            )
            .err()
            .map(|e| Refusal {
                field: format!("spec.roles[{i}]"),
                cause: Cause::Invalid,
                message: e.to_string(),
            })
        })
        .collect()
}

/// The first store version whose master has multi-tenancy (`--enable_multi_tenants`).
pub(crate) const MULTI_TENANT_STORE: [u64; 3] = [0, 3, 12];

/// The store image version rule (docs/design.md#store-image-version): a managed backend whose
/// image runs a master older than 0.3.12 must declare `leader.multiTenancy: false`, because the
/// render gives such a master the multi-tenant flags and it exits on the first unknown one. Judged when the backend
/// is created or when its image or that field moves (ratcheting: a stored backend stays
/// updatable when the setting's image changes). An image whose tag names no version is not
/// judged. High availability needs nothing of the image: the render's election runs in
/// `kvcache-elector`, shipped in the operator's image, not in the master.
fn store_image_rule(
    b: &kvcache_api::KVCacheBackend,
    old: Option<&kvcache_api::KVCacheBackend>,
    settings: &Settings,
) -> Option<Refusal> {
    let managed = b.spec.connection.managed.as_ref()?;
    if !managed.leader.multi_tenancy {
        return None;
    }
    if let Some(old) = old {
        let was = old
            .spec
            .connection
            .managed
            .as_ref()
            .map(|m| m.leader.multi_tenancy);
        if old.spec.image == b.spec.image && was == Some(true) {
            return None;
        }
    }
    let (image, version) = image_older_than(b, settings, MULTI_TENANT_STORE)?;
    Some(Refusal {
        field: "spec.connection.managed.leader.multiTenancy".into(),
        cause: Cause::Invalid,
        message: format!(
            "the store image {image} runs Mooncake {version}, whose master has no multi-tenancy: given the tenant flags it exits (unknown command line flag); declare leader.multiTenancy: false, or use an image of 0.3.12 or later"
        ),
    })
}

/// The backend's store image and the version its tag names, when that version is older than
/// `first` (an image whose tag names no version is not judged).
fn image_older_than<'a>(
    b: &'a kvcache_api::KVCacheBackend,
    settings: &'a Settings,
    first: [u64; 3],
) -> Option<(&'a str, String)> {
    let image = crate::objects::backend::store_image(b, settings)?;
    let version = kvcache_inject::versions::store_version_of_image(image)?;
    let numbers = kvcache_inject::versions::numbers(&version)?;
    (numbers.as_slice() < first.as_slice()).then_some((image, version))
}

/// The first store version whose master has the metadata operation log (`--enable_oplog`): the
/// 0.3.11.post1 master lists `enable_ha` and `ha_backend_type` but not it, 0.3.13.post1 has it
/// (`mooncake_master --help`; the 0.3.12 wheels do not start here, so 0.3.13 is the first line
/// seen with it).
pub(crate) const OPLOG_STORE: [u64; 3] = [0, 3, 13];

/// `electionBackend: Etcd` needs a master with the operation log: an older one exits on the
/// unknown flag. Judged when the backend is created or its image moves; an image whose tag
/// names no version is not judged.
fn oplog_image_rule(
    b: &kvcache_api::KVCacheBackend,
    old: Option<&kvcache_api::KVCacheBackend>,
    settings: &Settings,
) -> Option<Refusal> {
    let managed = b.spec.connection.managed.as_ref()?;
    if !managed.leader.warm() || old.is_some_and(|o| o.spec.image == b.spec.image) {
        return None;
    }
    let (image, version) = image_older_than(b, settings, OPLOG_STORE)?;
    Some(Refusal {
        field: "spec.connection.managed.leader.electionBackend".into(),
        cause: Cause::Invalid,
        message: format!(
            "the store image {image} runs Mooncake {version}, whose master has no metadata operation log (--enable_oplog), so electionBackend: Etcd cannot keep the cache and the master would exit on the flag; use an image of 0.3.13 or later, or electionBackend: Kubernetes"
        ),
    })
}

/// Tenancy (docs/isolation.md#tenancy): a backend declared, or changed to, `Dedicated` while
/// Bindings of other namespaces use it is refused, naming them (`kvcache_quota::tenancy`).
/// Judged when the backend is created or its `spec.tenancy` moves, against the Bindings of
/// `world`, so a stored backend stays updatable.
fn tenancy_rule(
    b: &kvcache_api::KVCacheBackend,
    old: Option<&kvcache_api::KVCacheBackend>,
    world: &World,
) -> Option<Refusal> {
    let admits = b.spec.tenancy.dedicated_to();
    if admits.is_none() || old.is_some_and(|o| o.spec.tenancy == b.spec.tenancy) {
        return None;
    }
    let name = b.metadata.name.as_deref().unwrap_or_default();
    let bindings: Vec<String> = world
        .bindings_on(name)
        .map(crate::world::binding_id)
        .collect();
    kvcache_quota::tenancy::dedicate(admits, &bindings)
        .err()
        .map(|e| Refusal {
            field: "spec.tenancy".into(),
            cause: Cause::Forbidden,
            message: e.to_string(),
        })
}

/// The backend behind a ModelDeployment's Binding and the protocol of each of its member groups
/// (an external store counts as one group on the backend's protocol), when the Binding, its pool
/// and backend are in the world; otherwise the deployment reports `BindingNotFound` (creation
/// order is free) and the rules that need them wait for the deployment's next change.
fn store_of<'a>(
    md: &kvcache_api::ModelDeployment,
    world: &'a World,
) -> Option<(&'a kvcache_api::KVCacheBackend, Vec<Protocol>)> {
    let backend = world.chain_of_model(md).backend?;
    let protocols = match &backend.spec.connection.managed {
        Some(m) => m
            .members
            .iter()
            .map(|g| g.protocol(backend.spec.transport.protocol))
            .collect(),
        None => vec![backend.spec.transport.protocol],
    };
    Some((backend, protocols))
}

/// The engine row a role runs: vLLM-Ascend where its InstanceType's accelerator is made by
/// `ascend`, otherwise the deployment's engine; `None` for a pairing no row serves.
fn role_engine(
    md: &kvcache_api::ModelDeployment,
    role: &kvcache_api::model::Role,
    world: &World,
) -> Option<&'static kvcache_inject::engines::EngineRow> {
    let ascend = world
        .instance_type(&role.instance_type)
        .and_then(|it| it.spec.accelerator.as_ref())
        .and_then(|a| a.manufacturer.as_deref())
        .filter(|m| *m == "ascend");
    kvcache_inject::engines::row(md.spec.engine.name, ascend).ok()
}

/// The pool transports a ModelDeployment's roles would use (docs/design.md#pool-transport): for a
/// new deployment with `kvCache`, and on an update for the roles whose InstanceType or take-over
/// command moved (docs/design.md#rejudged-roles), each attached role's engine (vLLM-Ascend when its
/// InstanceType's accelerator is made by `ascend`) must find exactly one protocol it can use among
/// the pool's member groups.
fn transport_rule(
    md: &kvcache_api::ModelDeployment,
    old: Option<&kvcache_api::ModelDeployment>,
    world: &World,
) -> Vec<Refusal> {
    let (Some(kv), Some((backend, protocols))) = (&md.spec.kv_cache, store_of(md, world)) else {
        return Vec::new();
    };
    md.spec
        .roles
        .iter()
        .enumerate()
        .filter(|(_, r)| r.command.is_empty())
        .filter(|(_, r)| {
            moved(old, r, |x| {
                x.instance_type != r.instance_type || x.command.is_empty() != r.command.is_empty()
            })
        })
        .filter_map(|(i, r)| {
            let row = role_engine(md, r, world)?;
            kvcache_inject::store_protocol(row, &protocols)
                .err()
                .map(|e| Refusal {
                    field: format!("spec.roles[{i}]"),
                    cause: Cause::Forbidden,
                    message: format!(
                        "through KVCachePoolBinding {} (KVCacheBackend {}): {e}",
                        kv.pool_ref.name,
                        backend.metadata.name.as_deref().unwrap_or_default()
                    ),
                })
        })
        .collect()
}

/// The compute dtype of each attached, non-take-over role against its Binding's
/// `spec.domain.dtype` (`kvcache_inject::compute_dtype_warning`): warnings, judged when the
/// Binding is among the others (creation order is free).
fn dtype_warnings(
    md: &kvcache_api::ModelDeployment,
    world: &World,
    settings: &Settings,
) -> Vec<String> {
    let Some(binding) = world.chain_of_model(md).binding else {
        return Vec::new();
    };
    md.spec
        .roles
        .iter()
        .enumerate()
        .filter(|(_, r)| r.command.is_empty())
        .filter_map(|(i, r)| {
            let row = role_engine(md, r, world)?;
            kvcache_inject::compute_dtype_warning(
                row,
                &r.extra_args,
                &binding.spec.domain.dtype,
                settings.kv_cache_dtype_owned,
            )
            .map(|w| format!("spec.roles[{i}].extraArgs: {w}"))
        })
        .collect()
}

/// Whether a role is new (no `old` deployment, or no role of that name in it) or `changed`
/// says what the rule reads of it moved since `old` (a rule re-runs only for those:
/// docs/design.md#rejudged-roles).
fn moved(
    old: Option<&kvcache_api::ModelDeployment>,
    role: &kvcache_api::model::Role,
    changed: impl Fn(&kvcache_api::model::Role) -> bool,
) -> bool {
    old.and_then(|o| o.spec.roles.iter().find(|x| x.name == role.name))
        .is_none_or(changed)
}

/// Fabric interfaces per Pod (docs/design.md#fabric-interfaces): a positive `resources.interface`
/// needs a pool whose member groups all run one managed fabric protocol, `RDMA` or `EFA`. Refused
/// when the backend is external (no managed leg), when no group runs a fabric protocol, when the
/// groups' protocols differ, and for an RDMA+EFA mix. Re-judged on an update only for the roles
/// whose interface request moved (the pool reference is frozen with `kvCache`). Negative and
/// fractional values never reach here: the schema takes integers from 0.
fn interface_rule(
    md: &kvcache_api::ModelDeployment,
    old: Option<&kvcache_api::ModelDeployment>,
    world: &World,
) -> Vec<Refusal> {
    let (Some(kv), Some((backend, protocols))) = (&md.spec.kv_cache, store_of(md, world)) else {
        return Vec::new();
    };
    let interface = |r: &kvcache_api::model::Role| r.resources.as_ref().and_then(|x| x.interface);
    let mut offered: Vec<&'static str> = protocols.iter().map(|p| p.api_value()).collect();
    offered.sort_unstable();
    offered.dedup();
    let fabric = |p: &&&str| matches!(**p, "RDMA" | "EFA");
    let why = if backend.spec.connection.managed.is_none() {
        Some("an external store has no managed RDMA/EFA leg".to_string())
    } else if offered.iter().filter(fabric).count() > 1 {
        Some("its member groups mix RDMA and EFA".to_string())
    } else if !offered.iter().any(|p| fabric(&p)) {
        Some(format!(
            "its member groups offer {} and no RDMA/EFA leg",
            offered.join(", ")
        ))
    } else if offered.len() > 1 {
        Some(format!(
            "its member groups offer differing protocols ({})",
            offered.join(", ")
        ))
    } else {
        None
    };
    let Some(why) = why else {
        return Vec::new();
    };
    md.spec
        .roles
        .iter()
        .enumerate()
        .filter(|(_, r)| interface(r).is_some_and(|n| n > 0))
        .filter(|(_, r)| moved(old, r, |x| interface(x) != interface(r)))
        .map(|(i, r)| Refusal {
            field: format!("spec.roles[{i}].resources.interface"),
            cause: Cause::Forbidden,
            message: format!(
                "{} fabric interfaces per Pod need one managed RDMA or EFA protocol across the pool's member groups, but through KVCachePoolBinding {} the KVCacheBackend {} cannot give them: {why}; remove resources.interface or give every member group transport.protocol RDMA (or EFA)",
                interface(r).unwrap_or_default(),
                kv.pool_ref.name,
                backend.metadata.name.as_deref().unwrap_or_default()
            ),
        })
        .collect()
}

/// Judges `object` (as an update of `old` when given) against the other objects it is admitted
/// beside (`world`: the cluster's objects for the webhook, the other manifests offline; a
/// stored copy of `object` itself among them is ignored). `unknown_fields` are the paths a
/// strict decoder found that the kind does not have.
pub fn review(
    object: &Object,
    old: Option<&Object>,
    world: &World,
    unknown_fields: &[String],
    settings: &Settings,
) -> Review {
    let me = object.object_ref();
    let verdict: Verdict = match old.and_then(|o| object.validate_update(o, settings)) {
        Some(v) => v,
        None => object.validate_create(settings),
    };
    let mode = if old.is_some() {
        Mode::Update
    } else {
        Mode::Create
    };
    let (mut refusals, kind_warnings) = kind_rules(object, old, world, settings);
    let mut warnings = verdict.warnings;
    warnings.extend(kind_warnings);
    // Claims are judged when an object arrives, after the others (a name it claims that
    // another holds is its duplicate, not the other's): a stored one (say two Bindings that
    // raced past admission onto one name) stays updatable, so that its finalizer can still be
    // removed.
    let findings = match mode {
        Mode::Create => claims::cross_object(world, object),
        Mode::Update => Vec::new(),
    };
    for f in findings {
        match f.kind {
            FindingKind::Warning => warnings.push(f.message),
            FindingKind::Duplicate | FindingKind::Forbidden => refusals.push(Refusal {
                field: f.field.into(),
                cause: if f.kind == FindingKind::Duplicate {
                    Cause::Duplicate
                } else {
                    Cause::Forbidden
                },
                message: f.message,
            }),
        }
    }
    refusals.extend(unknown_fields.iter().map(|field| Refusal {
        field: field.clone(),
        cause: Cause::UnknownField,
        message: "unknown field (strict decoding error); the API server would drop it".into(),
    }));
    refusals.extend(verdict.violations.into_iter().map(|v| Refusal {
        field: v.field,
        cause: Cause::Invalid,
        message: v.message,
    }));
    Review {
        object: me,
        mode,
        refusals,
        warnings,
    }
}

/// The rules of `object`'s own kind that read other objects: a ModelDeployment's owned keys,
/// transport, fabric interfaces and dtype; a backend's store image, tenancy and leader edits.
/// Refusals, then
/// warnings.
fn kind_rules(
    object: &Object,
    old: Option<&Object>,
    world: &World,
    settings: &Settings,
) -> (Vec<Refusal>, Vec<String>) {
    let mut refusals = Vec::new();
    let mut warnings = Vec::new();
    if let Object::ModelDeployment(md) = object {
        refusals.extend(role_keys(md, settings));
        let previous = match old {
            Some(Object::ModelDeployment(o)) => Some(&**o),
            _ => None,
        };
        refusals.extend(transport_rule(md, previous, world));
        refusals.extend(interface_rule(md, previous, world));
        warnings.extend(dtype_warnings(md, world, settings));
    }
    if let Object::Backend(b) = object {
        let previous = match old {
            Some(Object::Backend(o)) => Some(&**o),
            _ => None,
        };
        refusals.extend(store_image_rule(b, previous, settings));
        refusals.extend(oplog_image_rule(b, previous, settings));
        refusals.extend(tenancy_rule(b, previous, world));
        warnings
            .extend(previous.and_then(|o| super::leader_edit::leader_edit_warning(b, o, settings)));
    }
    (refusals, warnings)
}

/// Judges manifests given together: each against the others (of the Bindings, those given
/// before it, so a later claim on a held name is the duplicate) and, where `old` holds the same
/// object, as an update of it.
pub fn review_manifests(new: &[Manifest], old: &[Manifest], settings: &Settings) -> Vec<Review> {
    new.iter()
        .enumerate()
        .map(|(i, m)| {
            let me = m.object.object_ref();
            let previous = old
                .iter()
                .find(|o| o.object.object_ref() == me)
                .map(|o| &o.object);
            // Every other backend and pool counts; of the Bindings, only those before this one
            // (their claims came first), in the order given.
            let others: Vec<Object> = new
                .iter()
                .enumerate()
                .filter(|(j, n)| *j < i || (*j > i && !matches!(n.object, Object::Binding(_))))
                .map(|(_, n)| n.object.clone())
                .collect();
            let world = World::from_objects(&others);
            review(&m.object, previous, &world, &m.unknown_fields, settings)
        })
        .collect()
}
