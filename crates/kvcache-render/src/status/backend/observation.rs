//! What one pass observed of a backend ([`Observation`]) and what its status becomes
//! ([`Computed`]).

use kvcache_api::backend::{
    BackendPhase, Capacity, ElectionStatus, EtcdStatus, MemberStatus, ObjectRef, UnknownSegment,
};
use kvcache_api::condition::Cond;

use crate::members::mounts::OtherMember;
use crate::members::rollout::GroupStep;
use crate::observe::read::{LeaderReplicas, MemberPod};
use crate::observe::store::StoreReading;

/// Everything one pass observed.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The backend's `metadata.generation`, written back as `status.observedGeneration`.
    pub generation: Option<i64>,
    /// Being deleted.
    pub deleting: bool,
    /// Pools on it.
    pub used_by: Vec<ObjectRef>,
    /// The namespaces with a Binding on it, sorted (`World::bound_namespaces`), written as
    /// `status.boundNamespaces`.
    pub bound_namespaces: Vec<String>,
    /// Where engines connect.
    pub endpoint: Option<String>,
    /// The leader Deployment (managed; `None` while it does not exist yet).
    pub leader: Option<LeaderReplicas>,
    /// The Lease holder (`Some(None)`: the Lease exists without a holder; `None`: no Lease).
    pub lease_holder: Option<Option<String>>,
    /// The store's answers (`None`: not read this pass).
    pub store: Option<StoreReading>,
    /// Member Pods of every group.
    pub members: Vec<MemberPod>,
    /// The rendered fingerprint of each group, by index.
    pub rendered_hashes: Vec<String>,
    /// The member rollout's step of each group this pass ([`crate::members::rollout::member_rollout`]).
    pub rollout: Vec<GroupStep>,
    /// The rollout holds standbys back until the electing template is out
    /// (docs/design.md#two-step-election).
    pub standbys_held: bool,
    /// `mooncake_master --version` as the running leader reported it, with the version the
    /// image tag names.
    pub store_version: Option<(String, Option<String>)>,
    /// Why the backend's objects could not be rendered this pass (a condition reason and the
    /// message), e.g. no store image: the phase is then `Error` whatever else was observed.
    pub render_refused: Option<(&'static str, String)>,
    /// Why the cluster settings could not be read (the refusal naming the key), and whether
    /// the last good settings were kept (`false`: there were none, nothing was rendered).
    pub settings_refused: Option<(String, bool)>,
    /// The member Pods of the other backends (in the same namespace): a segment of one of them
    /// on this master is a member mounted on the wrong master (`crate::members::mounts`).
    pub other_members: Vec<OtherMember>,
    /// A warm backend's etcd StatefulSet: Pods asked for and ready (`None`: not warm, or the
    /// StatefulSet does not exist yet), with the endpoint list.
    pub etcd: Option<EtcdStatus>,
    /// The member groups on the host network, out of every NetworkPolicy's reach (`None`: the
    /// objects were not rendered in this pass).
    pub unguarded_groups: Option<Vec<String>>,
    /// The segments of no known Pod the serving master lists (`crate::members::mounts::unknown_segments`);
    /// `None`: not judged this pass (no serving master, no listing, or an external store).
    pub unknown_segments: Option<Vec<UnknownSegment>>,
    /// Whether confirmed unknown segments are drained (`--unknown-segments=drain`) or only
    /// reported.
    pub drain_unknown: bool,
    /// Whether something enforces the policies, as the isolation probe found
    /// (`crate::objects::backend::probe`); `None`: not probed (nothing rendered, or an observation made
    /// without it), and `NetworkIsolated` says only that the policies are applied.
    pub isolation: Option<crate::objects::backend::probe::Isolation>,
    /// A new probe record to write to `status.isolationProbe` (`None`: keep the stored one).
    pub isolation_probe: Option<kvcache_api::backend::IsolationProbe>,
}

impl Observation {
    /// Nothing observed yet, for the backend's `generation`.
    pub fn empty(generation: Option<i64>) -> Self {
        Observation {
            generation,
            deleting: false,
            used_by: Vec::new(),
            bound_namespaces: Vec::new(),
            endpoint: None,
            leader: None,
            lease_holder: None,
            store: None,
            members: Vec::new(),
            rendered_hashes: Vec::new(),
            rollout: Vec::new(),
            standbys_held: false,
            store_version: None,
            render_refused: None,
            settings_refused: None,
            other_members: Vec::new(),
            etcd: None,
            unguarded_groups: None,
            unknown_segments: None,
            drain_unknown: true,
            isolation: None,
            isolation_probe: None,
        }
    }
}

/// What to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Computed {
    /// The phase to write to `status.phase`.
    pub phase: BackendPhase,
    /// Why not `Ready`.
    pub phase_message: Option<String>,
    /// Capacity (absent unless read from a serving leader).
    pub capacity: Option<Capacity>,
    /// Member rows.
    pub members: Vec<MemberStatus>,
    /// Conditions, without times.
    pub conditions: Vec<Cond>,
    /// A warm backend's election record (`None` otherwise).
    pub election: Option<ElectionStatus>,
}
