//! Leader edits (docs/high-availability.md#leader-edits): an update of a backend that changes
//! the leader's Pod template restarts the master. With the default Lease election (and with no
//! election) the master that comes back knows no key, so the update is admitted with a warning
//! that says so before it is applied (also under `kubectl apply --dry-run=server`). With
//! `electionBackend: Etcd` the new master replays the metadata operation log from the backend's
//! etcd and keeps the keys, so no warning; an edit that rolls the members in the same pass (the
//! image, the priority class: every store Pod's) waits for the leader's rollout before the
//! members are drained and replaced (`tests/tests/operator_on_nodes/leader_edits.rs` shows it).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kvcache_api::{KVCacheBackend, Settings};

use crate::objects::backend::{BackendInputs, StoreAccess, render, store_image};

/// The leader's Pod template as the render draws it for `backend` under `settings` (`None`
/// for an external backend). Nothing of it depends on the operator's namespace but a warm
/// backend's etcd endpoints, which an edit cannot move, so any one namespace compares two specs
/// alike.
fn leader_template(backend: &KVCacheBackend, settings: &Settings) -> Option<PodTemplateSpec> {
    backend.spec.connection.managed.as_ref()?;
    let objects = render(&BackendInputs {
        backend,
        store_image: store_image(backend, settings).unwrap_or_default(),
        namespace: "",
        elector_image: settings.elector_image(),
        etcd_image: settings.etcd_image(),
        bound_namespaces: &[],
        policy: None,
        access: &StoreAccess::default(),
    })
    .ok()?;
    Some(objects.deployment?.spec?.template)
}

/// The warning an update of `old` into `new` earns when it changes the leader's Pod template
/// and the cache will not survive it: what happens, the key count the status last read
/// ("unknown" when it holds none) and the alternative. A Lease-elected (or unelected) master
/// restarts cold. A warm backend (`electionBackend: Etcd`) keeps its keys through each leader
/// edit, those that roll the members too (the image, the priority class) included: the member
/// rollout waits for the leader's rollout to settle and a master to serve before it drains and
/// replaces a member (`crate::plan::backend`), as
/// `tests/tests/operator_on_nodes/leader_edits.rs` shows. `None` when the leader's template
/// stays, for a warm backend, and for an external backend.
pub fn leader_edit_warning(
    new: &KVCacheBackend,
    old: &KVCacheBackend,
    settings: &Settings,
) -> Option<String> {
    let managed = new.spec.connection.managed.as_ref()?;
    if managed.leader.warm() || leader_template(new, settings)? == leader_template(old, settings)? {
        return None;
    }
    let name = new.metadata.name.as_deref().unwrap_or_default();
    let keys = old
        .status
        .as_ref()
        .and_then(|s| s.election.as_ref())
        .and_then(|e| e.keys)
        .map_or_else(|| "unknown".to_owned(), |k| k.to_string());
    Some(format!(
        "spec.connection.managed: this edit changes the leader's Pod template, so the master ({name}-leader) restarts and the cache empties: every key misses afterwards (keys the status last read: {keys}). To keep the cache through leader edits, run the store with leader.electionBackend: Etcd and leader.replicas above one (docs/warm-failover.md); electionBackend is fixed at creation, so that is a new backend"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn backend(leader: Value, extra: Value) -> KVCacheBackend {
        let mut spec = json!({"connection": {"managed": {"leader": leader,
            "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "mooncake-dram", "uid": "u-1"},
            "spec": spec,
        }))
        .expect("a backend")
    }

    fn lease() -> KVCacheBackend {
        backend(json!({}), json!({}))
    }

    fn warm(replicas: i32) -> KVCacheBackend {
        backend(
            json!({"electionBackend": "Etcd", "replicas": replicas}),
            json!({}),
        )
    }

    fn leader(b: &mut KVCacheBackend) -> &mut kvcache_api::backend::Leader {
        &mut b.spec.connection.managed.as_mut().expect("managed").leader
    }

    /// The four leader edits of docs/high-availability.md#leader-edits, applied to `b`.
    fn edits(b: &KVCacheBackend) -> Vec<(&'static str, KVCacheBackend)> {
        let mut resources = b.clone();
        leader(&mut resources).resources = Some(
            serde_json::from_value(json!({"requests": {"cpu": "750m", "memory": "1Gi"}}))
                .expect("resources"),
        );
        let mut image = b.clone();
        image.spec.image = Some("kvcacheai/mooncake:v0.3.13.post1-b".into());
        let mut arg = b.clone();
        leader(&mut arg).extra_args = vec!["--default_kv_soft_pin_ttl=60m".into()];
        let mut priority = b.clone();
        if let Some(m) = priority.spec.connection.managed.as_mut() {
            m.priority_class_name = Some("kvcache-store".into());
        }
        vec![
            ("resources", resources),
            ("image", image),
            ("extra arg", arg),
            ("priority class", priority),
        ]
    }

    fn settings() -> Settings {
        Settings::default()
    }

    #[test]
    fn an_unchanged_template_earns_no_warning() {
        let b = lease();
        assert_eq!(leader_edit_warning(&b, &b, &settings()), None);
        // Standbys join under the same template (docs/high-availability.md): no restart.
        let mut scaled = b.clone();
        leader(&mut scaled).replicas = 3;
        assert_eq!(leader_edit_warning(&scaled, &b, &settings()), None);
        // A member edit leaves the leader alone.
        let mut members = b.clone();
        if let Some(m) = members.spec.connection.managed.as_mut() {
            m.members[0].capacity_per_member =
                serde_json::from_value(json!("2Gi")).expect("a quantity");
        }
        assert_eq!(leader_edit_warning(&members, &b, &settings()), None);
    }

    #[test]
    fn every_leader_edit_of_a_lease_backend_warns_with_the_alternative() {
        let b = lease();
        for (edit, new) in edits(&b) {
            let w = leader_edit_warning(&new, &b, &settings())
                .unwrap_or_else(|| panic!("{edit}: no warning"));
            assert!(
                w.contains("the master (mooncake-dram-leader) restarts"),
                "{edit}: {w}"
            );
            assert!(w.contains("cache empties"), "{edit}: {w}");
            assert!(
                w.contains("keys the status last read: unknown"),
                "{edit}: {w}"
            );
            assert!(w.contains("electionBackend: Etcd"), "{edit}: {w}");
            assert!(w.contains("replicas above one"), "{edit}: {w}");
        }
    }

    #[test]
    fn a_backend_without_election_warns_too() {
        let b = backend(json!({"electionBackend": "None"}), json!({}));
        for (edit, new) in edits(&b) {
            assert!(
                leader_edit_warning(&new, &b, &settings()).is_some(),
                "{edit}: no warning"
            );
        }
    }

    #[test]
    fn the_warning_names_the_key_count_the_status_last_read() {
        let mut b = lease();
        b.status =
            Some(serde_json::from_value(json!({"election": {"keys": 160}})).expect("a status"));
        let (_, new) = edits(&b).remove(0);
        let w = leader_edit_warning(&new, &b, &settings()).expect("a warning");
        assert!(w.contains("keys the status last read: 160"), "{w}");
    }

    #[test]
    fn a_warm_backend_is_not_warned_of_any_leader_edit() {
        for replicas in [2, 1] {
            let b = warm(replicas);
            for (edit, new) in edits(&b) {
                assert_eq!(
                    leader_edit_warning(&new, &b, &settings()),
                    None,
                    "{edit} at {replicas}"
                );
            }
        }
    }

    #[test]
    fn an_external_backend_has_no_leader_to_restart() {
        let b: KVCacheBackend = serde_json::from_value(json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "ext"},
            "spec": {"connection": {"external": {"endpoints": [
                {"name": "Client", "address": "10.0.0.1:50051"},
                {"name": "Admin", "address": "10.0.0.1:9003"}]}}},
        }))
        .expect("an external backend");
        assert_eq!(leader_edit_warning(&b, &b, &settings()), None);
    }
}
