//! What a user adds to a store container's environment, and the serde default both the leader
//! and the member groups use.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub(super) fn default_true() -> bool {
    true
}

/// An environment variable for a store container: a name and a value or a source, as on a Pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraEnv {
    /// The variable's name as the container sees it.
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// The value as written (`$(VAR)` expanded as on a Pod); set this or `valueFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    /// Where the value comes from instead (a Secret, a ConfigMap, a field of the Pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

impl From<&ExtraEnv> for EnvVar {
    fn from(e: &ExtraEnv) -> Self {
        EnvVar {
            name: e.name.clone(),
            value: e.value.clone(),
            value_from: e.value_from.clone(),
        }
    }
}
