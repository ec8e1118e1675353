//! KVCacheBackend admission.

use std::collections::BTreeSet;

use super::verdict::{Admission, Verdict};
use crate::backend::KVCacheBackend;
use crate::backend::member_memory_floor;
use crate::backend::{
    Connection, ElectionBackend, EndpointName, External, ExtraEnv, Leader, LocalDisk, Managed,
    Medium, MemberGroup, Tenancy, TenancyMode,
};
use crate::names::{self, is_host_port, tier_path_problem};
use crate::quantity::Quantity;
use crate::quantity::{format_bytes, parse_bytes, parse_millicores};
use crate::resources::{
    CpuQuantity, LEADER_CPU_REQUEST, LEADER_MEMORY_REQUEST, MEMBER_CPU_REQUEST,
    STORE_CPU_FLOOR_MILLICORES, StoreResources,
};
use crate::rules::{self, BUCKET_BYTES, BUCKET_KEYS, BUCKET_QUANTITY, INFINIBAND_DIR};
use crate::settings::Settings;

const MANAGED: &str = "spec.connection.managed";
/// The smallest etcd claim accepted.
const ETCD_STORAGE_FLOOR: u64 = 64 << 20;

impl Admission for KVCacheBackend {
    fn validate_create(&self, settings: &Settings) -> Verdict {
        let mut v = Verdict::default();
        backend_static(self, &mut v);
        backend_image(self, settings, &mut v);
        if let Some(managed) = &self.spec.connection.managed {
            for (i, group) in managed.members.iter().enumerate() {
                tier_floors(i, group, None, &mut v);
            }
        }
        v
    }

    fn validate_update(&self, old: &Self, settings: &Settings) -> Verdict {
        let mut v = Verdict::default();
        backend_static(self, &mut v);
        if self.spec.image != old.spec.image {
            backend_image(self, settings, &mut v);
        }
        etcd_still_there(self, old, &mut v);
        let (Some(new_m), old_m) = (&self.spec.connection.managed, &old.spec.connection.managed)
        else {
            return v;
        };
        let old_groups: &[MemberGroup] = old_m.as_ref().map_or(&[], |m| m.members.as_slice());
        for (i, group) in new_m.members.iter().enumerate() {
            tier_floors(i, group, old_groups.get(i), &mut v);
        }
        if let Some(old_m) = old_m {
            group_identity(new_m, old_m, &mut v);
            multi_tenancy_release(self, old, &mut v);
            if new_m.leader.warm() != old_m.leader.warm() {
                v.refuse(
                    format!("{MANAGED}.leader.electionBackend"),
                    rules::ETCD_SWITCH_REFUSED,
                );
            } else if new_m.leader.warm()
                && new_m.leader.etcd_replicas() != old_m.leader.etcd_replicas()
            {
                v.refuse(
                    format!("{MANAGED}.leader.replicas"),
                    rules::ETCD_SIZE_REFUSED,
                );
            } else if new_m.leader.warm() && new_m.leader.etcd != old_m.leader.etcd {
                v.refuse(
                    format!("{MANAGED}.leader.etcd"),
                    rules::ETCD_STORAGE_REFUSED,
                );
            }
        }
        v
    }
}

/// A backend whose etcd runs (`status.etcd`) keeps its warm election and the etcd's size, even
/// across a detour through `external` (which removes nothing): the running etcd's members
/// would never regain a quorum at another size.
fn etcd_still_there(new: &KVCacheBackend, old: &KVCacheBackend, v: &mut Verdict) {
    let Some(running) = old.status.as_ref().and_then(|s| s.etcd.as_ref()) else {
        return;
    };
    match new.spec.connection.managed.as_ref().map(|m| &m.leader) {
        Some(l) if l.warm() && l.etcd_replicas() == running.replicas => {}
        Some(l) if l.warm() => v.refuse(
            format!("{MANAGED}.leader.replicas"),
            rules::ETCD_SIZE_REFUSED,
        ),
        _ => v.refuse(
            format!("{MANAGED}.leader.electionBackend"),
            rules::ETCD_SWITCH_REFUSED,
        ),
    }
}

fn backend_static(b: &KVCacheBackend, v: &mut Verdict) {
    let Connection { managed, external } = &b.spec.connection;
    match (managed, external) {
        (Some(_), Some(_)) | (None, None) => v.refuse(
            "spec.connection",
            "set exactly one of spec.connection.managed and spec.connection.external",
        ),
        _ => {}
    }
    if let Some(image) = &b.spec.image {
        image_shape("spec.image", image, v);
    }
    tenancy_static(&b.spec.tenancy, v);
    if let Some(m) = managed {
        managed_static(b, m, v);
    }
    if let Some(e) = external {
        external_static(e, v);
    }
}

/// `spec.tenancy` on its own (the CRD's CEL rules, same words): a namespace with `Dedicated`
/// and only then, and a name a namespace can have. Who binds it is judged against the Bindings
/// (`kvcache_quota::tenancy`).
fn tenancy_static(t: &Tenancy, v: &mut Verdict) {
    match (t.mode, &t.namespace) {
        (TenancyMode::Dedicated, None) => {
            v.refuse("spec.tenancy", rules::TENANCY_NAMESPACE_MISSING)
        }
        (TenancyMode::Shared, Some(_)) => v.refuse("spec.tenancy", rules::TENANCY_NAMESPACE_UNUSED),
        _ => {}
    }
    if let Some(ns) = &t.namespace
        && !names::is_dns_label(ns)
    {
        v.refuse("spec.tenancy.namespace", rules::TENANCY_NAMESPACE_SHAPE);
    }
}

fn image_shape(field: &str, image: &str, v: &mut Verdict) {
    if image.trim().is_empty() {
        v.refuse(
            field,
            "must not be blank: an image is either named here or left out entirely so the \"kv-cache-backend-image\" setting decides",
        );
    } else if image.len() > 512 {
        v.refuse(field, "must be at most 512 characters");
    }
}

fn backend_image(b: &KVCacheBackend, settings: &Settings, v: &mut Verdict) {
    if b.spec.connection.managed.is_some()
        && b.spec.image.is_none()
        && settings.backend_image().is_none()
    {
        v.refuse(
            "spec.image",
            "no store image: spec.image is unset and the \"kv-cache-backend-image\" setting is empty, so neither carries one; name an image here or set the setting",
        );
    }
}

/// The leader's own fields: its replicas and election, its etcd's claim, its flags, its
/// environment and its resources.
fn leader_static(leader: &Leader, v: &mut Verdict) {
    let lf = format!("{MANAGED}.leader");
    if !(1..=5).contains(&leader.replicas) {
        v.refuse(
            format!("{lf}.replicas"),
            "must be between 1 and 5: one leader serves and the others stand by",
        );
    }
    if leader.replicas > 1 && leader.election_backend == ElectionBackend::None {
        v.refuse(
            format!("{lf}.replicas"),
            "leader.replicas above 1 needs leader.electionBackend: Kubernetes or Etcd; with None only one leader can run",
        );
    }
    if let Some(size) = leader.etcd.as_ref().and_then(|e| e.storage_size.as_ref()) {
        let field = format!("{lf}.etcd.storageSize");
        match size.bytes(&field) {
            Ok(n) if n < ETCD_STORAGE_FLOOR => v.refuse(
                field,
                format!("{} is below the floor of 64Mi: the etcd's database gets half the claim, beside its write-ahead log and snapshots", size.0),
            ),
            Ok(_) => {}
            Err(e) => v.refuse(field, e.to_string()),
        }
    }
    for (i, arg) in leader.extra_args.iter().enumerate() {
        if let Some(reason) = rules::refused_leader_flag(arg) {
            v.refuse(
                format!("{lf}.extraArgs[{i}]"),
                format!("{} is refused: {reason}", rules::flag_key(arg)),
            );
        }
        if rules::flag_key(arg).is_empty() {
            v.refuse(
                format!("{lf}.extraArgs[{i}]"),
                "must be key=value or a bare boolean key, e.g. default_kv_lease_ttl=10s",
            );
        }
    }
    env_names(
        &format!("{lf}.extraEnv"),
        &leader.extra_env,
        rules::LEADER_RENDERED_ENV,
        v,
    );
    if let Some(r) = &leader.resources {
        let defaults = Defaults {
            cpu: parse_millicores(LEADER_CPU_REQUEST).unwrap_or_default(),
            memory: parse_bytes(LEADER_MEMORY_REQUEST).unwrap_or_default(),
        };
        store_resources(&format!("{lf}.resources"), r, defaults, None, v);
    }
}

fn managed_static(b: &KVCacheBackend, m: &Managed, v: &mut Verdict) {
    leader_static(&m.leader, v);
    if m.priority_class_name
        .as_deref()
        .is_some_and(|p| !names::is_dns_subdomain(p))
    {
        v.refuse(
            format!("{MANAGED}.priorityClassName"),
            crate::rules::PRIORITY_CLASS_NAME_REFUSED,
        );
    }

    if m.members.is_empty() {
        v.refuse(
            format!("{MANAGED}.members"),
            "at least one member group is required: the store has no memory without one",
        );
    }
    let tiered: Vec<usize> = m
        .members
        .iter()
        .enumerate()
        .filter(|(_, g)| !g.local_disks.is_empty())
        .map(|(i, _)| i)
        .collect();
    if tiered.len() > 1 {
        v.refuse(
            format!("{MANAGED}.members"),
            format!(
                "at most one member group per backend may declare localDisks; groups {tiered:?} do"
            ),
        );
    }
    for (i, group) in m.members.iter().enumerate() {
        member_static(b, i, group, v);
    }
    if let Some(scale_in) = &m.scale_in {
        if !(0..=3600).contains(&scale_in.grace_period_seconds) {
            v.refuse(
                format!("{MANAGED}.scaleIn.gracePeriodSeconds"),
                "must be between 0 and 3600 seconds",
            );
        }
        if tiered.is_empty() {
            v.warn(format!(
                "{MANAGED}.scaleIn only applies to a member group with localDisks; no group declares one, so it has no effect"
            ));
        }
    }
}

/// The requests a store container takes where `resources` writes none, in millicores and bytes.
struct Defaults {
    cpu: u64,
    memory: u64,
}

/// A store container's `resources`: amounts that parse, limits not under the requests (written
/// or default: a Pod whose limit is under its request is refused by the API server, and the
/// DaemonSet or Deployment would stay without Pods), a CPU request under the measured floor
/// admitted with a warning, and a member's memory request not under `memory_floor` (its segment
/// and staging buffers, which the store allocates at start).
fn store_resources(
    field: &str,
    r: &StoreResources,
    defaults: Defaults,
    memory_floor: Option<u64>,
    v: &mut Verdict,
) {
    let cpu = |q: Option<&CpuQuantity>, at: &str, v: &mut Verdict| {
        let at = format!("{field}.{at}");
        q.and_then(|q| {
            q.millicores(&at)
                .map_err(|e| v.refuse(&at, e.to_string()))
                .ok()
        })
    };
    let memory = |q: Option<&Quantity>, at: &str, v: &mut Verdict| {
        let at = format!("{field}.{at}");
        q.and_then(|q| q.bytes(&at).map_err(|e| v.refuse(&at, e.to_string())).ok())
    };
    let cpu_request = cpu(r.cpu_request(), "requests.cpu", v);
    let cpu_limit = cpu(r.cpu_limit(), "limits.cpu", v);
    let memory_request = memory(r.memory_request(), "requests.memory", v);
    let memory_limit = memory(r.memory_limit(), "limits.memory", v);
    if let Some(m) = cpu_request
        && m < STORE_CPU_FLOOR_MILLICORES
    {
        v.warn(format!(
            "{field}.requests.cpu: {m}m is below the measured floor of {STORE_CPU_FLOOR_MILLICORES}m: beside engines busy on every core a store container at 25m moved about 1 MB/s and a cache hit came slower than recomputing (docs/store-resources.md); request {STORE_CPU_FLOOR_MILLICORES}m or more unless the node's engines leave the cores idle"
        ));
    }
    let request = cpu_request.unwrap_or(defaults.cpu);
    if let Some(limit) = cpu_limit
        && limit < request
    {
        v.refuse(
            format!("{field}.limits.cpu"),
            format!("{limit}m is below the CPU request of {request}m: raise the limit or set requests.cpu under it"),
        );
    }
    let request = memory_request.unwrap_or(defaults.memory);
    if let Some(limit) = memory_limit
        && limit < request
    {
        v.refuse(
            format!("{field}.limits.memory"),
            format!(
                "{} is below the memory request of {}: raise the limit or set requests.memory under it",
                format_bytes(limit),
                format_bytes(request)
            ),
        );
    }
    if let (Some(floor), Some(request)) = (memory_floor, memory_request)
        && request < floor
    {
        v.refuse(
            format!("{field}.requests.memory"),
            format!(
                "{} is below {}, the member's segment plus its staging buffers, which it allocates at start: the request must cover them so a member that does not fit stays Pending instead of overcommitting the node; raise it or leave it unset",
                format_bytes(request),
                format_bytes(floor)
            ),
        );
    }
}

fn env_names(field: &str, env: &[ExtraEnv], rendered: &[&str], v: &mut Verdict) {
    let mut seen = BTreeSet::new();
    for (i, e) in env.iter().enumerate() {
        if rendered.contains(&e.name.as_str()) || e.name.starts_with(rules::ELECTOR_ENV_PREFIX) {
            v.refuse(
                format!("{field}[{i}].name"),
                format!("{} is refused: {}", e.name, rules::RENDERED_ENV_REASON),
            );
        }
        if !seen.insert(e.name.as_str()) {
            v.refuse(
                format!("{field}[{i}].name"),
                format!("{} is listed twice", e.name),
            );
        }
    }
}

fn member_static(b: &KVCacheBackend, i: usize, g: &MemberGroup, v: &mut Verdict) {
    let gf = format!("{MANAGED}.members[{i}]");
    match g
        .capacity_per_member
        .bytes(&format!("{gf}.capacityPerMember"))
    {
        Ok(0) => v.refuse(
            format!("{gf}.capacityPerMember"),
            "must be above zero: it is the segment this group contributes",
        ),
        Ok(_) => {}
        Err(e) => v.refuse(format!("{gf}.capacityPerMember"), e.to_string()),
    }
    if let Some(q) = &g.local_buffer_size
        && let Err(e) = q.bytes(&format!("{gf}.localBufferSize"))
    {
        v.refuse(format!("{gf}.localBufferSize"), e.to_string());
    }
    if let Some(image) = &g.image {
        image_shape(&format!("{gf}.image"), image, v);
    }
    let protocol = g.protocol(b.spec.transport.protocol);
    if let Some(count) = g.fabric_interface_count {
        if count < 1 {
            v.refuse(
                format!("{gf}.fabricInterfaceCount"),
                "must be at least 1 (unset counts as 1)",
            );
        } else if !protocol.is_fabric() {
            v.warn(format!(
                "{gf}.fabricInterfaceCount only applies to RDMA and EFA; this group's protocol is {}, so it has no effect",
                protocol.api_value()
            ));
        }
    }
    for (j, arg) in g.extra_args.iter().enumerate() {
        let ok = arg.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        });
        if !ok {
            v.refuse(
                format!("{gf}.extraArgs[{j}]"),
                "each entry is a store configuration override written key=value; it is rendered as -D key=value",
            );
        }
    }
    env_names(
        &format!("{gf}.extraEnv"),
        &g.extra_env,
        rules::MEMBER_RENDERED_ENV,
        v,
    );
    if let Some(r) = &g.resources {
        // A floor that does not parse is refused at its own field above.
        let floor = member_memory_floor(&gf, g).ok();
        let defaults = Defaults {
            cpu: parse_millicores(MEMBER_CPU_REQUEST).unwrap_or_default(),
            memory: floor.unwrap_or_default(),
        };
        store_resources(&format!("{gf}.resources"), r, defaults, floor, v);
    }
    if g.medium == Medium::Dram {
        for (j, e) in g.extra_env.iter().enumerate() {
            if rules::DRAM_DEVICE_VISIBILITY_ENV.contains(&e.name.as_str()) {
                v.refuse(
                    format!("{gf}.extraEnv[{j}].name"),
                    format!(
                        "{} is refused on a DRAM group: the operator sets it to void so the member cannot take accelerator memory",
                        e.name
                    ),
                );
            }
        }
    }
    host_paths_static(&gf, g, v);
    if g.local_disks.len() > 1 {
        v.refuse(
            format!("{gf}.localDisks"),
            "holds at most one entry: a group has one disk tier",
        );
    }
    for (j, d) in g.local_disks.iter().enumerate() {
        tier_static(&format!("{gf}.localDisks[{j}]"), d, v);
    }
}

/// A member group's `hostPaths`: each mounted once, not over `/dev/infiniband`, not over the
/// group's own disk tier. `gf` names the group.
fn host_paths_static(gf: &str, g: &MemberGroup, v: &mut Verdict) {
    let mut mounts = BTreeSet::new();
    for (j, h) in g.host_paths.iter().enumerate() {
        let hf = format!("{gf}.hostPaths[{j}].mountPath");
        let mount = h.mount_path.trim_end_matches('/');
        if !mounts.insert(mount) {
            v.refuse(&hf, format!("{} is mounted twice", h.mount_path));
        }
        if mount == INFINIBAND_DIR {
            v.refuse(
                &hf,
                "must not be /dev/infiniband: device plugins inject the granted devices, and mounting the tree breaks partial grants",
            );
        }
        if g.tier()
            .is_some_and(|t| t.path.trim_end_matches('/') == mount)
        {
            v.refuse(
                &hf,
                "must not be the group's own localDisks[].path: the tier is mounted there already",
            );
        }
    }
}

fn tier_static(df: &str, d: &LocalDisk, v: &mut Verdict) {
    if let Some(problem) = tier_path_problem(&d.path) {
        v.refuse(format!("{df}.path"), problem);
    }
    if let Some(e) = &d.eviction {
        if !e.enabled && e.policy.is_some() {
            v.refuse(
                format!("{df}.eviction.policy"),
                "has no effect with eviction.enabled: false; remove one of them",
            );
        }
        if !e.enabled && e.watermark.is_some() {
            v.refuse(
                format!("{df}.eviction.watermark"),
                "has no effect with eviction.enabled: false; remove one of them",
            );
        }
        if let Some(w) = &e.watermark {
            if d.capacity.is_none() {
                v.refuse(
                    format!("{df}.eviction.watermark"),
                    "needs localDisks[].capacity: watermarks are percentages of it",
                );
            }
            if !(1..=100).contains(&w.high) || !(0..=99).contains(&w.low) {
                v.refuse(
                    format!("{df}.eviction.watermark"),
                    "high must be 1..100 and low 0..99 (percent of capacity)",
                );
            }
            if w.low >= w.high {
                v.refuse(
                    format!("{df}.eviction.watermark.low"),
                    format!("must be below high ({} >= {})", w.low, w.high),
                );
            }
        }
    }
}

/// The bucket bounds of a tiered group. Each is judged on create, and on update only when the
/// update moves that value (an object admitted before the bound stays editable).
fn tier_floors(i: usize, g: &MemberGroup, old: Option<&MemberGroup>, v: &mut Verdict) {
    let Some(tier) = g.tier() else { return };
    let gf = format!("{MANAGED}.members[{i}]");
    let old_tier = old.and_then(MemberGroup::tier);
    let moved_segment = old.is_none_or(|o| o.capacity_per_member != g.capacity_per_member);
    if moved_segment
        && let Ok(bytes) = g.capacity_per_member.bytes("")
        && bytes < BUCKET_BYTES
    {
        v.refuse(
            format!("{gf}.capacityPerMember"),
            format!(
                "must hold one bucket ({BUCKET_QUANTITY}) on a group with localDisks: a smaller segment can never complete a bucket, so the tier would report capacity and hold nothing"
            ),
        );
    }
    let moved_capacity = old_tier.is_none_or(|o| o.capacity != tier.capacity);
    if moved_capacity && let Some(capacity) = &tier.capacity {
        match capacity.bytes(&format!("{gf}.localDisks[0].capacity")) {
            Ok(bytes) if bytes < BUCKET_BYTES => v.refuse(
                format!("{gf}.localDisks[0].capacity"),
                format!("must hold one bucket ({BUCKET_QUANTITY})"),
            ),
            Ok(_) => {}
            Err(e) => v.refuse(format!("{gf}.localDisks[0].capacity"), e.to_string()),
        }
    }
    let moved_keys = old_tier.is_none_or(|o| o.key_limit != tier.key_limit);
    if moved_keys
        && let Some(keys) = tier.key_limit
        && keys < BUCKET_KEYS
    {
        v.refuse(
            format!("{gf}.localDisks[0].keyLimit"),
            format!(
                "must hold one bucket's worth of keys ({BUCKET_KEYS} keys in a {BUCKET_QUANTITY} bucket)"
            ),
        );
    }
}

/// Groups are identified by position: their medium and tier never change, and none moves.
fn group_identity(new: &Managed, old: &Managed, v: &mut Verdict) {
    for (i, (n, o)) in new.members.iter().zip(&old.members).enumerate() {
        let gf = format!("{MANAGED}.members[{i}]");
        if n.medium != o.medium {
            v.refuse(
                format!("{gf}.medium"),
                format!(
                    "is immutable ({} -> {}): add a new group for the other medium and retire this one by narrowing its nodeSelector",
                    o.medium.as_str(),
                    n.medium.as_str()
                ),
            );
        }
        match (o.tier(), n.tier()) {
            (None, Some(_)) => v.refuse(
                format!("{gf}.localDisks"),
                "adding a disk tier to an existing group is refused: the path is chosen when the group is created; append a new group with localDisks instead",
            ),
            (Some(_), None) => v.refuse(
                format!("{gf}.localDisks"),
                "removing a group's disk tier is refused: only dropping the last group takes its tier away",
            ),
            (Some(ot), Some(nt)) if ot.path != nt.path => v.refuse(
                format!("{gf}.localDisks[0].path"),
                format!(
                    "is chosen once ({} -> {}): repathing a tier is refused; capacity, keyLimit and eviction stay editable",
                    ot.path, nt.path
                ),
            ),
            _ => {}
        }
    }
    // A group that now stands at another index than before, while its old place holds something
    // else (or is gone), has moved.
    for (i, n) in new.members.iter().enumerate() {
        if old.members.get(i) == Some(n) {
            continue;
        }
        let moved_from = old
            .members
            .iter()
            .enumerate()
            .find(|(j, o)| *j != i && *o == n && new.members.get(*j) != Some(*o));
        if let Some((j, _)) = moved_from {
            v.refuse(
                format!("{MANAGED}.members[{i}]"),
                format!(
                    "is the group that was members[{j}]: a group's position is its identity (its DaemonSet, labels and port derive from it), so moving it is refused; append new groups at the end and retire a group by narrowing its nodeSelector to match no node"
                ),
            );
        }
    }
}

fn multi_tenancy_release(new: &KVCacheBackend, old: &KVCacheBackend, v: &mut Verdict) {
    let was = old
        .spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.multi_tenancy);
    let is = new
        .spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.multi_tenancy);
    let used_by = old
        .status
        .as_ref()
        .map(|s| s.used_by.as_slice())
        .unwrap_or_default();
    if was && !is && !used_by.is_empty() {
        let names: Vec<String> = used_by.iter().map(ToString::to_string).collect();
        v.refuse(
            format!("{MANAGED}.leader.multiTenancy"),
            format!(
                "cannot be turned off while the backend is in use by {}: their Bindings' tenants would vanish from the ledger; delete those pools first",
                names.join(", ")
            ),
        );
    }
}

fn external_static(e: &External, v: &mut Verdict) {
    let ef = "spec.connection.external.endpoints";
    let names: Vec<EndpointName> = e.endpoints.iter().map(|e| e.name).collect();
    let exactly_both = e.endpoints.len() == 2
        && names.contains(&EndpointName::Client)
        && names.contains(&EndpointName::Admin);
    if !exactly_both {
        v.refuse(
            ef,
            "must hold exactly two entries, named Client (what engines connect to) and Admin (what the operator reads)",
        );
    }
    for (i, ep) in e.endpoints.iter().enumerate() {
        if !is_host_port(&ep.address) {
            v.refuse(
                format!("{ef}[{i}].address"),
                format!(
                    "{:?} is not host:port, e.g. mooncake-master.store.svc:50051",
                    ep.address
                ),
            );
        }
    }
}
