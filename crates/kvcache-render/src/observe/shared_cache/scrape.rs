//! An engine's `/metrics` text turned into its [`EngineCounters`]: the vLLM series this
//! module reads, each summed over its label sets.

use std::collections::BTreeMap;

use kvcache_api::model::EngineName;

use super::counters::{EngineCounters, Prefills, StoreOperations};
use crate::observe::exposition::{Exposition, Sample};
use crate::observe::store::{BadAnswer, ReadError};

/// vLLM's counter of prompt tokens looked up in the store.
const VLLM_QUERIES: &str = "vllm:external_prefix_cache_queries_total";
/// vLLM's counter of those found.
const VLLM_HITS: &str = "vllm:external_prefix_cache_hits_total";
/// vLLM's prompt tokens by where they came from; `source="external_kv_transfer"`: the store.
const VLLM_TOKENS_BY_SOURCE: &str = "vllm:prompt_tokens_by_source_total";
/// The `source` label value of tokens taken from the store.
pub const FROM_STORE: &str = "external_kv_transfer";
/// vLLM's time of each request from being scheduled to its first token, a histogram: its
/// `_sum` (seconds) and `_count` (requests). A request whose blocks load from the store waits
/// for them before it is scheduled, so the load is not in it.
const VLLM_PREFILL_TIME: &str = "vllm:request_prefill_time_seconds";
/// vLLM's prompt tokens each request computed (found in no cache), a histogram observed with
/// [`VLLM_PREFILL_TIME`] as each request finishes: its `_sum`.
const VLLM_PREFILL_COMPUTED: &str = "vllm:request_prefill_kv_computed_tokens";

/// vLLM's Mooncake store connector: operations by `operation` and `status` (`ok`, `error`).
const VLLM_STORE_OPERATIONS: &str = "vllm:mooncake_store_operation_total";
/// Its operations' time, a histogram by `operation` and `status`: `_bucket` and `_sum`.
const VLLM_STORE_TIME: &str = "vllm:mooncake_store_operation_time_seconds";
/// The connector's load from the store (a hit being fetched).
pub(crate) const LOAD_OPERATION: &str = "load_get";
/// The connector's save to the store.
pub(crate) const SAVE_OPERATION: &str = "save_put";

/// A whole, non-negative counter value (`NaN`, infinities and negatives are no counter).
fn counter(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0).then_some(v as u64)
}

/// Seconds as whole microseconds (`NaN`, infinities and negatives are none).
fn micros(seconds: f64) -> Option<u64> {
    (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1e6).round() as u64)
}

/// The series of one engine's scrape this module reads, summed over their label sets.
#[derive(Default)]
struct Tally {
    queries: Option<u64>,
    hits: Option<u64>,
    from_store: u64,
    operations: StoreOperations,
    load_time: BTreeMap<u64, u64>,
    prefills: Prefills,
}

impl Tally {
    fn add(&mut self, s: &Sample) {
        let label = |key: &str| {
            s.labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let name = s.name.as_str();
        if let Some(part) = name.strip_prefix(VLLM_PREFILL_TIME) {
            match part {
                "_sum" => self.prefills.micros += micros(s.value).unwrap_or(0),
                "_count" => self.prefills.requests += counter(s.value).unwrap_or(0),
                _ => {}
            }
            return;
        }
        if name.strip_prefix(VLLM_PREFILL_COMPUTED) == Some("_sum") {
            self.prefills.computed_tokens += counter(s.value).unwrap_or(0);
            return;
        }
        if let Some(part) = name.strip_prefix(VLLM_STORE_TIME) {
            if label("operation") != Some(LOAD_OPERATION) {
                return;
            }
            match part {
                "_sum" => self.operations.load_micros += micros(s.value).unwrap_or(0),
                "_bucket" => {
                    let le = match label("le") {
                        Some("+Inf") => Some(u64::MAX),
                        Some(b) => b.parse::<f64>().ok().and_then(micros),
                        None => None,
                    };
                    if let (Some(le), Some(v)) = (le, counter(s.value)) {
                        *self.load_time.entry(le).or_default() += v;
                    }
                }
                _ => {}
            }
            return;
        }
        let Some(v) = counter(s.value) else { return };
        match name {
            VLLM_STORE_OPERATIONS => {
                // vLLM writes `ok`, `error` (the call raised) or `partial_failure` (some keys
                // of the batch failed: a store that refuses a put at the tenant's grant, a member
                // the engine cannot reach); anything but `ok` is a failed operation.
                let failed = label("status") != Some("ok");
                match label("operation") {
                    Some(LOAD_OPERATION) => {
                        self.operations.loads += v;
                        self.operations.failed_loads += if failed { v } else { 0 };
                    }
                    Some(SAVE_OPERATION) => {
                        self.operations.saves += v;
                        self.operations.failed_saves += if failed { v } else { 0 };
                    }
                    _ => {}
                }
            }
            VLLM_QUERIES => *self.queries.get_or_insert(0) += v,
            VLLM_HITS => *self.hits.get_or_insert(0) += v,
            VLLM_TOKENS_BY_SOURCE if label("source") == Some(FROM_STORE) => self.from_store += v,
            _ => {}
        }
    }
}

/// An engine's counters from the text of its `/metrics` at `url`, read with
/// [`crate::observe::exposition`]. Every series is summed over its label sets (vLLM labels each with the
/// model and engine index). A scrape without the hit and query series is
/// [`ReadError::Unreadable`]: the engine runs without the store's connector or is a version that
/// does not count, which is not a hit ratio of zero.
pub fn parse_engine_metrics(
    engine: EngineName,
    url: &str,
    text: &str,
) -> Result<EngineCounters, ReadError> {
    if engine != EngineName::Vllm {
        return Err(ReadError::Unreadable {
            url: url.to_owned(),
            cause: BadAnswer::EngineUncounted,
        });
    }
    let mut tally = Tally::default();
    // Nothing kept: each sample is tallied as it reads.
    Exposition::parse_capped(text, 0, |s| tally.add(s));
    match (tally.queries, tally.hits) {
        (Some(queried_tokens), Some(hit_tokens)) => Ok(EngineCounters {
            queried_tokens,
            hit_tokens,
            tokens_from_store: tally.from_store,
            operations: StoreOperations {
                load_time: tally.load_time.into_iter().collect(),
                ..tally.operations
            },
            prefills: tally.prefills,
        }),
        _ => Err(ReadError::Unreadable {
            url: url.to_owned(),
            cause: BadAnswer::NoHitSeries {
                queries: VLLM_QUERIES,
                hits: VLLM_HITS,
            },
        }),
    }
}
