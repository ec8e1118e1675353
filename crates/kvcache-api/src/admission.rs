//! Admission rules for every kind as pure functions: `validate_create` and `validate_update`
//! return every violation (field path and message) and every warning, never only the first.
//!
//! The CRD's CEL rules refuse most of these at the API server already (see [`crate::rules`]);
//! these functions also cover what CEL cannot express well (group reordering, ratcheting on a
//! setting) and serve the offline `kvcache-operator validate` and the admission webhook.

use std::collections::BTreeSet;
use std::fmt;

use crate::backend::{
    Connection, ElectionBackend, EndpointName, External, ExtraEnv, LocalDisk, Managed, Medium,
    MemberGroup,
};
use crate::model::InstanceType;
use crate::pool::{DEFAULT_DOMAIN, KVCachePool, KVCachePoolBinding};
use crate::rules::{self, BUCKET_BYTES, BUCKET_KEYS, BUCKET_QUANTITY, INFINIBAND_DIR};
use crate::{KVCacheBackend, ModelDeployment, Quantity, Settings};

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Where, as a path in the manifest (`spec.connection.managed.members[0].medium`).
    pub field: String,
    /// Why, and what to do instead.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The outcome of admission: every violation and every warning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Refusals; the object is admitted only when this is empty.
    pub violations: Vec<Violation>,
    /// Admitted, but the user should know.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Whether the object is admitted.
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    fn refuse(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.violations.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    fn warn(&mut self, message: impl Into<String>) {
        self.warnings.push(message.into());
    }

    /// Whether some violation's field starts with `field` and its message contains `fragment`.
    pub fn refuses(&self, field: &str, fragment: &str) -> bool {
        self.violations
            .iter()
            .any(|v| v.field.starts_with(field) && v.message.contains(fragment))
    }
}

/// Admission for one kind.
pub trait Admission {
    /// The rules judged when the object is created.
    fn validate_create(&self, settings: &Settings) -> Verdict;
    /// The rules judged when `old` is replaced by `self`; ratcheting rules only judge values
    /// the update moves.
    fn validate_update(&self, old: &Self, settings: &Settings) -> Verdict;
}

// ---------------------------------------------------------------------------------------------
// KVCacheBackend

const MANAGED: &str = "spec.connection.managed";

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
        }
        v
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
    if let Some(m) = managed {
        managed_static(b, m, v);
    }
    if let Some(e) = external {
        external_static(e, v);
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

fn managed_static(b: &KVCacheBackend, m: &Managed, v: &mut Verdict) {
    let leader = &m.leader;
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
            "leader.replicas above 1 needs leader.electionBackend: Kubernetes; with None only one leader can run",
        );
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

/// The path rules of a disk tier, in the order a user would fix them.
pub fn tier_path_problem(path: &str) -> Option<&'static str> {
    if path != path.trim_matches([' ', '\t']) {
        return Some("must not start or end with spaces or tabs");
    }
    if !path.starts_with('/') {
        return Some("must be absolute");
    }
    if path.trim_start_matches('/').is_empty() {
        return Some("must not be /");
    }
    if path.split('/').any(|c| c == "..") {
        return Some("must not contain a .. component");
    }
    let with_slash = if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    };
    let ib = format!("{INFINIBAND_DIR}/");
    if with_slash.starts_with(&ib) || ib.starts_with(&with_slash) {
        return Some("must not equal, be inside or contain /dev/infiniband");
    }
    None
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

/// Whether an address is `host:port` (bracketed IPv6 hosts allowed).
pub fn is_host_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !inner.is_empty()
            && inner
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        !host.is_empty()
            && !host
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, ':' | '/' | '[' | ']'))
    };
    port_ok && host_ok
}

// ---------------------------------------------------------------------------------------------
// KVCachePool

/// The largest quota the store accepts, in bytes.
pub const MAX_QUOTA_BYTES: u64 = i64::MAX as u64;

fn quota_bytes(field: &str, q: &Quantity, v: &mut Verdict) -> Option<u64> {
    match q.bytes(field) {
        Ok(0) => {
            v.refuse(field, "must be above zero: the store refuses a zero quota");
            None
        }
        Ok(b) if b > MAX_QUOTA_BYTES => {
            v.refuse(
                field,
                "must be at most 8Ei (the store counts quota in signed 64-bit bytes)",
            );
            None
        }
        Ok(b) => Some(b),
        Err(e) => {
            v.refuse(field, e.to_string());
            None
        }
    }
}

impl Admission for KVCachePool {
    fn validate_create(&self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        if self.spec.backends.len() != 1 {
            v.refuse(
                "spec.backends",
                format!(
                    "must name exactly one KVCacheBackend; it names {}",
                    self.spec.backends.len()
                ),
            );
        }
        quota_bytes("spec.quota.total", &self.spec.quota.total, &mut v);
        v
    }

    fn validate_update(&self, old: &Self, settings: &Settings) -> Verdict {
        let mut v = self.validate_create(settings);
        if self.spec.backends != old.spec.backends {
            v.refuse(
                "spec.backends",
                "a pool cannot be re-pointed to another backend; create a new pool for it",
            );
        }
        v
    }
}

// ---------------------------------------------------------------------------------------------
// KVCachePoolBinding

/// Why a tenant (domain) name is refused by the store or by the DNS-1123 label rule.
pub fn domain_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty");
    }
    if name.starts_with('_') {
        return Some("must not start with '_' (the store reserves those tenant ids)");
    }
    if name.len() > 63 {
        return Some("must be at most 63 characters (a DNS-1123 label)");
    }
    let bytes = name.as_bytes();
    let inner_ok = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    let ends_ok = bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if !inner_ok || !ends_ok {
        return Some(
            "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
        );
    }
    None
}

impl Admission for KVCachePoolBinding {
    fn validate_create(&self, settings: &Settings) -> Verdict {
        let mut v = Verdict::default();
        binding_static(self, &mut v);
        if settings.kv_cache_dtype_owned && self.spec.domain.dtype == "auto" {
            v.refuse(
                "spec.domain.dtype",
                "auto is refused on a new Binding: the dtype is handed to engines as --kv-cache-dtype, and auto lets each engine pick, so two workloads could share blocks of different dtypes; name the dtype (e.g. bfloat16)",
            );
        }
        v
    }

    fn validate_update(&self, old: &Self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        binding_static(self, &mut v);
        if self.spec.pool_ref != old.spec.pool_ref {
            v.refuse(
                "spec.poolRef",
                "is immutable: create a new Binding for another pool",
            );
        }
        let (n, o) = (&self.spec.domain, &old.spec.domain);
        for (field, changed) in [
            ("name", n.name != o.name),
            ("blockSize", n.block_size != o.block_size),
            ("dtype", n.dtype != o.dtype),
        ] {
            if changed {
                v.refuse(
                    format!("spec.domain.{field}"),
                    "is immutable: a domain is the cache's compatibility key, so running workloads would read blocks another configuration wrote; create a new Binding instead",
                );
            }
        }
        v
    }
}

fn binding_static(b: &KVCachePoolBinding, v: &mut Verdict) {
    if b.spec.pool_ref.name.is_empty() {
        v.refuse("spec.poolRef.name", "must name a KVCachePool");
    }
    quota_bytes("spec.quota.ceiling", &b.spec.quota.ceiling, v);
    if let Some(problem) = domain_name_problem(&b.spec.domain.name) {
        v.refuse("spec.domain.name", problem);
    }
    if b.spec.domain.block_size < 1 {
        v.refuse("spec.domain.blockSize", "must be at least 1");
    }
    if b.spec.domain.dtype.trim().is_empty() {
        v.refuse(
            "spec.domain.dtype",
            "must name the KV cache dtype engines use, e.g. bfloat16",
        );
    }
}

/// The tenant id a Binding's domain stands for.
pub fn tenant_of(binding: &KVCachePoolBinding) -> &str {
    if binding.spec.domain.name.is_empty() {
        DEFAULT_DOMAIN
    } else {
        &binding.spec.domain.name
    }
}

// ---------------------------------------------------------------------------------------------
// ModelDeployment

/// Whether `s` is a DNS-1123 label (lowercase letters, digits and `-`, at most 63 characters).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl Admission for ModelDeployment {
    fn validate_create(&self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        md_static(self, &mut v);
        v
    }

    fn validate_update(&self, old: &Self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        md_static(self, &mut v);
        let (n, o) = (&self.spec, &old.spec);
        let frozen = [
            ("spec.model", n.model != o.model, "a different model"),
            (
                "spec.engine.name",
                n.engine.name != o.engine.name,
                "a different engine",
            ),
            (
                "spec.kvCache",
                n.kv_cache != o.kv_cache,
                "attaching, detaching or re-pointing the cache",
            ),
        ];
        for (field, changed, what) in frozen {
            if changed {
                v.refuse(
                    field,
                    format!("cannot be edited: {what} means a new ModelDeployment"),
                );
            }
        }
        let set = |roles: &[crate::model::Role]| -> BTreeSet<(String, &'static str)> {
            roles
                .iter()
                .map(|r| (r.name.clone(), r.kind.as_str()))
                .collect()
        };
        if set(&n.roles) != set(&o.roles) {
            v.refuse(
                "spec.roles",
                "the role set (names and kinds) cannot be edited: a different set means a new ModelDeployment",
            );
        }
        v
    }
}

fn md_static(md: &ModelDeployment, v: &mut Verdict) {
    let s = &md.spec;
    if s.model.name.trim().is_empty() {
        v.refuse("spec.model.name", "must name the model to serve");
    }
    if let Some(kv) = &s.kv_cache {
        let name = &kv.pool_ref.name;
        if name.is_empty() {
            v.refuse(
                "spec.kvCache.poolRef.name",
                "must name a KVCachePoolBinding in this namespace",
            );
        } else if name.contains('/') {
            v.refuse(
                "spec.kvCache.poolRef.name",
                "names a KVCachePoolBinding in this namespace; another namespace's Binding (or a pool) cannot be named: ask an administrator for a Binding here",
            );
        }
    }
    if !(1..=10).contains(&s.roles.len()) {
        v.refuse("spec.roles", "must hold 1 to 10 roles");
    }
    let mut names = BTreeSet::new();
    for (i, r) in s.roles.iter().enumerate() {
        let rf = format!("spec.roles[{i}]");
        if !is_dns_label(&r.name) {
            v.refuse(
                format!("{rf}.name"),
                "must be a DNS label (lowercase letters, digits and '-')",
            );
        }
        if !names.insert(r.name.as_str()) {
            v.refuse(format!("{rf}.name"), format!("{} is listed twice", r.name));
        }
        if !(0..=1024).contains(&r.replicas) {
            v.refuse(format!("{rf}.replicas"), "must be between 0 and 1024");
        }
        if !(1..=64).contains(&r.size) {
            v.refuse(format!("{rf}.size"), "must be between 1 and 64");
        }
        if r.instance_type.is_empty() {
            v.refuse(
                format!("{rf}.instanceType"),
                "must name an InstanceType (kubectl get instancetype)",
            );
        }
        if r.resources
            .as_ref()
            .and_then(|res| res.accelerator)
            .is_some_and(|a| a < 0)
        {
            v.refuse(
                format!("{rf}.resources.accelerator"),
                "must not be negative",
            );
        }
    }
    let version_missing = s
        .engine
        .version
        .as_deref()
        .is_none_or(|v| v.trim().is_empty());
    if version_missing && s.roles.iter().any(|r| r.image.is_none()) {
        v.refuse(
            "spec.engine.version",
            "is required when a role names no image: it picks the runner image and the store client it carries",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// InstanceType

impl Admission for InstanceType {
    fn validate_create(&self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        if let Err(e) = self.spec.resources.memory.bytes("spec.resources.memory") {
            v.refuse("spec.resources.memory", e.to_string());
        }
        if self.spec.resources.cpu.0.trim().is_empty() {
            v.refuse(
                "spec.resources.cpu",
                "must be a CPU quantity such as 8 or 7500m",
            );
        }
        if let Some(a) = &self.spec.accelerator
            && a.resource_name.trim().is_empty()
        {
            v.refuse(
                "spec.accelerator.resourceName",
                "must name the extended resource, e.g. nvidia.com/gpu",
            );
        }
        v
    }

    fn validate_update(&self, _: &Self, settings: &Settings) -> Verdict {
        self.validate_create(settings)
    }
}
