//! The admission rules that live in the CRD schema (CEL `x-kubernetes-validations`), and the
//! tables they share with the pure validators in [`crate::admission`].
//!
//! Every table here is the single source for both layers: the CEL rule is generated from it and
//! the Rust validator reads it, so the API server and `kvcache-operator validate` refuse the same
//! things with the same words.

use kube::core::{Message, Reason, Rule};

/// The operator's disk-tier bucket: the unit the tier is written in, and the floor of
/// `capacityPerMember` and `localDisks[].capacity` on a group with a tier.
pub const BUCKET_BYTES: u64 = 16 << 20;
/// [`BUCKET_BYTES`] as users write it.
pub(crate) const BUCKET_QUANTITY: &str = "16Mi";
/// Keys in one operator bucket: the floor of `localDisks[].keyLimit`.
pub const BUCKET_KEYS: i64 = 32;

/// Leader flags refused in `leader.extraArgs`, by family, each with the reason a user is told.
pub struct RefusedFlags {
    /// Exact keys (after stripping leading dashes and any `=value`).
    pub keys: &'static [&'static str],
    /// Key prefixes refused as a family.
    pub prefixes: &'static [&'static str],
    /// Why, and what to do instead.
    pub reason: &'static str,
}

/// Every family of refused leader flags: the CRD's CEL rules and the validator both read this
/// one table, so the two layers refuse the same arguments with the same reason.
pub const REFUSED_LEADER_FLAGS: &[RefusedFlags] = &[
    RefusedFlags {
        keys: &[
            "enable_snapshot",
            "enable_snapshot_restore",
            "memory_allocator",
        ],
        prefixes: &["snapshot_"],
        reason: "snapshots are not offered: restoring one can make the cache serve another key's bytes instead of a miss",
    },
    RefusedFlags {
        keys: &["enable_oplog", "etcd_endpoints"],
        prefixes: &["oplog_"],
        reason: "the operation log runs on the backend's own etcd: set leader.electionBackend: Etcd, which derives these flags",
    },
    RefusedFlags {
        keys: &["enable_cxl", "cxl_path", "cxl_size"],
        prefixes: &[],
        reason: "CXL replaces leader.allocationStrategy and advertises capacity that no member backs",
    },
    RefusedFlags {
        keys: &["enable_offload", "offload_on_evict"],
        prefixes: &[],
        reason: "the disk tier is switched on by declaring members[].localDisks, which derives these flags",
    },
    RefusedFlags {
        keys: &[
            "enable_multi_tenants",
            "tenant_quota_connector_uri",
            "tenant_quota_connector_type",
        ],
        prefixes: &[],
        reason: "the tenant ledger is switched by leader.multiTenancy and its policy file belongs to the operator",
    },
    RefusedFlags {
        keys: &["allocation_strategy"],
        prefixes: &[],
        reason: "set leader.allocationStrategy instead",
    },
    RefusedFlags {
        keys: &[
            "rpc_port",
            "port",
            "metrics_port",
            "rpc_address",
            "rpc_interface",
        ],
        prefixes: &[],
        reason: "the leader listens where the Service and the members dial (the Pod IP, ports 50051 and 9003)",
    },
    RefusedFlags {
        keys: &[
            "enable_ha",
            "ha_backend_type",
            "ha_backend_connstring",
            "cluster_id",
            "pod_name",
            "pod_namespace",
        ],
        prefixes: &[],
        reason: "leadership is chosen by leader.electionBackend (Kubernetes, Etcd or None) and leader.replicas, which derive these flags",
    },
    RefusedFlags {
        keys: &["config_path"],
        prefixes: &[],
        reason: "a config file makes the store ignore every flag the operator renders",
    },
];

/// The key of a command-line option token: leading dashes and any `=value` stripped
/// (`--rpc_port=1` → `rpc_port`). The one splitter every flag rule starts from: the leader's
/// gflags rules here, the engines' argparse spellings in `kvcache-inject`.
pub fn flag_key(arg: &str) -> &str {
    let arg = arg.trim_start_matches('-');
    arg.split_once('=').map_or(arg, |(k, _)| k)
}

/// The reason a leader flag is refused, if it is.
pub(crate) fn refused_leader_flag(arg: &str) -> Option<&'static str> {
    let key = flag_key(arg);
    REFUSED_LEADER_FLAGS
        .iter()
        .find(|f| f.keys.contains(&key) || f.prefixes.iter().any(|p| key.starts_with(p)))
        .map(|f| f.reason)
}

/// Environment the operator renders into the leader container (Pod identity and the elector).
pub(crate) const LEADER_RENDERED_ENV: &[&str] = &["POD_NAME", "POD_NAMESPACE", "POD_IP"];
/// Prefix of the elector's own configuration variables, rendered into leader and member Pods.
pub(crate) const ELECTOR_ENV_PREFIX: &str = "KVCACHE_ELECTOR_";

/// Environment the operator renders into every member container.
pub(crate) const MEMBER_RENDERED_ENV: &[&str] = &[
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "MOONCAKE_MASTER",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MC_TE_METRIC",
    "MOONCAKE_OFFLOAD_ENABLED",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
    "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
    "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES",
    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
    "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
    "MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT",
    "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY",
    "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION",
    "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
    "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
    "MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO",
    "MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO",
];

/// Device-visibility variables the operator sets to `void` on DRAM groups, so a VRAM-capable
/// image cannot take accelerator memory. Refused in a DRAM group's `extraEnv`; free on VRAM.
pub const DRAM_DEVICE_VISIBILITY_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "MACA_VISIBLE_DEVICES",
];

/// Why an environment name is refused in extraEnv (same words for leader and members).
pub(crate) const RENDERED_ENV_REASON: &str = "the operator renders this variable, and with two entries of one name the runtime picks the winner";

pub(crate) use crate::names::INFINIBAND_DIR;

fn cel_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

fn rule(expr: impl Into<String>, message: impl Into<String>) -> Rule {
    Rule::new(expr.into()).message(Message::Message(message.into()))
}

fn rule_expr(expr: impl Into<String>, message_expression: impl Into<String>) -> Rule {
    Rule::new(expr.into()).message(Message::Expression(message_expression.into()))
}

/// A store container's `resources`: a written limit is not under the written request (the
/// API server would refuse the rendered Pod). The validator also judges a limit against the
/// default request, which CEL does not know.
pub(crate) fn limits_not_under_requests() -> Rule {
    let pair = |k: &str| {
        format!(
            "(!has(self.requests.{k}) || !has(self.limits.{k}) || !isQuantity(self.requests.{k}) || !isQuantity(self.limits.{k}) || quantity(self.limits.{k}).compareTo(quantity(self.requests.{k})) >= 0)"
        )
    };
    rule(
        format!(
            "!has(self.requests) || !has(self.limits) || ({} && {})",
            pair("cpu"),
            pair("memory")
        ),
        LIMIT_UNDER_REQUEST,
    )
}

/// Why a store container's limit under its request is refused.
pub(crate) const LIMIT_UNDER_REQUEST: &str = "a limit is below its request (limits.cpu under requests.cpu, or limits.memory under requests.memory): the Pod would be refused; raise the limit or lower the request";

/// `priorityClassName`: the name of a PriorityClass, a DNS-1123 subdomain.
pub(crate) fn priority_class_name_shape() -> Rule {
    rule(
        "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",
        PRIORITY_CLASS_NAME_REFUSED,
    )
}

/// Why a `priorityClassName` is refused.
pub(crate) const PRIORITY_CLASS_NAME_REFUSED: &str =
    "must be the name of a PriorityClass: lowercase letters, digits, '-' and '.'";

/// `connection`: exactly one of `managed` and `external`.
pub fn exactly_one_connection() -> Rule {
    rule(
        "has(self.managed) != has(self.external)",
        "set exactly one of spec.connection.managed and spec.connection.external",
    )
}

/// `spec.image` / `members[].image`: blank is refused.
pub(crate) fn image_not_blank() -> Rule {
    rule(
        "self.trim() != ''",
        "must not be blank: an image is either named here or left out entirely so the \"kv-cache-backend-image\" setting decides",
    )
}

/// `leader`: standbys need the Lease election.
pub(crate) fn standbys_need_election() -> Rule {
    rule(
        "self.electionBackend != 'None' || self.replicas <= 1",
        "leader.replicas above 1 needs leader.electionBackend: Kubernetes or Etcd; with None only one leader can run",
    )
}

/// `leader`: `electionBackend: Etcd` is chosen when the backend is created.
pub(crate) fn etcd_election_immutable() -> Rule {
    rule(
        "(self.electionBackend == 'Etcd') == (oldSelf.electionBackend == 'Etcd')",
        ETCD_SWITCH_REFUSED,
    )
}

/// `leader`: with `Etcd`, the etcd's size (three members with standbys, one without) is fixed
/// when the backend is created, so `replicas` stays on its side of one.
pub(crate) fn etcd_size_immutable() -> Rule {
    rule(
        "self.electionBackend != 'Etcd' || oldSelf.electionBackend != 'Etcd' || (self.replicas > 1) == (oldSelf.replicas > 1)",
        ETCD_SIZE_REFUSED,
    )
}

/// `leader`: with `Etcd`, the etcd's claims (class and size) are fixed when the backend is
/// created: a StatefulSet's claim templates cannot be changed.
pub(crate) fn etcd_storage_immutable() -> Rule {
    rule(
        "self.electionBackend != 'Etcd' || oldSelf.electionBackend != 'Etcd' || (has(self.etcd) == has(oldSelf.etcd) && (!has(self.etcd) || self.etcd == oldSelf.etcd))",
        ETCD_STORAGE_REFUSED,
    )
}

/// Why a warm backend's `leader.etcd` cannot change.
pub(crate) const ETCD_STORAGE_REFUSED: &str = "leader.etcd (storageClassName, storageSize) is fixed when the backend is created: the etcd's claims are made from it and Kubernetes does not change a StatefulSet's claim templates; create a new backend for other storage";

/// Why a warm backend's `replicas` cannot cross one.
pub(crate) const ETCD_SIZE_REFUSED: &str = "with leader.electionBackend: Etcd, leader.replicas cannot move between 1 and more than 1: the backend's etcd has three members with standbys and one without, and its membership is not changed in place; scale within the same side, or create a new backend";

/// Why `electionBackend` cannot move to or from `Etcd`.
pub(crate) const ETCD_SWITCH_REFUSED: &str = "leader.electionBackend cannot move to or from Etcd: it replaces every leader Pod, adds or removes the backend's etcd, and the cache is lost either way; create a new backend with the other mode and move the pools to it";

fn regex_alternatives(f: &RefusedFlags) -> String {
    let mut alts: Vec<String> = f.keys.iter().map(|k| (*k).to_string()).collect();
    alts.extend(f.prefixes.iter().map(|p| format!("{p}[A-Za-z0-9_]*")));
    format!("^-*(?:{})(?:=.*)?$", alts.join("|"))
}

/// `leader.extraArgs`: the rule for one refused family (an index into
/// [`REFUSED_LEADER_FLAGS`]), naming the offending argument.
pub(crate) fn leader_flags_refused(family: usize) -> Rule {
    let Some(f) = REFUSED_LEADER_FLAGS.get(family) else {
        return Rule::new("true");
    };
    let re = regex_alternatives(f);
    rule_expr(
        format!("self.all(a, !a.matches('{re}'))"),
        format!(
            "'leader.extraArgs: ' + self.filter(a, a.matches('{re}'))[0] + ' is refused: {}'",
            f.reason.replace('\'', "\\'")
        ),
    )
}

/// `leader.extraEnv`: names the operator renders are refused.
pub(crate) fn leader_env_allowed() -> Rule {
    let names = cel_list(LEADER_RENDERED_ENV);
    rule_expr(
        format!("self.all(e, !(e.name in {names}) && !e.name.startsWith('{ELECTOR_ENV_PREFIX}'))"),
        format!(
            "'extraEnv: ' + self.map(e, e.name).filter(n, n in {names} || n.startsWith('{ELECTOR_ENV_PREFIX}'))[0] + ' is refused: {RENDERED_ENV_REASON}'"
        ),
    )
}

/// `members[].extraEnv`: names the operator renders are refused.
pub(crate) fn member_env_allowed() -> Rule {
    let names = cel_list(MEMBER_RENDERED_ENV);
    rule_expr(
        format!("self.all(e, !(e.name in {names}) && !e.name.startsWith('{ELECTOR_ENV_PREFIX}'))"),
        format!(
            "'extraEnv: ' + self.map(e, e.name).filter(n, n in {names} || n.startsWith('{ELECTOR_ENV_PREFIX}'))[0] + ' is refused: {RENDERED_ENV_REASON}'"
        ),
    )
}

/// `members[].extraArgs`: each entry is `key=value`.
pub(crate) fn member_args_shape() -> Rule {
    rule(
        "self.all(a, a.matches('^[A-Za-z0-9_.-]+=.*$'))",
        "each members[].extraArgs entry is a store configuration override written key=value; it is rendered as -D key=value",
    )
}

/// A member group: no host path mounted over the group's own tier.
pub(crate) fn host_path_not_tier() -> Rule {
    rule(
        "!has(self.hostPaths) || !has(self.localDisks) || self.hostPaths.all(h, !self.localDisks.exists(d, d.path == h.mountPath))",
        "hostPaths[].mountPath must not be the group's own localDisks[].path: the tier is mounted there already",
    )
}

/// A DRAM member group: the device-visibility variables are the operator's.
pub(crate) fn dram_visibility_env() -> Rule {
    let vis = cel_list(DRAM_DEVICE_VISIBILITY_ENV);
    rule_expr(
        format!(
            "self.medium != 'DRAM' || !has(self.extraEnv) || self.extraEnv.all(e, !(e.name in {vis}))"
        ),
        format!(
            "'extraEnv: ' + self.extraEnv.map(e, e.name).filter(n, n in {vis})[0] + ' is refused on a DRAM group: the operator sets it to void so the member cannot take accelerator memory'"
        ),
    )
}

/// `hostPaths[].mountPath`: never the InfiniBand device tree.
pub(crate) fn mount_path_not_infiniband() -> Rule {
    rule(
        format!("self != '{INFINIBAND_DIR}' && self != '{INFINIBAND_DIR}/'"),
        "hostPaths[].mountPath must not be /dev/infiniband: device plugins inject the granted devices, and mounting the tree breaks partial grants",
    )
}

const HAS_TIER: &str = "has(m.localDisks) && size(m.localDisks) > 0";

/// `managed`: at most one group carries a disk tier.
pub(crate) fn one_tier_per_backend() -> Rule {
    rule(
        format!("self.members.filter(m, {HAS_TIER}).size() <= 1"),
        "at most one member group per backend may declare localDisks",
    )
}

/// The most member groups a backend holds (the schema's `maxItems`).
pub(crate) const MAX_GROUPS: usize = 32;

/// The projection of each group agrees between old and new at every index both have (groups are
/// appended or dropped at the end). Kubernetes CEL has no index iteration or list slicing, so
/// the comparison is unrolled over the schema's `maxItems`, which keeps its cost constant.
fn common_prefix_equal(projection: &str) -> String {
    (0..MAX_GROUPS)
        .map(|i| {
            let new = projection.replace("m.", &format!("self.members[{i}]."));
            let old = projection.replace("m.", &format!("oldSelf.members[{i}]."));
            format!("(size(self.members) <= {i} || size(oldSelf.members) <= {i} || {new} == {old})")
        })
        .collect::<Vec<_>>()
        .join(" && ")
}

/// `managed`: a group's medium never changes (groups are identified by position).
pub(crate) fn medium_immutable() -> Rule {
    rule(
        common_prefix_equal("m.medium"),
        "members[].medium is immutable: add a new group for the other medium (and narrow this one's nodeSelector to retire it)",
    )
}

/// `managed`: a group's tier is chosen once (not added, removed or repathed).
pub(crate) fn tier_path_immutable() -> Rule {
    rule(
        common_prefix_equal(&format!("({HAS_TIER} ? m.localDisks[0].path : '')")),
        "members[].localDisks is chosen when the group is created: adding a tier to an existing group, removing it or changing its path is refused (capacity, keyLimit and eviction stay editable); append a new group instead",
    )
}

/// `managed`: the 16Mi segment floor on a tiered group, judged only when the value moves.
pub(crate) fn tier_segment_floor() -> Rule {
    rule(
        format!(
            "self.members.all(m, !({HAS_TIER}) \
             || quantity(m.capacityPerMember).compareTo(quantity('{BUCKET_QUANTITY}')) >= 0 \
             || (oldSelf.hasValue() && oldSelf.value().members.exists(o, \
                 has(o.localDisks) && size(o.localDisks) > 0 \
                 && o.localDisks[0].path == m.localDisks[0].path \
                 && o.capacityPerMember == m.capacityPerMember)))"
        ),
        format!(
            "members[].capacityPerMember must hold one bucket ({BUCKET_QUANTITY}) on a group with localDisks: a smaller segment can never complete a bucket, so the tier would report capacity and hold nothing"
        ),
    )
    .optional_old_self(true)
}

/// `localDisks[].path`: absolute.
pub(crate) fn tier_path_absolute() -> Rule {
    rule("self.startsWith('/')", "localDisks[].path must be absolute")
}

/// `localDisks[].path`: not the root.
pub(crate) fn tier_path_not_root() -> Rule {
    rule(
        "self.matches('^/*[^/].*$')",
        "localDisks[].path must not be /",
    )
}

/// `localDisks[].path`: no `..` component.
pub(crate) fn tier_path_no_dotdot() -> Rule {
    rule(
        "!self.split('/').exists(c, c == '..')",
        "localDisks[].path must not contain a .. component",
    )
}

/// `localDisks[].path`: no leading or trailing whitespace.
pub(crate) fn tier_path_no_whitespace() -> Rule {
    rule(
        "!self.matches('^[ \\t].*$') && !self.matches('^.*[ \\t]$')",
        "localDisks[].path must not start or end with spaces or tabs",
    )
}

/// `localDisks[].path`: not the InfiniBand device tree, inside it or above it.
pub(crate) fn tier_path_not_infiniband() -> Rule {
    rule(
        format!(
            "!(self + '/').startsWith('{INFINIBAND_DIR}/') && !'{INFINIBAND_DIR}/'.startsWith(self.endsWith('/') ? self : self + '/')"
        ),
        "localDisks[].path must not equal, be inside or contain /dev/infiniband",
    )
}

/// `localDisks[].path`: in its normal form (no `.` component, no `//`, no trailing `/`).
pub(crate) fn tier_path_normalized() -> Rule {
    rule(
        "size(self) <= 1 || (!self.split('/').exists(c, c == '.') && !self.contains('//') && !self.endsWith('/'))",
        format!(
            "localDisks[].path {}",
            crate::names::TIER_PATH_NOT_NORMALIZED
        ),
    )
}

/// `localDisks[].path`: not the node's system folders or inside them.
pub(crate) fn tier_path_not_system() -> Rule {
    let dirs = crate::names::SYSTEM_DIRS
        .iter()
        .map(|d| format!("'{d}'"))
        .collect::<Vec<_>>()
        .join(", ");
    rule(
        format!("![{dirs}].exists(d, self == d || self.startsWith(d + '/'))"),
        format!(
            "localDisks[].path {}",
            crate::names::TIER_PATH_IN_SYSTEM_DIR
        ),
    )
}

/// `localDisks[].capacity`: one bucket at least.
pub(crate) fn tier_capacity_floor() -> Rule {
    rule(
        format!("quantity(self).compareTo(quantity('{BUCKET_QUANTITY}')) >= 0"),
        format!("localDisks[].capacity must hold one bucket ({BUCKET_QUANTITY})"),
    )
}

/// `localDisks[].keyLimit`: one bucket's worth of keys at least.
pub(crate) fn tier_key_floor() -> Rule {
    rule(
        format!("self >= {BUCKET_KEYS}"),
        format!(
            "localDisks[].keyLimit must hold one bucket's worth of keys ({BUCKET_KEYS} keys in a {BUCKET_QUANTITY} bucket)"
        ),
    )
}

/// `localDisks[]`: watermarks are percentages of `capacity`, so they need it.
pub(crate) fn watermark_needs_capacity() -> Rule {
    rule(
        "!has(self.eviction) || !has(self.eviction.watermark) || has(self.capacity)",
        "localDisks[].eviction.watermark needs localDisks[].capacity: watermarks are percentages of it",
    )
}

/// `eviction`: disabled eviction takes no policy.
pub(crate) fn disabled_eviction_has_no_policy() -> Rule {
    rule(
        "self.enabled || !has(self.policy)",
        "eviction.policy has no effect with eviction.enabled: false; remove one of them",
    )
}

/// `eviction`: disabled eviction takes no watermark.
pub(crate) fn disabled_eviction_has_no_watermark() -> Rule {
    rule(
        "self.enabled || !has(self.watermark)",
        "eviction.watermark has no effect with eviction.enabled: false; remove one of them",
    )
}

/// `watermark`: low below high.
pub(crate) fn watermark_order() -> Rule {
    rule(
        "self.low < self.high",
        "eviction.watermark.low must be below eviction.watermark.high",
    )
}

/// External `address`: `host:port`.
pub(crate) fn host_port() -> Rule {
    rule(
        "self.matches('^([^\\\\s:/\\\\[\\\\]]+|\\\\[[0-9A-Fa-f:.]+\\\\]):[0-9]{1,5}$')",
        "address must be host:port, e.g. mooncake-master.store.svc:50051",
    )
}

/// `self == oldSelf` on the field at `what` (e.g. `spec.poolRef`), refused with
/// `FieldValueForbidden` and a message ending in `fix`, the way to get the change instead.
pub fn immutable(what: &str, fix: &str) -> Rule {
    Rule::new("self == oldSelf")
        .message(Message::Message(format!("{what} is immutable: {fix}")))
        .reason(Reason::FieldValueForbidden)
}

/// `tenancy.namespace` as CEL names it: `namespace` is a CEL reserved word, which Kubernetes
/// escapes as `__namespace__` in a rule (`self.namespace` would not compile).
const TENANCY_NAMESPACE_CEL: &str = "self.__namespace__";

/// `spec.tenancy`: `Dedicated` names the namespace it admits.
pub(crate) fn dedicated_names_its_namespace() -> Rule {
    rule(
        format!("self.mode != 'Dedicated' || has({TENANCY_NAMESPACE_CEL})"),
        TENANCY_NAMESPACE_MISSING,
    )
}

/// `spec.tenancy`: `Shared` names no namespace (it would read as a restriction it is not).
pub(crate) fn shared_names_no_namespace() -> Rule {
    rule(
        format!("self.mode == 'Dedicated' || !has({TENANCY_NAMESPACE_CEL})"),
        TENANCY_NAMESPACE_UNUSED,
    )
}

/// `spec.tenancy.namespace`: a namespace's name, a DNS-1123 label.
pub(crate) fn tenancy_namespace_shape() -> Rule {
    rule(
        "self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')",
        TENANCY_NAMESPACE_SHAPE,
    )
}

/// Why a `Dedicated` tenancy without a namespace is refused.
pub(crate) const TENANCY_NAMESPACE_MISSING: &str = "spec.tenancy.mode: Dedicated needs spec.tenancy.namespace, the one namespace whose KVCachePoolBindings may use this backend";
/// Why a namespace on a `Shared` tenancy is refused.
pub(crate) const TENANCY_NAMESPACE_UNUSED: &str = "spec.tenancy.namespace is read only with mode: Dedicated; set mode: Dedicated to admit that namespace alone, or remove it";
/// Why a tenancy namespace that no namespace can have is refused.
pub(crate) const TENANCY_NAMESPACE_SHAPE: &str = "spec.tenancy.namespace must be a namespace name: a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)";

/// `KVCachePool.spec.backends`: exactly one.
pub(crate) fn exactly_one_backend() -> Rule {
    rule(
        "size(self) == 1",
        "spec.backends must name exactly one KVCacheBackend",
    )
}

/// A Binding's domain name: the store's tenant rules and a DNS-1123 label.
pub(crate) fn domain_name_shape() -> Rule {
    rule(
        "self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')",
        "spec.domain.name must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters); it is the store's tenant id",
    )
}

/// ModelDeployment: the role set and each role's kind are frozen.
pub(crate) fn roles_frozen() -> Rule {
    rule(
        "size(self.roles) == size(oldSelf.roles) && self.roles.all(r, oldSelf.roles.exists(o, o.name == r.name && o.kind == r.kind))",
        "spec.roles: the role set (names and kinds) cannot be edited; a different set means a new ModelDeployment",
    )
}

/// A frozen field checked at the spec level (so adding or removing it counts as an edit).
pub(crate) fn immutable_on(expr: &str, what: &str, fix: &str) -> Rule {
    Rule::new(expr)
        .message(Message::Message(format!("{what} cannot be edited: {fix}")))
        .reason(Reason::FieldValueForbidden)
}

/// ModelDeployment: a role without an image needs an engine version to pick the runner image.
pub(crate) fn engine_version_or_images() -> Rule {
    rule(
        "(has(self.engine.version) && self.engine.version != '') || self.roles.all(r, has(r.image))",
        "spec.engine.version is required when a role names no image: it picks the runner image and the store client it carries",
    )
}
