//! The shared-cache figures a ModelDeployment's status carries (its engines' counters) and a
//! Binding's (its deployments' summed): one type for both, apart from either kind so that
//! neither module imports the other.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The shared-cache figures of a deployment's ready engines, summed over them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedCacheStatus {
    /// How far back the token counts reach (an engine read for the first time inside it counts
    /// from its start).
    pub window: String,
    /// Prompt tokens the engines looked up in the store within the window.
    #[serde(default)]
    pub queried_tokens: u64,
    /// Of those, the tokens the store had (prefill the engines did not pay for).
    #[serde(default)]
    pub hit_tokens: u64,
    /// `hitTokens / queriedTokens`, two decimals; absent while nothing was looked up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_ratio: Option<String>,
    /// Prompt tokens the ready engines loaded from the store since each started.
    #[serde(default)]
    pub tokens_from_store: u64,
    /// Engine Pods whose counters are in these figures.
    #[serde(default)]
    pub engines_read: u32,
    /// The engines' loads from the store within the window (vLLM's
    /// `vllm:mooncake_store_operation_total{operation="load_get"}`).
    #[serde(default)]
    pub loads: u64,
    /// Of those, the loads that failed: vLLM computed those prompts after all.
    #[serde(default)]
    pub failed_loads: u64,
    /// The engines' saves to the store within the window.
    #[serde(default)]
    pub saves: u64,
    /// Of those, the saves that failed.
    #[serde(default)]
    pub failed_saves: u64,
    /// The loads' median time within the window (`0.125s`), from the engines' histograms;
    /// absent without loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_time_p50: Option<String>,
    /// The time the window's loads took, seconds, summed over the loads (the connector's own
    /// timing of each `load_get`); absent without loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_seconds: Option<String>,
    /// Prefill the store saved within the window, seconds: the tokens loaded from the store at
    /// the price of a computed token (`prefillMsPerToken`), less `loadSeconds`; negative when
    /// the loads took longer than computing would have. Absent while tokens were loaded and no
    /// price is known yet: the `PrefillPriced` condition says why (docs/shared-cache-hits.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds_saved: Option<String>,
    /// Give or take: one standard error of `prefillSecondsSaved`, from the fit of the price
    /// (the loads' time is measured); absent while the price rests on one reading of an
    /// engine's prefills beyond its first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_seconds_saved_error: Option<String>,
    /// What one more computed prompt token costs the engines in prefill, milliseconds, apart
    /// from the fixed cost of a prefill step; fitted to the deployment's engines' prefills of
    /// the last hour. Absent until priced, and on a Binding (its deployments' prices differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_ms_per_token: Option<String>,
}
