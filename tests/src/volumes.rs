//! Persistent volumes on the harness's nodes without a provisioner: a StorageClass with
//! `kubernetes.io/no-provisioner` (binding waits for the first Pod, so the scheduler places the
//! Pod where a volume is) and local PersistentVolumes, each a folder of one node's own
//! `/var/lib/kvcache`. Kubernetes' own binder and scheduler do the rest, as on a cluster with
//! local disks.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use k8s_openapi::api::core::v1::{
    LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use crate::Result;
use crate::nodes::Nodes;

/// The StorageClass the harness's local volumes belong to.
pub const LOCAL_CLASS: &str = "kvcache-local";
/// The size each local volume offers (a folder: the figure only matches claims).
pub const LOCAL_SIZE: &str = "1Gi";
/// The user the store and etcd images run as: the folders are given to it.
const IMAGE_UID: u32 = 65532;

/// Creates [`LOCAL_CLASS`] (once) and `per_node` fresh local volumes on every node, named
/// `<tag>-<node>-<i>`. A released local volume is not bound again (nothing deletes its data),
/// so each test that deletes its claims asks for volumes under a tag of its own.
pub async fn local_volumes(
    client: &kube::Client,
    nodes: &Nodes,
    tag: &str,
    per_node: usize,
) -> Result<()> {
    let pp = PatchParams::apply("kvcache-e2e").force();
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(LOCAL_CLASS.into()),
            ..Default::default()
        },
        provisioner: "kubernetes.io/no-provisioner".into(),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        reclaim_policy: Some("Retain".into()),
        ..Default::default()
    };
    Api::<StorageClass>::all(client.clone())
        .patch(LOCAL_CLASS, &pp, &Patch::Apply(&class))
        .await?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for node in &nodes.nodes {
        for i in 0..per_node {
            let name = format!("{tag}-{}-{i}", node.name);
            let inside = format!("/var/lib/kvcache/volumes/{name}");
            let folder = node.host_root.join(inside.trim_start_matches('/'));
            std::fs::create_dir_all(&folder).map_err(crate::io("a local volume's folder"))?;
            std::os::unix::fs::chown(&folder, Some(IMAGE_UID), Some(IMAGE_UID))
                .map_err(crate::io("giving a local volume to the images' user"))?;
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o750))
                .map_err(crate::io("a local volume's mode"))?;
            let pv = PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeSpec {
                    capacity: Some(BTreeMap::from([(
                        "storage".to_owned(),
                        Quantity(LOCAL_SIZE.into()),
                    )])),
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    persistent_volume_reclaim_policy: Some("Retain".into()),
                    storage_class_name: Some(LOCAL_CLASS.into()),
                    local: Some(LocalVolumeSource {
                        path: inside,
                        ..Default::default()
                    }),
                    node_affinity: Some(VolumeNodeAffinity {
                        required: Some(NodeSelector {
                            node_selector_terms: vec![NodeSelectorTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "kubernetes.io/hostname".into(),
                                    operator: "In".into(),
                                    values: Some(vec![node.name.clone()]),
                                }]),
                                ..Default::default()
                            }],
                        }),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            volumes.patch(&name, &pp, &Patch::Apply(&pv)).await?;
        }
    }
    Ok(())
}
