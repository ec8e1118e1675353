//! The two vehicles that hand an engine the store: the vLLM family's client document
//! ([`by_file`]) and SGLang's variables ([`by_environment`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, ObjectFieldSelector, Volume,
    VolumeMount,
};
use kvcache_api::model::RoleKind;

use crate::argv;
use crate::error::Error;
use crate::request::{
    CLIENT_CONFIG_ANNOTATION, FILE_NAME, LOCAL_BUFFER_BYTES, MOUNT_PATH, Request, VOLUME_NAME, env,
    field_env,
};

/// The variable through which SGLang's store client takes its master's address.
pub(crate) const MASTER_ENV: &str = "MOONCAKE_MASTER";

/// The variable through which SGLang's store client takes its tenant.
pub(crate) const TENANT_ENV: &str = "MOONCAKE_TENANT_ID";

fn kv_role(role: RoleKind) -> &'static str {
    match role {
        RoleKind::Server => "kv_both",
        RoleKind::Prefill => "kv_producer",
        RoleKind::Decode => "kv_consumer",
    }
}

/// What one vehicle adds to the container (and, for the file, to the Pod).
#[derive(Default)]
pub(crate) struct Delivery {
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<EnvVar>,
    pub(crate) volume: Option<Volume>,
    pub(crate) mount: Option<VolumeMount>,
    pub(crate) client_config: Option<String>,
}

/// The vLLM family's vehicle: the client document in the `client-config` annotation, projected
/// into the container by a downward-API volume, and the `--kv-transfer-config` argument.
pub(crate) fn by_file(
    req: &Request<'_>,
    endpoint: &str,
    protocol: &str,
    tenant: Option<&str>,
) -> Result<Delivery, Error> {
    let (row, c) = (req.engine, req.container);
    let collides_volume = req.pod_volumes.iter().any(|v| v == VOLUME_NAME);
    let collides_mount = c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == VOLUME_NAME || m.mount_path.trim_end_matches('/') == MOUNT_PATH);
    if collides_volume || collides_mount {
        return Err(Error::refused(
            "VolumeCollision",
            format!(
                "the Pod already has a volume named {VOLUME_NAME} or a mount at {MOUNT_PATH}, where the client document goes; rename or move it"
            ),
        ));
    }
    let mut doc: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    doc.insert("master_server_address", endpoint.into());
    doc.insert("metadata_server", "P2PHANDSHAKE".into());
    doc.insert("protocol", protocol.into());
    doc.insert("device_name", "".into());
    doc.insert("global_segment_size", 0.into());
    doc.insert("local_buffer_size", LOCAL_BUFFER_BYTES.into());
    doc.insert("mode", "standalone-store".into());
    if let Some(t) = tenant {
        doc.insert("tenant_id", t.into());
    }
    let mut transfer = serde_json::json!({
        "kv_connector": row.connector.unwrap_or_default(),
        "kv_role": kv_role(req.role),
    });
    // A block the store cannot deliver is recomputed rather than failing the request: the
    // store is a cache.
    if let (Some(policy), Some(doc)) = (row.load_failure_policy, transfer.as_object_mut()) {
        doc.insert("kv_load_failure_policy".to_owned(), policy.into());
    }
    Ok(Delivery {
        args: vec!["--kv-transfer-config".to_owned(), transfer.to_string()],
        env: vec![env(
            "MOONCAKE_CONFIG_PATH",
            format!("{MOUNT_PATH}/{FILE_NAME}"),
        )],
        volume: Some(Volume {
            name: VOLUME_NAME.to_owned(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: FILE_NAME.to_owned(),
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: format!("metadata.annotations['{CLIENT_CONFIG_ANNOTATION}']"),
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        mount: Some(VolumeMount {
            name: VOLUME_NAME.to_owned(),
            mount_path: MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..Default::default()
        }),
        client_config: Some(serde_json::to_string(&doc).unwrap_or_default()),
    })
}

/// SGLang's vehicle: the hierarchical-cache arguments and the `MOONCAKE_*` variables; with a
/// warning when the container sets its own tenant id on a store that keeps no ledger.
pub(crate) fn by_environment(
    req: &Request<'_>,
    endpoint: &str,
    protocol: &str,
    tenant: Option<&str>,
    user_argv: &[String],
) -> (Delivery, Option<String>) {
    let (row, c) = (req.engine, req.container);
    let mut args = vec![
        "--hicache-storage-backend".to_owned(),
        "mooncake".to_owned(),
    ];
    let (flag, extra) = if req.role == RoleKind::Decode {
        (
            "--disaggregation-decode-retraction-backup",
            Some("cpu_tensor"),
        )
    } else {
        ("--enable-hierarchical-cache", None)
    };
    if argv::find(user_argv, flag, row).is_none() {
        args.push(flag.to_owned());
        args.extend(extra.map(str::to_owned));
    }
    let mut out_env = vec![
        env(MASTER_ENV, endpoint),
        env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
        env("MOONCAKE_PROTOCOL", protocol),
        env("MOONCAKE_DEVICE", ""),
        env("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0"),
        field_env("MOONCAKE_LOCAL_HOSTNAME", "status.podIP"),
    ];
    let mut warning = None;
    if let Some(t) = tenant {
        out_env.push(env(TENANT_ENV, t));
    } else if c.env.iter().flatten().any(|e| e.name == TENANT_ENV) {
        warning = Some("the container's own MOONCAKE_TENANT_ID is kept, but the store keeps no ledger: every write lands in its default tenant".into());
    }
    (
        Delivery {
            args,
            env: out_env,
            ..Delivery::default()
        },
        warning,
    )
}
