//! The engine rows: one row per engine, everything the injection does for it. A new engine or
//! version line is a row here, not new control flow.

use kvcache_api::model::EngineName;

/// An engine as the injection distinguishes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// vLLM with the Mooncake store connector.
    Vllm,
    /// vLLM-Ascend (vLLM with `manufacturer: ascend`).
    VllmAscend,
    /// SGLang's hierarchical cache with the Mooncake backend.
    Sglang,
}

/// How the store settings reach the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vehicle {
    /// A projected JSON file (`MOONCAKE_CONFIG_PATH`).
    File,
    /// Environment variables only.
    Environment,
}

impl Vehicle {
    /// As the decision record writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Vehicle::File => "file",
            Vehicle::Environment => "environment",
        }
    }
}

/// One line of the engine-version → store-client table (docs/design.md#version-lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLine {
    /// The lowest engine version this line applies from.
    pub from_engine: &'static str,
    /// The Mooncake client the runner image carries.
    pub client: &'static str,
}

/// Everything the injection knows about one engine.
#[derive(Debug)]
pub struct EngineRow {
    /// Which engine this row is for; [`row`] picks the row by it.
    pub engine: Engine,
    /// Its name for users.
    pub name: &'static str,
    /// Its name in the decision record.
    pub record: &'static str,
    /// How settings reach it.
    pub vehicle: Vehicle,
    /// The store connector named in `--kv-transfer-config` (vLLM family).
    pub connector: Option<&'static str>,
    /// Programs (executables or `python -m` modules) that run this engine.
    pub programs: &'static [&'static str],
    /// Its argument parser also accepts `_` for `-` and `--flag.member` forms.
    pub underscores_and_members: bool,
    /// Flags whose user value would be a second source for the injected mechanism (refused).
    pub mechanism_args: &'static [&'static str],
    /// Environment whose user value would be a second source (refused).
    pub mechanism_env: &'static [&'static str],
    /// Further flags the operator owns on ModelDeployment roles (refused there).
    pub owned_args: &'static [&'static str],
    /// Further environment the operator owns on ModelDeployment roles (refused there).
    pub owned_env: &'static [&'static str],
    /// Other flags of the engine that share a prefix with an owned one, so a unique-prefix
    /// abbreviation can be told apart.
    pub sibling_flags: &'static [&'static str],
    /// `--kv-cache-dtype` spellings the engine accepts.
    pub dtypes: &'static [&'static str],
    /// Store protocols (artifact spelling) the engine can use; `None`: any, one at a time.
    pub only_protocols: Option<&'static [&'static str]>,
    /// Store protocols the engine is documented not to support.
    pub refused_protocols: &'static [&'static str],
    /// Engine version → client version.
    pub client_lines: &'static [ClientLine],
    /// Reads the role (`kv_role`); SGLang ignores it.
    pub reads_role: bool,
    /// Owns `MOONCAKE_TENANT_ID` (sets it from the Binding).
    pub owns_tenant_env: bool,
    /// What the connector does with a block the store fails to deliver, when the engine lets it
    /// be chosen (`kv_load_failure_policy` in `--kv-transfer-config`): recompute it, so a store
    /// fault costs a prefill instead of failing the request.
    pub load_failure_policy: Option<&'static str>,
}

const VLLM_PROGRAMS: &[&str] = &[
    "vllm",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.api_server",
    "vllm.entrypoints.cli.main",
];
const VLLM_SIBLINGS: &[&str] = &[
    "--kv-cache-dtype",
    "--kv-cache-memory",
    "--kv-cache-dtype-skip-layers",
    "--kv-events-config",
    "--kv-transfer-config",
    "--kv-sharing-fast-prefill",
    "--kv-offloading-size",
    "--kv-offloading-backend",
    "--kv-load-failure-policy",
];
const VLLM_DTYPES: &[&str] = &[
    "auto",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4",
];

/// The vLLM row (vLLM-Ascend differs from it in a few fields).
const VLLM: EngineRow = EngineRow {
    engine: Engine::Vllm,
    name: "vLLM",
    record: "vllm",
    vehicle: Vehicle::File,
    connector: Some("MooncakeStoreConnector"),
    programs: VLLM_PROGRAMS,
    underscores_and_members: true,
    mechanism_args: &["--kv-transfer-config"],
    mechanism_env: &["MOONCAKE_CONFIG_PATH"],
    owned_args: &["--kv-events-config"],
    owned_env: &["VLLM_MOONCAKE_BOOTSTRAP_PORT"],
    sibling_flags: VLLM_SIBLINGS,
    dtypes: VLLM_DTYPES,
    only_protocols: None,
    refused_protocols: &["ascend"],
    client_lines: &[ClientLine {
        from_engine: "0.29.0",
        client: "0.3.13.post1",
    }],
    reads_role: true,
    owns_tenant_env: false,
    load_failure_policy: Some("recompute"),
};

/// Every engine row.
pub static ENGINES: &[EngineRow] = &[
    VLLM,
    // vLLM-Ascend: the same parser and file, its own connector, store line and transport.
    EngineRow {
        engine: Engine::VllmAscend,
        name: "vLLM-Ascend",
        record: "vllm-ascend",
        connector: Some("AscendStoreConnector"),
        only_protocols: Some(&["ascend"]),
        refused_protocols: &[],
        client_lines: &[ClientLine {
            from_engine: "0.23.0",
            client: "0.3.11.post1",
        }],
        // Its connector's configuration is not known to take the policy.
        load_failure_policy: None,
        ..VLLM
    },
    EngineRow {
        engine: Engine::Sglang,
        name: "SGLang",
        record: "sglang",
        vehicle: Vehicle::Environment,
        connector: None,
        programs: &["sglang.launch_server", "sglang"],
        underscores_and_members: false,
        mechanism_args: &[
            "--hicache-storage-backend",
            "--hicache-storage-backend-extra-config",
        ],
        mechanism_env: &["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"],
        owned_args: &[
            "--disaggregation-mode",
            "--disaggregation-transfer-backend",
            "--disaggregation-bootstrap-port",
        ],
        owned_env: &[
            "MOONCAKE_MASTER",
            "MOONCAKE_TE_META_DATA_SERVER",
            "MOONCAKE_PROTOCOL",
            "MOONCAKE_DEVICE",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE",
            "MOONCAKE_LOCAL_HOSTNAME",
            "MOONCAKE_TENANT_ID",
        ],
        sibling_flags: &[
            "--hicache-storage-backend",
            "--hicache-storage-backend-extra-config",
            "--hicache-storage-prefetch-policy",
            "--hicache-ratio",
            "--hicache-size",
            "--hicache-write-policy",
            "--hicache-io-backend",
            "--hicache-mem-layout",
            "--kv-cache-dtype",
            "--disaggregation-mode",
            "--disaggregation-transfer-backend",
            "--disaggregation-bootstrap-port",
            "--disaggregation-decode-retraction-backup",
            "--disaggregation-ib-device",
        ],
        dtypes: &[
            "auto",
            "bfloat16",
            "bf16",
            "fp8_e4m3",
            "fp8_e5m2",
            "mxfp8",
            "nvfp4",
            "fp4_mx_block16",
        ],
        only_protocols: None,
        refused_protocols: &["efa"],
        client_lines: &[ClientLine {
            from_engine: "0.5.18",
            client: "0.3.12.post1",
        }],
        reads_role: false,
        owns_tenant_env: true,
        load_failure_policy: None,
    },
];

/// The `--kv-cache-dtype` flag, owned on attached containers while the dtype setting is on.
pub(crate) const DTYPE_FLAG: &str = "--kv-cache-dtype";

/// The flag naming the dtype the model computes in, the same in every engine of [`ENGINES`].
pub(crate) const COMPUTE_DTYPE_FLAG: &str = "--dtype";

/// Names reserved on ModelDeployment roles at every size.
pub(crate) const RESERVED_ENV: &[&str] = &[
    "GPUSTACK_REPLICA_LEADER_ADDRESS",
    "GPUSTACK_REPLICA_SIZE",
    "GPUSTACK_MEMBER_INDEX",
];

/// The row for an engine name and an optional manufacturer (`ascend` selects vLLM-Ascend).
pub fn row(
    engine: EngineName,
    manufacturer: Option<&str>,
) -> Result<&'static EngineRow, crate::error::Error> {
    let which = match (engine, manufacturer) {
        (EngineName::Vllm, None) => Engine::Vllm,
        (EngineName::Vllm, Some("ascend")) => Engine::VllmAscend,
        (EngineName::Sglang, None) => Engine::Sglang,
        (EngineName::Sglang, Some("ascend")) => {
            return Err(crate::error::Error::refused(
                "AscendNeedsVllm",
                "manufacturer ascend applies to vLLM only (it selects vLLM-Ascend); remove it for SGLang",
            ));
        }
        (_, Some(other)) => {
            return Err(crate::error::Error::refused(
                "UnknownManufacturer",
                format!(
                    "manufacturer {other:?} is not known: the only value is ascend, with engine vLLM"
                ),
            ));
        }
    };
    ENGINES.iter().find(|r| r.engine == which).ok_or_else(|| {
        crate::error::Error::refused("NoInjectionRow", format!("no injection row for {which:?}"))
    })
}
