//! What the conditions ask of a backend's spec (managed, warm, a disk tier, a group's medium)
//! and how their messages name a member Pod's place and the pools on the backend.

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::{Medium, ObjectRef};

use super::observation::Observation;
use crate::observe::read::MemberPod;

pub(super) fn managed(b: &KVCacheBackend) -> bool {
    b.spec.connection.managed.is_some()
}

pub(super) fn has_tier(b: &KVCacheBackend) -> bool {
    b.spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.members.iter().any(|g| g.tier().is_some()))
}

pub(super) fn medium_of(b: &KVCacheBackend, group: usize) -> String {
    b.spec
        .connection
        .managed
        .as_ref()
        .and_then(|m| m.members.get(group))
        .map(|g| match g.medium {
            Medium::Dram => "DRAM",
            Medium::Vram => "VRAM",
        })
        .unwrap_or_default()
        .to_owned()
}

pub(super) fn name(b: &KVCacheBackend) -> &str {
    b.metadata.name.as_deref().unwrap_or_default()
}

pub(super) fn warm(b: &KVCacheBackend) -> bool {
    b.spec
        .connection
        .managed
        .as_ref()
        .is_some_and(|m| m.leader.warm())
}

/// A managed backend whose leader Deployment has no ready replica (or does not exist yet).
pub(super) fn no_ready_leader(b: &KVCacheBackend, obs: &Observation) -> bool {
    managed(b) && obs.leader.is_none_or(|l| l.ready == 0)
}

/// The pools on the backend, as a sentence names them.
pub(super) fn listed(used_by: &[ObjectRef]) -> String {
    used_by
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn where_(p: &MemberPod) -> String {
    if p.node.is_empty() {
        "not scheduled".to_owned()
    } else {
        format!("node {}", p.node)
    }
}
