//! The condition types of a backend's status (`kubectl get kvcb -o yaml` shows them as
//! `type`), in the order the operator writes them.

/// Nothing holds the backend: no pool uses it.
pub const DELETABLE: &str = "Deletable";
/// The leader answers and serves.
pub const LEADER_AVAILABLE: &str = "LeaderAvailable";
/// `status.capacity` was read from the serving leader.
pub const CAPACITY_OBSERVED: &str = "CapacityObserved";
/// Every ready member Pod's segment is registered.
pub const MEMBERS_MOUNTED: &str = "MembersMounted";
/// Writes complete.
pub const POOL_WRITES: &str = "PoolWrites";
/// Every leader replica and member Pod runs the current template.
pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
/// The Lease names a holder (with election only).
pub const ELECTION_OBSERVED: &str = "ElectionObserved";
/// A warm backend's etcd has a quorum of ready members.
pub const ETCD_AVAILABLE: &str = "EtcdAvailable";
/// A warm backend's last failover kept the keys (written once a failover was seen).
pub const FAILOVER_KEPT_CACHE: &str = "FailoverKeptCache";
/// The disk tier's folders were empty on first start (with a disk tier only).
pub const TIER_WAS_EMPTY: &str = "TierWasEmpty";
/// A declared disk tier is registered with the master (with a disk tier only).
pub const TIER_REGISTERED: &str = "TierRegistered";
/// The running master's version agrees with the image tag (once the elector reported it).
pub const STORE_VERSION_OBSERVED: &str = "StoreVersionObserved";
/// NetworkPolicies keep the store's Pods to the backend's own Pods and its bound namespaces
/// (`False` while a member group runs on the host network, which no policy covers).
pub const NETWORK_ISOLATED: &str = "NetworkIsolated";
/// Every store workload has a disruption budget (`False` while the leader runs one Pod, which
/// a drain of its node restarts; docs/high-availability.md#disruption-budgets).
pub const DISRUPTION_BUDGET: &str = "DisruptionBudget";
/// The members on nodes being taken out of service (cordoned, marked for deletion by the
/// cluster autoscaler, or no longer selected by their group) were drained through the master
/// first; absent while no member's node is leaving (docs/design.md#node-maintenance).
pub const DRAINED: &str = "Drained";
/// The master lists segments no member Pod of the backend mounted (a managed backend's
/// serving master only): each named with its address.
pub const UNKNOWN_SEGMENTS: &str = "UnknownSegments";
/// The backend's objects could not be rendered (written only then, always `False`).
pub const RENDERED: &str = "Rendered";
/// The cluster settings could not be read (written only then, always `False`): the message
/// names the key and says whether the last good settings are kept.
pub const SETTINGS_READ: &str = "SettingsRead";
