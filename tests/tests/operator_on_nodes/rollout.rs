//! What an edit recreates: a member fingerprint change replaces exactly the member Pods it
//! concerns, a change of the cluster's store image setting rolls only the backends that name no
//! image of their own, and an unusable setting rolls nothing and is named.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::pods;
use kvcache_e2e::status::{condition, phase, wait_condition, wait_event};
use kvcache_e2e::walkthrough::{self, backend_pods};

use crate::{
    MIB, NAMESPACE, PINNED_IMAGE, WAIT, apply, backend, capacity, cluster, wait_backend,
    wait_backend_ready,
};

#[test]
fn a_member_fingerprint_change_recreates_exactly_its_pods_and_a_wider_selector_none() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-roll";
        apply(&client, &backend(name, |_| {})).await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let selector = backend_pods(name, "member-0");
        let before: Vec<String> = pods::wait_ready(&store, &selector, 2, WAIT)
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect();

        // Another node selector that selects the same nodes: no member Pod is recreated.
        apply(
            &client,
            &backend(name, |v| {
                v["spec"]["connection"]["managed"]["members"][0]["nodeSelector"] =
                    serde_json::json!({"kvcache": "true"});
            }),
        )
        .await?;
        wait_backend(&client, name, "the edit observed", |b| {
            b.status.as_ref().and_then(|s| s.observed_generation) == b.metadata.generation
        })
        .await?;
        let after: Vec<String> = pods::wait_ready(&store, &selector, 2, WAIT)
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect();
        assert_eq!(before, after, "a selector change recreates no member Pod");

        // Less capacity per member: the fingerprint moves, both Pods are replaced and the
        // store reports the new figure.
        apply(
            &client,
            &backend(name, |v| {
                let g = &mut v["spec"]["connection"]["managed"]["members"][0];
                g["nodeSelector"] = serde_json::json!({"kvcache": "true"});
                g["capacityPerMember"] = "128Mi".into();
            }),
        )
        .await?;
        // Both member Pods replaced (the operator deletes exactly the stale ones)...
        let replaced = pods::wait_pods(
            &store,
            &selector,
            "2 Ready member Pods, none of the earlier ones",
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter().all(|p| {
                        pods::is_ready(p) && !before.contains(&p.uid().unwrap_or_default())
                    })
            },
        )
        .await?;
        assert_eq!(replaced.len(), 2);
        // ... and the store's figure is theirs: 2 x 128 MiB in two member rows.
        wait_backend(
            &client,
            name,
            "Ready with 256Mi from the replaced members",
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && capacity(b) == Some(256 * MIB)
                    && b.status.as_ref().is_some_and(|s| s.members.len() == 2)
            },
        )
        .await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The store image by another name that carries the same master (the engine stand-in is layered
/// on the store image): what the setting is changed to.
const OTHER_STORE_IMAGE: &str = "localhost/kvcache/engine:mooncake-0.3.13.post1";

fn image_of(p: &Pod) -> Option<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
}

#[test]
fn a_setting_change_rolls_the_pods_of_backends_without_their_own_image_only_and_an_unusable_one_keeps_the_last_good()
 {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let (follows, pinned) = ("dram-follows", "dram-pinned");
        apply(
            &client,
            &backend(follows, |v| {
                // The walkthrough's own choice: no image, the cluster setting decides.
                if let Some(spec) = v["spec"].as_object_mut() {
                    spec.remove("image");
                }
            }),
        )
        .await?;
        apply(&client, &backend(pinned, |_| {})).await?;
        for name in [follows, pinned] {
            wait_backend_ready(&client, name, 512 * MIB).await?;
        }
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let uids = |p: &[Pod]| {
            let mut u = p
                .iter()
                .map(|p| p.uid().unwrap_or_default())
                .collect::<Vec<_>>();
            u.sort();
            u
        };
        let pinned_before =
            pods::wait_ready(&store, &backend_pods(pinned, "member-0"), 2, WAIT).await?;

        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
        let setting = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": kvcache_api::settings::SETTINGS_CONFIG_MAP},
            "data": {"kv-cache-backend-image": OTHER_STORE_IMAGE},
        });
        maps.patch(
            kvcache_api::settings::SETTINGS_CONFIG_MAP,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&setting),
        )
        .await?;
        // The unpinned backend's leader and members run the new image, and it is Ready again.
        for component in ["leader", "member-0"] {
            let want = if component == "leader" { 1 } else { 2 };
            pods::wait_pods(
                &store,
                &backend_pods(follows, component),
                &format!("{want} Ready on {OTHER_STORE_IMAGE}"),
                WAIT,
                |p| {
                    p.len() == want
                        && p.iter().all(|p| {
                            pods::is_ready(p) && image_of(p).as_deref() == Some(OTHER_STORE_IMAGE)
                        })
                },
            )
            .await?;
        }
        // On the new image.
        wait_backend_ready(&client, follows, 512 * MIB).await?;
        // The pinned one: the same member Pods, on its own image.
        let pinned_after =
            pods::wait_ready(&store, &backend_pods(pinned, "member-0"), 2, WAIT).await?;
        assert_eq!(uids(&pinned_before), uids(&pinned_after));
        assert!(
            pinned_after
                .iter()
                .all(|p| image_of(p).as_deref() == Some(PINNED_IMAGE))
        );

        // An unusable value beside another image: the settings are refused as a whole, the last
        // good ones kept (the unpinned backend rolls nowhere), and the backend names the key.
        let follows_before =
            pods::wait_ready(&store, &backend_pods(follows, "member-0"), 2, WAIT).await?;
        let dtype_key = kvcache_api::settings::keys::DTYPE_OWNED;
        let refused = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": kvcache_api::settings::SETTINGS_CONFIG_MAP},
            "data": {"kv-cache-backend-image": PINNED_IMAGE, dtype_key: "yes"},
        });
        maps.patch(
            kvcache_api::settings::SETTINGS_CONFIG_MAP,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&refused),
        )
        .await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let b = wait_condition(
            &backends,
            follows,
            "SettingsRead=False/SettingsUnreadable",
            WAIT,
        )
        .await?;
        let message = condition(&b, "SettingsRead")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            message.contains(dtype_key) && message.contains("last good settings are kept"),
            "the condition names the key and what is kept: {message}"
        );
        // The event is recorded by a reconcile like the condition: listed until it is there.
        wait_event(&client, follows, "SettingsUnreadable", dtype_key, WAIT).await?;
        let events = Api::<Event>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        assert!(
            events.items.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(follows)
                    && e.reason.as_deref() == Some("SettingsUnreadable")
                    && e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref().is_some_and(|n| n.contains(dtype_key))
            }),
            "the SettingsUnreadable event naming {dtype_key} on {follows} is a Warning"
        );
        // The backend was reconciled under the refusal and rolled nothing back.
        let follows_now =
            pods::wait_ready(&store, &backend_pods(follows, "member-0"), 2, WAIT).await?;
        assert_eq!(uids(&follows_before), uids(&follows_now));
        assert!(
            follows_now
                .iter()
                .all(|p| image_of(p).as_deref() == Some(OTHER_STORE_IMAGE)),
            "still on the last good setting's image"
        );

        // Fixed: the new image is taken and the condition is gone.
        let fixed = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": kvcache_api::settings::SETTINGS_CONFIG_MAP},
            "data": {"kv-cache-backend-image": PINNED_IMAGE},
        });
        maps.patch(
            kvcache_api::settings::SETTINGS_CONFIG_MAP,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&fixed),
        )
        .await?;
        pods::wait_pods(
            &store,
            &backend_pods(follows, "member-0"),
            &format!("2 Ready on {PINNED_IMAGE}"),
            WAIT,
            |p| {
                p.len() == 2
                    && p.iter()
                        .all(|p| pods::is_ready(p) && image_of(p).as_deref() == Some(PINNED_IMAGE))
            },
        )
        .await?;
        wait_backend(&client, follows, "no SettingsRead condition", |b| {
            condition(b, "SettingsRead").is_none()
        })
        .await?;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
