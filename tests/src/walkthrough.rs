//! The seed walkthrough (`examples/walkthrough`) at demo size, rendered by
//! `kvcache-operator render` and applied with the client.
//!
//! Demo sizing (these nodes offer 4 GiB of memory and one `nvidia.com/gpu` each): every member
//! group contributes `capacityPerMember: 256Mi`, and the InstanceType keeps its GPU but asks for
//! 250m CPU and 384Mi of memory instead of 8 CPUs and 32Gi.

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::pinned_kind;
use kube::{Client, ResourceExt};

use crate::{Error, Result, paths};

/// Each member's contribution at demo size.
pub const DEMO_CAPACITY_PER_MEMBER: &str = "256Mi";
/// The InstanceType's CPU at demo size.
pub const DEMO_ROLE_CPU: &str = "250m";
/// The InstanceType's memory at demo size.
pub const DEMO_ROLE_MEMORY: &str = "384Mi";
/// A store's CPU on these nodes (two cores each, shared by every node of the machine), written
/// through the backend's own `resources` fields: the product's defaults (one CPU per store
/// container, `kvcache_api::resources`) are sized for real nodes and never shrunk for the rig.
#[derive(Clone, Copy, Debug)]
pub struct RigCpu {
    /// Each leader container's CPU request.
    pub leader: &'static str,
    /// Each member container's CPU request.
    pub member: &'static str,
}

/// Where no engine runs: small enough that every store a test binary leaves on its shared
/// cluster still fits (at 100m the 21 tests of `operator_on_nodes` left warm etcd and engine
/// Pods Pending for CPU); what the suites ran with before the product requested more.
pub const RIG_STORE_CPU: RigCpu = RigCpu {
    leader: "25m",
    member: "25m",
};
/// Beside real engines (500m each in the demo and the real-engine tests): a member's CPU weight
/// equal to an engine's, so transfers keep their share while the engines prefill on every core;
/// the leader at half, so the demo's three-leader HA step still fits the two nodes.
pub const ENGINE_RIG_STORE_CPU: RigCpu = RigCpu {
    leader: "250m",
    member: "500m",
};
/// The leader's memory request on the rig (the product's default, 1Gi, holds millions of keys).
pub const RIG_LEADER_MEMORY: &str = "64Mi";

/// Writes the rig's store resources into a KVCacheBackend (its JSON, edited in place): the
/// leader's and every member group's CPU request, and the leader's memory request, replacing
/// what they had.
pub fn rig_store_resources(backend: &mut serde_json::Value, cpu: RigCpu) {
    store_resources(backend, cpu, true);
}

/// As [`rig_store_resources`], but only where the leader or a group has no `resources` of its
/// own: the demo size's last step, after a test's own edit (which may replace the leader
/// object whole).
pub fn fill_store_resources(backend: &mut serde_json::Value, cpu: RigCpu) {
    store_resources(backend, cpu, false);
}

fn store_resources(backend: &mut serde_json::Value, cpu: RigCpu, replace: bool) {
    let Some(managed) = backend
        .pointer_mut("/spec/connection/managed")
        .filter(|m| m.is_object())
    else {
        return;
    };
    if !managed["leader"].is_object() {
        managed["leader"] = serde_json::json!({});
    }
    if replace || managed["leader"].get("resources").is_none() {
        managed["leader"]["resources"] =
            serde_json::json!({"requests": {"cpu": cpu.leader, "memory": RIG_LEADER_MEMORY}});
    }
    if let Some(groups) = managed["members"].as_array_mut() {
        for g in groups {
            if replace || g.get("resources").is_none() {
                g["resources"] = serde_json::json!({"requests": {"cpu": cpu.member}});
            }
        }
    }
}

/// The field manager the tests apply with.
pub const MANAGER: &str = "kvcache-e2e";

/// The walkthrough's own folder.
pub fn examples(name: &str) -> PathBuf {
    paths::workspace_root().join("examples").join(name)
}

/// Copies the manifests of `from` into `out` with demo sizing, then lets `edit` change each
/// object (as a JSON value) before it is written; an object for which `edit` answers false is
/// left out. Returns `out`.
pub fn demo_manifests(
    from: &Path,
    out: &Path,
    edit: impl Fn(&mut serde_json::Value) -> bool,
) -> Result<PathBuf> {
    std::fs::create_dir_all(out).map_err(crate::io(format!("creating {}", out.display())))?;
    for f in manifest_files(from)? {
        let text =
            std::fs::read_to_string(&f).map_err(crate::io(format!("reading {}", f.display())))?;
        let mut docs = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut v: serde_json::Value =
                serde::Deserialize::deserialize(doc).map_err(|e| Error::Invalid {
                    path: f.display().to_string(),
                    what: "manifest",
                    reason: e.to_string(),
                })?;
            if v.is_null() {
                continue;
            }
            demo_size(&mut v);
            if !edit(&mut v) {
                continue;
            }
            if v["kind"] == "KVCacheBackend" {
                fill_store_resources(&mut v, RIG_STORE_CPU);
            }
            docs.push(serde_yaml::to_string(&v).map_err(|e| Error::Invalid {
                path: f.display().to_string(),
                what: "manifest",
                reason: e.to_string(),
            })?);
        }
        let name = f.file_name().unwrap_or_default();
        std::fs::write(out.join(name), docs.join("---\n"))
            .map_err(crate::io("writing a demo manifest"))?;
    }
    Ok(out.to_owned())
}

/// Demo sizing of one object.
fn demo_size(v: &mut serde_json::Value) {
    match v["kind"].as_str() {
        Some("KVCacheBackend") => {
            if let Some(groups) = v
                .pointer_mut("/spec/connection/managed/members")
                .and_then(|m| m.as_array_mut())
            {
                for g in groups {
                    g["capacityPerMember"] = DEMO_CAPACITY_PER_MEMBER.into();
                }
            }
        }
        Some("InstanceType") => {
            if let Some(r) = v.pointer_mut("/spec/resources") {
                r["cpu"] = DEMO_ROLE_CPU.into();
                r["memory"] = DEMO_ROLE_MEMORY.into();
            }
        }
        _ => {}
    }
}

/// Renders a folder of manifests with `kvcache-operator render`, store workloads in
/// `namespace`; returns the objects.
pub fn render(dir: &Path, namespace: &str) -> Result<Vec<DynamicObject>> {
    let out = Command::new(paths::operator_bin()?)
        .args(["render", "--namespace", namespace, "-f"])
        .arg(dir)
        .output()
        .map_err(|source| Error::Spawn {
            what: "kvcache-operator render".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Invalid {
            path: dir.display().to_string(),
            what: "render",
            reason: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    objects(
        &String::from_utf8_lossy(&out.stdout),
        &dir.display().to_string(),
    )
}

/// The `*.yaml` files of a folder, in name order (the examples' creation order).
pub fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(crate::io(format!("reading {}", dir.display())))?
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The objects of a manifest file.
pub fn read_objects(file: &Path) -> Result<Vec<DynamicObject>> {
    let text =
        std::fs::read_to_string(file).map_err(crate::io(format!("reading {}", file.display())))?;
    objects(&text, &file.display().to_string())
}

/// The objects of a multi-document YAML text (`source` names it in errors).
fn objects(text: &str, source: &str) -> Result<Vec<DynamicObject>> {
    let invalid = |e: &dyn std::fmt::Display| Error::Invalid {
        path: source.to_owned(),
        what: "object",
        reason: e.to_string(),
    };
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).map_err(|e| invalid(&e))?;
        if v.is_null() {
            continue;
        }
        objects.push(serde_json::from_value::<DynamicObject>(v).map_err(|e| invalid(&e))?);
    }
    Ok(objects)
}

/// Applies objects with server-side apply (namespaces they name are created first).
pub async fn apply(client: &Client, objects: &[DynamicObject]) -> Result<()> {
    let pp = PatchParams::apply(MANAGER).force();
    let namespaces: std::collections::BTreeSet<String> =
        objects.iter().filter_map(|o| o.namespace()).collect();
    for ns in namespaces {
        ensure_namespace(client, &ns).await?;
    }
    for o in objects {
        let types = o.types.clone().ok_or_else(|| Error::Invalid {
            path: o.name_any(),
            what: "rendered object",
            reason: "no apiVersion/kind".into(),
        })?;
        let gvk = kube::api::GroupVersionKind::try_from(&types).map_err(|e| Error::Invalid {
            path: o.name_any(),
            what: "rendered object",
            reason: e.to_string(),
        })?;
        let (ar, caps) = pinned_kind(client, &gvk).await?;
        let api: Api<DynamicObject> = match (caps.scope, o.namespace()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), &ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(&o.name_any(), &pp, &Patch::Apply(o)).await?;
    }
    Ok(())
}

/// Creates a namespace unless it exists.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&ns),
    )
    .await?;
    Ok(())
}

/// Deletes a namespace, without waiting: its Pods go with it (a test's store, freed for the
/// tests after it).
pub async fn delete_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    api.delete(name, &kube::api::DeleteParams::default())
        .await?;
    Ok(())
}

/// Sets `kvcache.gpustack.ai/drop-cached-data` on the Binding `name` of `bindings`: its
/// release then removes what its tenant holds instead of waiting for the store to evict it.
pub async fn drop_cached_data(
    bindings: &Api<kvcache_api::KVCachePoolBinding>,
    name: &str,
) -> Result<()> {
    bindings
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                kvcache_api::DROP_CACHED_DATA_ANNOTATION: "true"
            }}})),
        )
        .await?;
    Ok(())
}

/// Deletes the ModelDeployment `namespace/name` and waits (up to `within`) until the Pods of
/// its role `server` are gone (their memory and accelerators free for what comes next).
pub async fn remove_model(
    client: &Client,
    namespace: &str,
    name: &str,
    within: std::time::Duration,
) -> Result<()> {
    let models: Api<kvcache_api::ModelDeployment> = Api::namespaced(client.clone(), namespace);
    models
        .delete(name, &kube::api::DeleteParams::default())
        .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    crate::pods::wait_pods(
        &pods,
        &role_pods(name, "server"),
        "no Pods left",
        within,
        |p| p.is_empty(),
    )
    .await
    .map(drop)
}

/// The label selector of one backend component's Pods (`leader`, `member-<group>`).
pub fn backend_pods(backend: &str, component: &str) -> String {
    format!(
        "app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/instance={backend},app.kubernetes.io/component={component}"
    )
}

/// The label selector of one ModelDeployment role's Pods.
pub fn role_pods(deployment: &str, role: &str) -> String {
    format!(
        "app.kubernetes.io/name=model-deployment,app.kubernetes.io/instance={deployment},app.kubernetes.io/component={role}"
    )
}

/// A disk tier at demo size on a backend (its JSON, edited in place): the first group's segment
/// 32Mi with 1Gi of tier at `path` (a tier the group declares keeps its other settings), the
/// master's object lease 500 ms (the render's default is 5 minutes; a second round of writes then
/// evicts, and so offloads, the first: the master offloads on eviction) and the members' offload
/// heartbeat one second (through the group's `extraEnv`).
pub fn demo_tier(backend: &mut serde_json::Value, path: &str) {
    let managed = &mut backend["spec"]["connection"]["managed"];
    managed["leader"]["extraArgs"] = serde_json::json!(["default_kv_lease_ttl=500"]);
    let g = &mut managed["members"][0];
    g["capacityPerMember"] = "32Mi".into();
    if !g["localDisks"].is_array() {
        g["localDisks"] = serde_json::json!([{}]);
    }
    let tier = &mut g["localDisks"][0];
    tier["path"] = path.into();
    tier["capacity"] = "1Gi".into();
    g["extraEnv"] = serde_json::json!([
        {"name": "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "value": "1"}
    ]);
}
