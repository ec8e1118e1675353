//! A store the operator does not run (`spec.connection.external`): its two addresses.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::rules;

/// A store the operator does not run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct External {
    /// Exactly two entries: `Client` (what engines connect to) and `Admin` (what the operator
    /// reads: health, metrics, segments). Both `host:port`.
    #[schemars(length(min = 2, max = 2))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub endpoints: Vec<ExternalEndpoint>,
}

impl External {
    /// The address declared for one endpoint name.
    pub fn address(&self, name: EndpointName) -> Option<&str> {
        self.endpoints
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.address.as_str())
    }
}

/// One address of an external store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExternalEndpoint {
    /// `Client` or `Admin`.
    pub name: EndpointName,
    /// `host:port`.
    #[schemars(length(min = 3, max = 261))]
    #[x_kube(validation = rules::host_port())]
    pub address: String,
}

/// Which address of an external store.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EndpointName {
    /// What engines connect to (the master's RPC port).
    Client,
    /// What the operator reads (health, metrics, segment listing).
    Admin,
}
