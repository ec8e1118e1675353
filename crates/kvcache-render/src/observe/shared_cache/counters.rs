//! What one engine counted since it started ([`EngineCounters`]: store lookups and hits, the
//! connector's loads and saves, the prefills it finished), what grew between two readings, and
//! one engine Pod's reading of a pass ([`EngineReading`]).

use std::collections::BTreeMap;

use crate::observe::store::ReadError;

/// One engine's counters since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Prompt tokens looked up in the store.
    pub queried_tokens: u64,
    /// Prompt tokens the store had.
    pub hit_tokens: u64,
    /// Prompt tokens loaded from the store instead of computed.
    pub tokens_from_store: u64,
    /// The connector's loads and saves (zero for an engine that publishes none).
    pub operations: StoreOperations,
    /// The prefills of the requests the engine finished.
    pub prefills: Prefills,
}

impl EngineCounters {
    /// What grew from `base` to `self` (an engine's counters only grow while it runs; a counter
    /// below its base counts as zero).
    pub fn since(&self, base: &EngineCounters) -> EngineCounters {
        EngineCounters {
            queried_tokens: self.queried_tokens.saturating_sub(base.queried_tokens),
            hit_tokens: self.hit_tokens.saturating_sub(base.hit_tokens),
            tokens_from_store: self
                .tokens_from_store
                .saturating_sub(base.tokens_from_store),
            operations: self.operations.since(&base.operations),
            prefills: self.prefills.since(&base.prefills),
        }
    }

    /// Whether a counter went down since `earlier`: the engine restarted.
    pub(super) fn went_down(&self, earlier: &EngineCounters) -> bool {
        self.queried_tokens < earlier.queried_tokens
            || self.hit_tokens < earlier.hit_tokens
            || self.operations.went_down(&earlier.operations)
            || self.prefills.went_down(&earlier.prefills)
    }
}

/// The prefills of the requests an engine finished since it started, from vLLM's per-request
/// histograms (observed together as each request finishes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prefills {
    /// Requests whose prefill is counted (`vllm:request_prefill_time_seconds_count`).
    pub requests: u64,
    /// The prompt tokens they computed rather than found in a cache
    /// (`vllm:request_prefill_kv_computed_tokens_sum`).
    pub computed_tokens: u64,
    /// Their time from being scheduled to the first token, microseconds
    /// (`vllm:request_prefill_time_seconds_sum`).
    pub micros: u64,
}

impl Prefills {
    /// What grew from `base` to `self`.
    pub fn since(&self, base: &Prefills) -> Prefills {
        Prefills {
            requests: self.requests.saturating_sub(base.requests),
            computed_tokens: self.computed_tokens.saturating_sub(base.computed_tokens),
            micros: self.micros.saturating_sub(base.micros),
        }
    }

    pub(super) fn went_down(&self, earlier: &Prefills) -> bool {
        self.requests < earlier.requests
            || self.computed_tokens < earlier.computed_tokens
            || self.micros < earlier.micros
    }
}

/// An engine's store loads and saves since it started, from its connector's own series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOperations {
    /// Loads, whatever their outcome.
    pub loads: u64,
    /// Loads that failed (vLLM then computes the prompt: `kv_load_failure_policy: recompute`).
    pub failed_loads: u64,
    /// Saves, whatever their outcome.
    pub saves: u64,
    /// Saves that failed.
    pub failed_saves: u64,
    /// The loads' time histogram: (upper bound in microseconds, `u64::MAX` for `+Inf`;
    /// cumulative count), ascending.
    pub load_time: Vec<(u64, u64)>,
    /// The loads' time summed, microseconds (the histogram's `_sum`).
    pub load_micros: u64,
}

impl StoreOperations {
    /// What grew from `base` to `self` (an engine's counters only grow while it runs).
    pub fn since(&self, base: &StoreOperations) -> StoreOperations {
        let bucket = |le: u64, of: &StoreOperations| {
            of.load_time
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0, |(_, c)| *c)
        };
        StoreOperations {
            loads: self.loads.saturating_sub(base.loads),
            failed_loads: self.failed_loads.saturating_sub(base.failed_loads),
            saves: self.saves.saturating_sub(base.saves),
            failed_saves: self.failed_saves.saturating_sub(base.failed_saves),
            load_time: self
                .load_time
                .iter()
                .map(|(le, c)| (*le, c.saturating_sub(bucket(*le, base))))
                .collect(),
            load_micros: self.load_micros.saturating_sub(base.load_micros),
        }
    }

    /// `self` and `other` summed (histograms bucket by bucket).
    pub(super) fn add(&mut self, other: &StoreOperations) {
        self.loads += other.loads;
        self.failed_loads += other.failed_loads;
        self.saves += other.saves;
        self.failed_saves += other.failed_saves;
        self.load_micros += other.load_micros;
        let mut buckets: BTreeMap<u64, u64> = self.load_time.iter().copied().collect();
        for (le, c) in &other.load_time {
            *buckets.entry(*le).or_default() += c;
        }
        self.load_time = buckets.into_iter().collect();
    }

    /// Whether a counter went down since `earlier`: the engine restarted.
    pub(super) fn went_down(&self, earlier: &StoreOperations) -> bool {
        self.loads < earlier.loads || self.saves < earlier.saves
    }
}

/// The median of a cumulative histogram ((upper bound µs, count) ascending), interpolated
/// linearly inside its bucket as Prometheus's `histogram_quantile` does; `None` when empty.
pub fn median_micros(histogram: &[(u64, u64)]) -> Option<u64> {
    let total = histogram.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = total as f64 / 2.0;
    let mut lower = (0u64, 0u64);
    for &(le, count) in histogram {
        if count as f64 >= rank {
            if le == u64::MAX {
                // In the `+Inf` bucket: the highest finite bound is all that is known.
                return Some(lower.0);
            }
            let inside = (count - lower.1) as f64;
            let share = if inside > 0.0 {
                (rank - lower.1 as f64) / inside
            } else {
                1.0
            };
            return Some(lower.0 + ((le - lower.0) as f64 * share) as u64);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

/// One engine Pod as the operator tried to read it this pass.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineReading {
    /// Name of the engine Pod, in the ModelDeployment's namespace.
    pub pod: String,
    /// The Pod's uid: a replaced Pod with the same name starts its counters again.
    pub uid: String,
    /// Its counters, or why they could not be read.
    pub counters: Result<EngineCounters, ReadError>,
}
