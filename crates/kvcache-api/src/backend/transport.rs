//! How a backend's store processes move bytes between each other and engines
//! (`spec.transport`, a member group's `transport`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Backend-wide transport.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transport {
    /// The protocol. `Auto` means `TCP`; nodes are not probed.
    #[serde(default)]
    pub protocol: Protocol,
}

/// A member group's own transport; unset fields inherit the backend's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupTransport {
    /// The protocol for this group only. Unset: the backend's `transport.protocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

/// Transfer protocol between store processes and engines.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Protocol {
    /// TCP; no per-node probing.
    #[default]
    Auto,
    /// TCP sockets.
    #[serde(rename = "TCP")]
    Tcp,
    /// RDMA verbs (host network, `IPC_LOCK`, an RDMA device request).
    #[serde(rename = "RDMA")]
    Rdma,
    /// AWS Elastic Fabric Adapter.
    #[serde(rename = "EFA")]
    Efa,
    /// Huawei Ascend HCCS/RoCE (`ascend`).
    #[serde(rename = "CANN")]
    Cann,
    /// AMD ROCm (`hip`).
    #[serde(rename = "ROCM")]
    Rocm,
    /// Moore Threads intra-node IPC.
    #[serde(rename = "MUSA")]
    Musa,
    /// MetaX intra-node IPC.
    #[serde(rename = "MACA")]
    Maca,
}

impl Protocol {
    /// The spelling the store and engines use (`tcp`, `rdma`, `efa`, `ascend`, `hip`, …).
    pub fn artifact(self) -> &'static str {
        match self {
            Protocol::Auto | Protocol::Tcp => "tcp",
            Protocol::Rdma => "rdma",
            Protocol::Efa => "efa",
            Protocol::Cann => "ascend",
            Protocol::Rocm => "hip",
            Protocol::Musa => "musa",
            Protocol::Maca => "maca",
        }
    }

    /// The API value as written in a manifest (`TCP`, `CANN`, …).
    pub fn api_value(self) -> &'static str {
        match self {
            Protocol::Auto => "Auto",
            Protocol::Tcp => "TCP",
            Protocol::Rdma => "RDMA",
            Protocol::Efa => "EFA",
            Protocol::Cann => "CANN",
            Protocol::Rocm => "ROCM",
            Protocol::Musa => "MUSA",
            Protocol::Maca => "MACA",
        }
    }

    /// Whether the protocol needs the host network and a fabric device (RDMA and EFA only).
    pub fn is_fabric(self) -> bool {
        matches!(self, Protocol::Rdma | Protocol::Efa)
    }
}
