//! How much of a ModelDeployment's prefill the shared cache saves, from its engines' own
//! counters. The operator reads each ready engine Pod's `/metrics`, [`parse_engine_metrics`]
//! turns the text into [`EngineCounters`], a [`Window`] per deployment keeps the samples, and
//! [`Window::summary`] and [`condition`] give `status.sharedCache` and the `SharedCacheObserved`
//! condition. Pure: no clock (times come in as milliseconds), no client.
//!
//! vLLM counts, per engine, the prompt tokens it asked the connector about
//! (`vllm:external_prefix_cache_queries_total`), the ones the store had
//! (`vllm:external_prefix_cache_hits_total`) and the prompt tokens it took from the store rather
//! than computing them (`vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`).
//! SGLang's hierarchical cache publishes no per-engine hit counter of the store tier that this
//! project's engines can show, so a SGLang deployment says so in the condition instead of a
//! ratio of zero.
//!
//! The seconds saved price a loaded token with `PrefillFit` (`price.rs`): a least-squares fit of the
//! engines' prefill times to the requests and the tokens they computed, which tells the fixed
//! cost of a prefill step from the cost of one more token (docs/shared-cache-hits.md).

mod counters;
mod figures;
mod observed;
mod price;
mod scrape;
mod window;

pub use counters::{EngineCounters, EngineReading, Prefills, StoreOperations, median_micros};
pub use figures::{ratio, sum, tenant_shared_cache};
pub use observed::{Engines, condition, engines};
pub use price::{PrefillPrice, Unpriced, price_condition};
pub use scrape::{FROM_STORE, parse_engine_metrics};
pub use window::Window;

#[cfg(test)]
mod tests;
