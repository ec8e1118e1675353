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
//! The seconds saved price a loaded token with [`PrefillFit`]: a least-squares fit of the
//! engines' prefill times to the requests and the tokens they computed, which tells the fixed
//! cost of a prefill step from the cost of one more token (docs/shared-cache-hits.md).

use std::collections::{BTreeMap, VecDeque};

use kvcache_api::condition::Cond;
use kvcache_api::model::conditions::{PREFILL_PRICED, SHARED_CACHE_HEALTHY, SHARED_CACHE_OBSERVED};
use kvcache_api::model::{EngineName, SharedCacheStatus};

use crate::exposition::{Exposition, Sample};
use crate::status::model::{Resolution, RoleObservation};
use crate::store::{BadAnswer, ReadError};

/// vLLM's counter of prompt tokens looked up in the store.
pub(crate) const VLLM_QUERIES: &str = "vllm:external_prefix_cache_queries_total";
/// vLLM's counter of those found.
pub(crate) const VLLM_HITS: &str = "vllm:external_prefix_cache_hits_total";
/// vLLM's prompt tokens by where they came from; `source="external_kv_transfer"`: the store.
pub(crate) const VLLM_TOKENS_BY_SOURCE: &str = "vllm:prompt_tokens_by_source_total";
/// The `source` label value of tokens taken from the store.
pub const FROM_STORE: &str = "external_kv_transfer";
/// vLLM's time of each request from being scheduled to its first token, a histogram: its
/// `_sum` (seconds) and `_count` (requests). A request whose blocks load from the store waits
/// for them before it is scheduled, so the load is not in it.
pub(crate) const VLLM_PREFILL_TIME: &str = "vllm:request_prefill_time_seconds";
/// vLLM's prompt tokens each request computed (found in no cache), a histogram observed with
/// [`VLLM_PREFILL_TIME`] as each request finishes: its `_sum`.
pub(crate) const VLLM_PREFILL_COMPUTED: &str = "vllm:request_prefill_kv_computed_tokens";

/// vLLM's Mooncake store connector: operations by `operation` and `status` (`ok`, `error`).
pub(crate) const VLLM_STORE_OPERATIONS: &str = "vllm:mooncake_store_operation_total";
/// Its operations' time, a histogram by `operation` and `status`: `_bucket` and `_sum`.
pub(crate) const VLLM_STORE_TIME: &str = "vllm:mooncake_store_operation_time_seconds";
/// The connector's load from the store (a hit being fetched).
pub const LOAD_OPERATION: &str = "load_get";
/// The connector's save to the store.
pub const SAVE_OPERATION: &str = "save_put";

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
    fn went_down(&self, earlier: &EngineCounters) -> bool {
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

    fn went_down(&self, earlier: &Prefills) -> bool {
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
    fn add(&mut self, other: &StoreOperations) {
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
    fn went_down(&self, earlier: &StoreOperations) -> bool {
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
/// [`crate::exposition`]. Every series is summed over its label sets (vLLM labels each with the
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

/// The samples of one deployment's engines over a sliding window, and its engines' prefills of
/// the last [`PRICE_HISTORY_MS`] that price a computed token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    /// Per Pod uid: (milliseconds, counters), oldest first.
    pods: BTreeMap<String, VecDeque<(u64, EngineCounters)>>,
    /// Per Pod uid: its name, for the condition.
    names: BTreeMap<String, String>,
    /// The prefills read, a period of [`PRICE_PERIOD_MS`] (by its index) at a time, oldest
    /// first, one fit an engine (by Pod uid): a Pod's that has gone as well.
    prefills: VecDeque<(u64, BTreeMap<String, PrefillFit>)>,
    /// Per Pod uid: when it was last read and its prefills then, already in `prefills`.
    counted: BTreeMap<String, (u64, Prefills)>,
}

/// Above this share of failed loads in the window, `SharedCacheHealthy` turns False.
pub const FALLBACK_SHARE: f64 = 0.10;

/// How far back the engines' prefills price a computed token: an hour, so that a window of
/// hits is priced by the prefills before it too, and a price follows the node's load.
pub const PRICE_HISTORY_MS: u64 = 3_600_000;
/// The prefills of the history are kept as one fit a period of this length (5 minutes).
pub const PRICE_PERIOD_MS: u64 = 300_000;

impl Window {
    /// Records this pass's readings taken at `now_ms`. Pods not among `readings` are gone (or no
    /// longer ready) and leave the window; a Pod whose read failed keeps its earlier samples. A
    /// counter that went down is a restarted engine: its samples start again. The prefills each
    /// engine finished since it was last read (since it started, when read for the first time or
    /// restarted) join the price's history.
    pub fn record(&mut self, now_ms: u64, window_ms: u64, readings: &[EngineReading]) {
        self.pods
            .retain(|uid, _| readings.iter().any(|r| &r.uid == uid));
        self.names
            .retain(|uid, _| readings.iter().any(|r| &r.uid == uid));
        for r in readings {
            self.names.insert(r.uid.clone(), r.pod.clone());
            let Ok(c) = &r.counters else { continue };
            let base = match self.counted.get(&r.uid) {
                Some((_, p)) if !c.prefills.went_down(p) => *p,
                _ => Prefills::default(),
            };
            self.add_prefills(now_ms, &r.uid, &c.prefills.since(&base));
            self.counted.insert(r.uid.clone(), (now_ms, c.prefills));
            let samples = self.pods.entry(r.uid.clone()).or_default();
            if samples.back().is_some_and(|(_, last)| c.went_down(last)) {
                samples.clear();
            }
            samples.push_back((now_ms, c.clone()));
            // Keep the newest sample at or before the window's start (the baseline) and every
            // later one.
            let start = now_ms.saturating_sub(window_ms);
            while samples.len() > 1 && samples.get(1).is_some_and(|(t, _)| *t < start) {
                samples.pop_front();
            }
        }
        let oldest = now_ms.saturating_sub(PRICE_HISTORY_MS);
        self.counted.retain(|_, (t, _)| *t >= oldest);
        while self
            .prefills
            .front()
            .is_some_and(|(period, _)| (period + 1) * PRICE_PERIOD_MS <= oldest)
        {
            self.prefills.pop_front();
        }
    }

    /// Adds the prefills of the engine `uid` read at `now_ms` to its fit of the period.
    fn add_prefills(&mut self, now_ms: u64, uid: &str, grown: &Prefills) {
        if grown.requests == 0 {
            return;
        }
        let period = now_ms / PRICE_PERIOD_MS;
        if self.prefills.back().is_none_or(|(p, _)| *p != period) {
            self.prefills.push_back((period, BTreeMap::new()));
        }
        if let Some((_, fits)) = self.prefills.back_mut() {
            fits.entry(uid.to_owned()).or_default().add(grown);
        }
    }

    /// The price of a computed token from the prefills of the last [`PRICE_HISTORY_MS`], or why
    /// there is none yet.
    pub fn price(&self) -> Result<PrefillPrice, Unpriced> {
        let mut engines: BTreeMap<&str, PrefillFit> = BTreeMap::new();
        for (_, fits) in &self.prefills {
            for (uid, fit) in fits {
                engines.entry(uid.as_str()).or_default().merge(fit);
            }
        }
        let engines: Vec<PrefillFit> = engines.into_values().collect();
        price_of(&engines)
    }

    /// The deployment's shared-cache figures over the last `window_ms` before `now_ms`: for each
    /// engine the growth of its counters since the window's start (since its first sample when
    /// it was first read inside the window: an engine's counters start at zero, so a Pod first
    /// read within the window counts from its start), summed. The seconds saved price the
    /// tokens loaded with [`Window::price`] and take the loads' time off.
    pub fn summary(&self, now_ms: u64, window_ms: u64, window: &str) -> SharedCacheStatus {
        let (mut queried, mut hit, mut total_from_store, mut loaded) = (0u64, 0u64, 0u64, 0u64);
        let mut operations = StoreOperations::default();
        for (_, last, grown) in self.growth(now_ms, window_ms) {
            queried += grown.queried_tokens;
            hit += grown.hit_tokens;
            loaded += grown.tokens_from_store;
            total_from_store += last.tokens_from_store;
            operations.add(&grown.operations);
        }
        let price = self.price().ok();
        let saved = saved(loaded, operations.load_micros, price.as_ref());
        SharedCacheStatus {
            window: window.to_owned(),
            queried_tokens: queried,
            hit_tokens: hit,
            hit_ratio: ratio(hit, queried),
            tokens_from_store: total_from_store,
            engines_read: u32::try_from(self.pods.len()).unwrap_or(u32::MAX),
            loads: operations.loads,
            failed_loads: operations.failed_loads,
            saves: operations.saves,
            failed_saves: operations.failed_saves,
            load_time_p50: median_micros(&operations.load_time)
                .map(|us| format!("{:.3}s", us as f64 / 1e6)),
            load_seconds: (operations.loads > 0)
                .then(|| seconds_text(operations.load_micros as f64, 3)),
            prefill_seconds_saved: saved.map(|(s, _)| seconds_text(s, 2)),
            prefill_seconds_saved_error: saved.and_then(|(_, e)| e).map(|e| seconds_text(e, 2)),
            prefill_ms_per_token: price.map(|p| format!("{:.4}", p.per_token_micros / 1e3)),
        }
    }

    /// Per engine in the window: its uid, its newest counters and their growth since the
    /// window's start (since zero for an engine first read inside it).
    fn growth(
        &self,
        now_ms: u64,
        window_ms: u64,
    ) -> impl Iterator<Item = (&String, &EngineCounters, EngineCounters)> {
        let start = now_ms.saturating_sub(window_ms);
        self.pods.iter().filter_map(move |(uid, samples)| {
            let (_, last) = samples.back()?;
            let base = samples
                .iter()
                .rev()
                .find(|(t, _)| *t < start)
                .map(|(_, c)| c.clone())
                .unwrap_or_default();
            Some((uid, last, last.since(&base)))
        })
    }

    /// `SharedCacheHealthy` over the window: `False/LoadsFallingBack` when more than
    /// [`FALLBACK_SHARE`] of the engines' loads failed (each a prefill the engine paid for after
    /// all), naming the Pods and their share; `Unknown` while an engine's metrics cannot be
    /// read (named: never counted as healthy); `True` otherwise.
    pub fn health(&self, now_ms: u64, window_ms: u64, readings: &[EngineReading]) -> Cond {
        let unread: Vec<&str> = readings
            .iter()
            .filter(|r| r.counters.is_err())
            .map(|r| r.pod.as_str())
            .collect();
        if !unread.is_empty() {
            return Cond::unknown(
                SHARED_CACHE_HEALTHY,
                "EngineMetricsUnreadable",
                format!(
                    "the metrics of {} could not be read: their loads are not known",
                    unread.join(", ")
                ),
            );
        }
        let mut total = StoreOperations::default();
        let mut failing = Vec::new();
        for (uid, _, grown) in self.growth(now_ms, window_ms) {
            let ops = &grown.operations;
            total.add(ops);
            if ops.failed_loads > 0 {
                let name = self.names.get(uid).map_or(uid.as_str(), String::as_str);
                failing.push(format!("{name} {} of {}", ops.failed_loads, ops.loads));
            }
        }
        if total.loads == 0 {
            return Cond::yes(
                SHARED_CACHE_HEALTHY,
                "NoLoads",
                "no engine loaded from the store in the window",
            );
        }
        let share = total.failed_loads as f64 / total.loads as f64;
        let figures = format!(
            "{} of {} loads failed in the window ({:.0}%)",
            total.failed_loads,
            total.loads,
            share * 100.0
        );
        if share > FALLBACK_SHARE {
            Cond::no(
                SHARED_CACHE_HEALTHY,
                "LoadsFallingBack",
                format!(
                    "{figures}, above {:.0}%: each failed load was computed again (kv_load_failure_policy: recompute), so those hits saved nothing; failing: {}. Check the backend's members and the engines' logs for the store's errors",
                    FALLBACK_SHARE * 100.0,
                    failing.join(", ")
                ),
            )
        } else {
            Cond::yes(SHARED_CACHE_HEALTHY, "LoadsSucceed", figures)
        }
    }
}

/// The fewest prompt tokens the deployment's engines must have computed within
/// [`PRICE_HISTORY_MS`] before their prefills price a token (a prefill of 2,048 tokens on the
/// demo's CPU takes about 2 s, well above a step's fixed cost and its noise).
pub const MIN_PRICED_TOKENS: u64 = 2048;
/// The least spread (a standard deviation, in tokens) of the tokens computed per prefill across
/// the readings, below which a prefill's fixed cost cannot be told from a token's price: one
/// block of the demo's engines.
pub const MIN_SPREAD_TOKENS: f64 = 32.0;
/// The fewest readings of prefills beyond each engine's first a price is fitted to (an
/// engine's first reading fixes its own fixed cost): one fixes the price; its error is known
/// from a second on.
pub const MIN_PRICE_READINGS: u64 = 1;
/// The largest standard error of a price, as a share of it, that is shown: a fit that noisy
/// (an engine's first prefills, a node busy with other work) prices nothing yet.
pub const MAX_PRICE_ERROR: f64 = 0.5;

/// One engine's sums of a least-squares fit of prefill time to the requests and the tokens
/// computed: each reading of the engine (what it finished since it was last read: `n` requests
/// that computed `c` tokens in `t` µs) is taken as `t = a·n + b·c` plus noise that grows with
/// the requests (weighted by `1/n`), where `a` is the engine's fixed cost of a prefill and `b`
/// a computed token's price, the same for every engine of the deployment ([`price_of`]). Sums
/// add, so an engine's periods pool by adding them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrefillFit {
    /// Readings added (each with at least one request).
    readings: u64,
    /// Σ n.
    requests: f64,
    /// Σ c.
    tokens: f64,
    /// Σ c²/n.
    tokens_sq: f64,
    /// Σ t.
    micros: f64,
    /// Σ c·t/n.
    tokens_micros: f64,
    /// Σ t²/n.
    micros_sq: f64,
}

/// A computed token's price, from [`PrefillFit::price`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillPrice {
    /// One more computed prompt token, microseconds of prefill.
    pub per_token_micros: f64,
    /// A prefill's fixed cost, microseconds: what a step costs whatever its tokens, averaged
    /// over the engines by their prefills (none when the fit makes it negative).
    pub per_prefill_micros: f64,
    /// One standard error of `per_token_micros`; `None` until a second reading beyond each
    /// engine's first measures it.
    pub per_token_error_micros: Option<f64>,
    /// The prompt tokens the fit's prefills computed.
    pub computed_tokens: u64,
    /// The prefills (requests) fitted.
    pub prefills: u64,
    /// The readings of engines they came in.
    pub readings: u64,
}

/// Why the engines' prefills price no token yet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unpriced {
    /// Fewer than [`MIN_PRICED_TOKENS`] computed.
    TooFewTokens {
        /// The tokens the prefills computed.
        computed: u64,
    },
    /// Fewer than [`MIN_PRICE_READINGS`] readings beyond each engine's first.
    TooFewReadings {
        /// The readings of engines' prefills.
        readings: u64,
        /// The engines they came from.
        engines: u64,
    },
    /// The prefills computed about as many tokens each (a spread under [`MIN_SPREAD_TOKENS`]).
    PrefillsAlike {
        /// The standard deviation of the tokens computed per prefill, tokens.
        spread: f64,
    },
    /// The prefills did not take longer for more tokens: something else (waiting for the CPU)
    /// set their time.
    NotGrowing,
    /// The fit's standard error is above [`MAX_PRICE_ERROR`] of the price.
    Unsettled {
        /// The price fitted, µs a token.
        per_token_micros: f64,
        /// Its standard error, µs.
        error_micros: f64,
    },
}

impl PrefillFit {
    /// Adds one reading of an engine's prefills (none: nothing is added).
    pub fn add(&mut self, p: &Prefills) {
        if p.requests == 0 {
            return;
        }
        let (n, c, t) = (p.requests as f64, p.computed_tokens as f64, p.micros as f64);
        self.readings += 1;
        self.requests += n;
        self.tokens += c;
        self.tokens_sq += c * c / n;
        self.micros += t;
        self.tokens_micros += c * t / n;
        self.micros_sq += t * t / n;
    }

    /// Adds every reading of `other`.
    pub fn merge(&mut self, other: &PrefillFit) {
        self.readings += other.readings;
        self.requests += other.requests;
        self.tokens += other.tokens;
        self.tokens_sq += other.tokens_sq;
        self.micros += other.micros;
        self.tokens_micros += other.tokens_micros;
        self.micros_sq += other.micros_sq;
    }

    /// This engine's fit alone: [`price_of`] one engine.
    pub fn price(&self) -> Result<PrefillPrice, Unpriced> {
        price_of(std::slice::from_ref(self))
    }

    /// The residual sum of squares about the line of slope `b` through this engine's readings
    /// (its own fixed cost fitted), and that fixed cost.
    fn residuals(&self, b: f64) -> (f64, f64) {
        let (n, c, cc, t, ct, tt) = (
            self.requests,
            self.tokens,
            self.tokens_sq,
            self.micros,
            self.tokens_micros,
            self.micros_sq,
        );
        let a = (t - b * c) / n;
        let rss = tt - 2.0 * a * t - 2.0 * b * ct + a * a * n + 2.0 * a * b * c + b * b * cc;
        (rss, a)
    }
}

/// The price of a computed token from the engines' fits: the slope of the lines through each
/// engine's readings, one slope for all and a fixed cost for each (engines differ in what a
/// step costs them: a node busier than another, a reader whose steps follow its loads), so that
/// only an engine's prefills of different sizes say what a token costs. Known once at least
/// [`MIN_PRICED_TOKENS`] were computed, in [`MIN_PRICE_READINGS`] readings or more beyond each
/// engine's first, of prefills whose sizes spread within the engines by at least
/// [`MIN_SPREAD_TOKENS`], and the price's standard error is at most [`MAX_PRICE_ERROR`] of it.
pub fn price_of(engines: &[PrefillFit]) -> Result<PrefillPrice, Unpriced> {
    let engines: Vec<&PrefillFit> = engines.iter().filter(|f| f.readings > 0).collect();
    let tokens: f64 = engines.iter().map(|f| f.tokens).sum();
    let computed = tokens.round() as u64;
    if computed < MIN_PRICED_TOKENS {
        return Err(Unpriced::TooFewTokens { computed });
    }
    let readings: u64 = engines.iter().map(|f| f.readings).sum();
    let count = engines.len() as u64;
    if readings < count + MIN_PRICE_READINGS {
        return Err(Unpriced::TooFewReadings {
            readings,
            engines: count,
        });
    }
    let requests: f64 = engines.iter().map(|f| f.requests).sum();
    // Within each engine: the spread of its tokens a prefill, and how its time follows them.
    let spread_sq: f64 = engines
        .iter()
        .map(|f| f.tokens_sq - f.tokens * f.tokens / f.requests)
        .sum();
    let together: f64 = engines
        .iter()
        .map(|f| f.tokens_micros - f.tokens * f.micros / f.requests)
        .sum();
    let spread = (spread_sq.max(0.0) / requests).sqrt();
    if spread < MIN_SPREAD_TOKENS {
        return Err(Unpriced::PrefillsAlike { spread });
    }
    let b = together / spread_sq;
    if !(b > 0.0 && b.is_finite()) {
        return Err(Unpriced::NotGrowing);
    }
    let (mut rss, mut fixed) = (0.0, 0.0);
    for f in &engines {
        let (r, a) = f.residuals(b);
        rss += r;
        fixed += a * f.requests;
    }
    let spare = readings - count - MIN_PRICE_READINGS;
    let error = (spare > 0).then(|| (rss.max(0.0) / spare as f64 / spread_sq).sqrt());
    if let Some(error) = error
        && error > MAX_PRICE_ERROR * b
    {
        return Err(Unpriced::Unsettled {
            per_token_micros: b,
            error_micros: error,
        });
    }
    Ok(PrefillPrice {
        per_token_micros: b,
        per_prefill_micros: (fixed / requests).max(0.0),
        per_token_error_micros: error,
        computed_tokens: computed,
        prefills: requests.round() as u64,
        readings,
    })
}

/// The prefill `loaded` tokens spared at `price`, less the `load_micros` their loads took, with
/// its standard error (µs): with nothing loaded, the loads' time alone (exact), with tokens
/// loaded and no price, none.
fn saved(
    loaded: u64,
    load_micros: u64,
    price: Option<&PrefillPrice>,
) -> Option<(f64, Option<f64>)> {
    let spent = load_micros as f64;
    if loaded == 0 {
        return Some((-spent, Some(0.0)));
    }
    let p = price?;
    let tokens = loaded as f64;
    Some((
        tokens * p.per_token_micros - spent,
        p.per_token_error_micros.map(|e| tokens * e),
    ))
}

/// Microseconds as seconds with `decimals` decimals (no `-0.00`).
fn seconds_text(micros: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, micros / 1e6);
    match text.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_owned(),
        _ => text,
    }
}

/// `PrefillPriced`: the price of a computed token and what it was fitted to, or why there is
/// none yet (`prefillSecondsSaved` is then absent while tokens were loaded).
pub fn price_condition(price: &Result<PrefillPrice, Unpriced>) -> Cond {
    match price {
        Ok(p) => Cond::yes(
            PREFILL_PRICED,
            "Priced",
            format!(
                "a computed prompt token costs {:.4} ms ({}) of prefill and a prefill {:.0} ms besides, fitted to {} tokens computed in {} prefills ({} readings of the engines) within the last hour",
                p.per_token_micros / 1e3,
                p.per_token_error_micros.map_or_else(
                    || "no error bar until a second reading beyond each engine's first".to_owned(),
                    |e| format!("± {:.4} ms", e / 1e3)
                ),
                p.per_prefill_micros / 1e3,
                p.computed_tokens,
                p.prefills,
                p.readings
            ),
        ),
        Err(Unpriced::TooFewTokens { computed }) => Cond::unknown(
            PREFILL_PRICED,
            "TooFewTokensComputed",
            format!(
                "the engines computed {computed} prompt tokens within the last hour and a price needs {MIN_PRICED_TOKENS}: status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded from the store"
            ),
        ),
        Err(Unpriced::TooFewReadings { readings, engines }) => Cond::unknown(
            PREFILL_PRICED,
            "TooFewReadings",
            format!(
                "the prefills of {engines} engine(s) were read {readings} time(s) within the last hour and a price needs {MIN_PRICE_READINGS} reading(s) beyond each engine's first (an engine is read every --engine-metrics-interval): status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded"
            ),
        ),
        Err(Unpriced::Unsettled {
            per_token_micros,
            error_micros,
        }) => Cond::unknown(
            PREFILL_PRICED,
            "PriceUnsettled",
            format!(
                "the engines' prefills put a computed token at {:.4} ms ± {:.4} ms, more than {:.0} % uncertain (a busy node, an engine's first prefills): status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded, until more prefills settle it",
                per_token_micros / 1e3,
                error_micros / 1e3,
                MAX_PRICE_ERROR * 100.0
            ),
        ),
        Err(Unpriced::PrefillsAlike { spread }) => Cond::unknown(
            PREFILL_PRICED,
            "PrefillsAlike",
            format!(
                "the engines' prefills computed about as many tokens each (they spread by {spread:.0} tokens, under {MIN_SPREAD_TOKENS:.0}): a prefill's fixed cost cannot be told from a token's price until prefills of other sizes are read; status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded"
            ),
        ),
        Err(Unpriced::NotGrowing) => Cond::unknown(
            PREFILL_PRICED,
            "PrefillsNotGrowing",
            "the engines' prefills did not take longer for more tokens computed: their time is set by something else (waiting for the CPU or GPU); status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded",
        ),
    }
}

/// Several deployments' figures as one (a Binding's, from the ModelDeployments that use it):
/// every count summed and the ratio recomputed; the window is the first's (one operator writes
/// them all with its one `--shared-cache-window`); the loads' time and the seconds saved summed
/// (none saved when a deployment has none: the sum would undercount), their errors summed in
/// quadrature (each deployment's price is fitted on its own); no load median (medians do not
/// add) and no price (the deployments' differ). `None` for none.
pub fn sum(statuses: &[&SharedCacheStatus]) -> Option<SharedCacheStatus> {
    let first = statuses.first()?;
    let mut out = SharedCacheStatus {
        window: first.window.clone(),
        ..SharedCacheStatus::default()
    };
    let number = |v: &Option<String>| v.as_deref().and_then(|v| v.parse::<f64>().ok());
    let (mut load, mut saved, mut variance) = (None::<f64>, Some(0.0f64), Some(0.0f64));
    for s in statuses {
        out.queried_tokens += s.queried_tokens;
        out.hit_tokens += s.hit_tokens;
        out.tokens_from_store += s.tokens_from_store;
        out.engines_read += s.engines_read;
        out.loads += s.loads;
        out.failed_loads += s.failed_loads;
        out.saves += s.saves;
        out.failed_saves += s.failed_saves;
        if let Some(v) = number(&s.load_seconds) {
            *load.get_or_insert(0.0) += v;
        }
        saved = saved
            .zip(number(&s.prefill_seconds_saved))
            .map(|(a, b)| a + b);
        variance = variance
            .zip(number(&s.prefill_seconds_saved_error))
            .map(|(a, e)| a + e * e);
    }
    out.hit_ratio = ratio(out.hit_tokens, out.queried_tokens);
    out.load_seconds = load.map(|v| seconds_text(v * 1e6, 3));
    out.prefill_seconds_saved = saved.map(|v| seconds_text(v * 1e6, 2));
    out.prefill_seconds_saved_error = saved.and(variance).map(|v| seconds_text(v.sqrt() * 1e6, 2));
    Some(out)
}

/// `hit / queried` with two decimals, as a string (a CRD field with a float is not portable);
/// none when nothing was looked up.
pub fn ratio(hit: u64, queried: u64) -> Option<String> {
    (queried > 0).then(|| format!("{:.2}", hit.min(queried) as f64 / queried as f64))
}

/// What the deployment's engines are, for the condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engines {
    /// No `kvCache`: nothing to observe.
    NotAttached,
    /// An engine that does not count store hits per Pod.
    Uncounted(EngineName),
    /// Engines that count; how many replicas are ready.
    Counted {
        /// Ready engine Pods (more than a pass reads when [`crate::read::ENGINE_PODS_PER_PASS`]
        /// left some out).
        ready: usize,
    },
}

/// What a deployment's engines can tell about the shared cache: nothing without `kvCache` (or
/// while it does not resolve), a note for an engine that does not count store hits, otherwise
/// how many replicas of its managed roles are ready (take-over roles run what they like).
pub fn engines(engine: EngineName, resolution: &Resolution, roles: &[RoleObservation]) -> Engines {
    match resolution {
        Resolution::Resolved { .. } if engine == EngineName::Vllm => Engines::Counted {
            ready: roles
                .iter()
                .filter(|r| !r.unmanaged)
                .map(|r| usize::try_from(r.ready).unwrap_or(0))
                .sum(),
        },
        Resolution::Resolved { .. } => Engines::Uncounted(engine),
        _ => Engines::NotAttached,
    }
}

/// `SharedCacheObserved`: whether every ready engine's counters were read this pass; a Pod that
/// could not be read is named with why, never counted as zero.
pub fn condition(engines: Engines, readings: &[EngineReading]) -> Cond {
    match engines {
        Engines::NotAttached => Cond::yes(
            SHARED_CACHE_OBSERVED,
            "NotApplicable",
            "no kvCache: the replicas use no shared cache",
        ),
        Engines::Uncounted(name) => Cond::unknown(
            SHARED_CACHE_OBSERVED,
            "NotCountedByEngine",
            format!(
                "{} publishes no per-engine count of shared-cache hits: status.sharedCache stays empty; the store's own figures (the Binding's status.usage) still show the domain's data",
                name.as_str()
            ),
        ),
        Engines::Counted { ready: 0 } => Cond::unknown(
            SHARED_CACHE_OBSERVED,
            "NoEngineReady",
            "no engine replica is ready: nothing to read",
        ),
        Engines::Counted { ready } => {
            let failed: Vec<String> = readings
                .iter()
                .filter_map(|r| r.counters.as_ref().err().map(|e| format!("{}: {e}", r.pod)))
                .collect();
            // More ready than read: the pass's cap left the rest out.
            let capped = if ready > readings.len() {
                format!(
                    " (of {ready}: a pass reads at most {})",
                    crate::read::ENGINE_PODS_PER_PASS
                )
            } else {
                String::new()
            };
            if failed.is_empty() {
                Cond::yes(
                    SHARED_CACHE_OBSERVED,
                    "EnginesRead",
                    format!(
                        "read the shared-cache counters of {} ready engine Pod(s){capped}",
                        readings.len()
                    ),
                )
            } else {
                Cond::no(
                    SHARED_CACHE_OBSERVED,
                    "EngineMetricsUnreadable",
                    format!(
                        "{} of {} ready engine Pod(s){capped} could not be read and are left out of status.sharedCache: {}",
                        failed.len(),
                        readings.len(),
                        failed.join("; ")
                    ),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# HELP vllm:external_prefix_cache_queries External prefix cache queries (tokens).
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="/models/tiny-llama"} 400.0
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="/models/tiny-llama"} 192.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="/models/tiny-llama",source="local_compute"} 208.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="/models/tiny-llama",source="external_kv_transfer"} 192.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="a \"quoted\" , name}",source="local_cache_hit"} 7.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf"} 2.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="/models/tiny-llama"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/models/tiny-llama"} 0.4125
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="/models/tiny-llama"} 2.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="/models/tiny-llama"} 208.0
vllm:request_prefill_kv_computed_tokens_created{engine="0",model_name="/models/tiny-llama"} 1.7e9
"#;

    fn counters(q: u64, h: u64, s: u64) -> EngineCounters {
        EngineCounters {
            queried_tokens: q,
            hit_tokens: h,
            tokens_from_store: s,
            operations: StoreOperations::default(),
            prefills: Prefills::default(),
        }
    }

    /// Counters with `loads` loads of which `failed` failed, each taking 0.1 s.
    fn loading(loads: u64, failed: u64) -> EngineCounters {
        EngineCounters {
            operations: StoreOperations {
                loads,
                failed_loads: failed,
                load_time: vec![(50_000, 0), (100_000, loads), (u64::MAX, loads)],
                ..Default::default()
            },
            ..counters(loads * 10, loads * 10, 0)
        }
    }

    const OPERATIONS: &str = r#"vllm:external_prefix_cache_queries_total{engine="0"} 10
vllm:external_prefix_cache_hits_total{engine="0"} 10
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="ok"} 7.0
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="error"} 3.0
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="partial_failure"} 2.0
vllm:mooncake_store_operation_total{engine="0",operation="save_put",status="ok"} 4.0
vllm:mooncake_store_operation_total{engine="0",operation="save_put",status="partial_failure"} 1.0
vllm:mooncake_store_operation_total{engine="0",operation="exists",status="error"} 9.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="load_get",le="0.05"} 2.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="load_get",le="0.1"} 10.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="load_get",le="+Inf"} 10.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="save_put",le="0.05"} 4.0
vllm:mooncake_store_operation_time_seconds_sum{engine="0",operation="load_get",status="ok"} 0.5
vllm:mooncake_store_operation_time_seconds_sum{engine="0",operation="load_get",status="error"} 0.25
vllm:mooncake_store_operation_time_seconds_sum{engine="0",operation="save_put",status="ok"} 9.0
"#;

    #[test]
    fn the_connectors_loads_saves_and_load_times_are_read_by_operation_and_status() {
        let c = parse_engine_metrics(EngineName::Vllm, "u", OPERATIONS).expect("readable");
        assert_eq!(
            c.operations,
            StoreOperations {
                loads: 12,
                failed_loads: 5,
                saves: 5,
                failed_saves: 1,
                load_time: vec![(50_000, 2), (100_000, 10), (u64::MAX, 10)],
                load_micros: 750_000,
            }
        );
        // The median of 10 loads, 2 under 50 ms and 8 between 50 and 100 ms: 5 is the third of
        // the 8 of the second bucket.
        assert_eq!(median_micros(&c.operations.load_time), Some(68_750));
        assert_eq!(median_micros(&[]), None);
        assert_eq!(median_micros(&[(u64::MAX, 0)]), None);
        assert_eq!(median_micros(&[(1_000, 0), (u64::MAX, 4)]), Some(1_000));
    }

    #[test]
    fn failed_loads_in_the_window_turn_the_deployment_unhealthy_naming_the_pod() {
        let mut w = Window::default();
        w.record(
            0,
            60_000,
            &[
                reading("a", Ok(loading(100, 0))),
                reading("b", Ok(loading(100, 0))),
            ],
        );
        // 70 s on: within the window a loaded 20 more, all fine; b 20 more, 10 failed.
        let now = [
            reading("a", Ok(loading(120, 0))),
            reading("b", Ok(loading(120, 10))),
        ];
        w.record(70_000, 60_000, &now);
        let s = w.summary(70_000, 60_000, "1m");
        assert_eq!((s.loads, s.failed_loads), (40, 10));
        assert_eq!(s.load_time_p50.as_deref(), Some("0.075s"));
        let c = w.health(70_000, 60_000, &now);
        assert_eq!(
            (c.status, c.reason),
            (kvcache_api::condition::Status::False, "LoadsFallingBack")
        );
        assert!(
            c.message.contains("10 of 40 loads failed") && c.message.contains("b 10 of 20"),
            "{}",
            c.message
        );
        assert!(!c.message.contains("a "), "{}", c.message);
        // Within the share: healthy.
        let mut w = Window::default();
        w.record(0, 60_000, &[reading("a", Ok(loading(100, 5)))]);
        let c = w.health(0, 60_000, &[reading("a", Ok(loading(100, 5)))]);
        assert_eq!(c.reason, "LoadsSucceed");
        // No loads: nothing failing.
        assert_eq!(Window::default().health(0, 60_000, &[]).reason, "NoLoads");
    }

    /// An engine's counters after `prefills` (requests, computed tokens, ms), having loaded
    /// `loaded` tokens in `load_ms`.
    fn engine(prefills: (u64, u64, u64), loaded: u64, load_ms: u64) -> EngineCounters {
        EngineCounters {
            tokens_from_store: loaded,
            operations: StoreOperations {
                loads: u64::from(loaded > 0),
                load_micros: load_ms * 1000,
                ..Default::default()
            },
            prefills: Prefills {
                requests: prefills.0,
                computed_tokens: prefills.1,
                micros: prefills.2 * 1000,
            },
            ..counters(prefills.1 + loaded, loaded, loaded)
        }
    }

    /// A fit of readings (requests, computed tokens, µs).
    fn fit(readings: &[(u64, u64, u64)]) -> PrefillFit {
        let mut f = PrefillFit::default();
        for &(requests, computed_tokens, micros) in readings {
            f.add(&Prefills {
                requests,
                computed_tokens,
                micros,
            });
        }
        f
    }

    #[test]
    fn a_hit_by_an_engine_that_computed_almost_nothing_is_priced_by_the_deployments_prefills() {
        // The demo's case: a prefill step costs 180 ms whatever its tokens, a token 2.2 ms.
        // Replica A computes 200 tokens (0.62 s), then 4,000 (8.98 s); replica B computes 8
        // and 32 (0.1976 s and 0.2504 s: mostly the step's cost, 5.6 ms a token on its own)
        // and loads 192 and 3,968 tokens in 0.1 s and 0.45 s.
        let mut w = Window::default();
        let zero = engine((0, 0, 0), 0, 0);
        w.record(
            0,
            300_000,
            &[reading("a", Ok(zero.clone())), reading("b", Ok(zero))],
        );
        w.record(
            15_000,
            300_000,
            &[
                reading("a", Ok(engine((1, 200, 620), 0, 0))),
                reading("b", Ok(engine((1, 8, 197), 192, 100))),
            ],
        );
        // 197.6 ms rounds to 197: B's second reading adds 250.4 + 0.6 ms.
        w.record(
            30_000,
            300_000,
            &[
                reading("a", Ok(engine((2, 4200, 9600), 0, 0))),
                reading("b", Ok(engine((2, 40, 448), 4160, 550))),
            ],
        );
        let s = w.summary(30_000, 300_000, "5m");
        // 4,160 tokens at 2.2 ms, less the loads' 0.55 s; B's own price would claim 23.3 s.
        assert_eq!(s.prefill_seconds_saved.as_deref(), Some("8.60"), "{s:?}");
        assert_eq!(s.prefill_ms_per_token.as_deref(), Some("2.2000"), "{s:?}");
        assert_eq!(s.load_seconds.as_deref(), Some("0.550"));
        let error: f64 = s
            .prefill_seconds_saved_error
            .as_deref()
            .and_then(|e| e.parse().ok())
            .expect("an error bar from four readings");
        assert!(
            error < 0.01,
            "the readings lie on a line (to the ms): {s:?}"
        );
        let p = w.price().expect("priced");
        assert!((p.per_prefill_micros - 180_000.0).abs() < 1_000.0, "{p:?}");
        assert_eq!((p.computed_tokens, p.prefills, p.readings), (4240, 4, 4));
        let c = price_condition(&w.price());
        assert_eq!((c.type_, c.reason), (PREFILL_PRICED, "Priced"));
        assert!(
            c.message.starts_with("a computed prompt token costs 2.2000 ms (± 0.0")
                && c.message.contains(
                    "of prefill and a prefill 180 ms besides, fitted to 4240 tokens computed in 4 prefills (4 readings of the engines)"
                ),
            "{}",
            c.message
        );
    }

    #[test]
    fn a_readers_slow_steps_after_its_loads_are_its_own_fixed_cost_not_a_cheaper_token() {
        // Measured on the bench model (real_engine::prefill_saved): the writer's prefills lie
        // on 60 ms + 0.686 ms a token; the reader's steps after its loads compute 32 tokens in
        // about 0.69 s. Fitted with one fixed cost for both, the reader's steps would pull the
        // price down by a third; each engine's own fixed cost leaves it the writer's.
        let mut w = Window::default();
        let (mut a, mut b) = ((0, 0, 0), (0, 0, 0));
        for (i, (size, ms, reader_ms)) in [(256, 236, 688), (1024, 762, 690), (2048, 1465, 700)]
            .into_iter()
            .enumerate()
        {
            a = (a.0 + 1, a.1 + size, a.2 + ms);
            b = (b.0 + 1, b.1 + 32, b.2 + reader_ms);
            let t = 15_000 * (i as u64 + 1);
            w.record(
                t,
                60_000,
                &[
                    reading("a", Ok(engine(a, 0, 0))),
                    reading("b", Ok(engine(b, 992 * (i as u64 + 1), 50))),
                ],
            );
        }
        let p = w.price().expect("priced");
        assert!((p.per_token_micros - 686.0).abs() < 2.0, "{p:?}");
        assert_eq!((p.readings, p.prefills), (6, 6));
        let one_engine = fit(&[
            (1, 256, 236_000),
            (1, 1024, 762_000),
            (1, 2048, 1_465_000),
            (1, 32, 688_000),
            (1, 32, 690_000),
            (1, 32, 700_000),
        ]);
        let pooled = one_engine.price().expect("priced");
        assert!(pooled.per_token_micros < 500.0, "{pooled:?}");
    }

    #[test]
    fn a_price_needs_the_minimum_of_computed_tokens_in_prefills_of_different_sizes() {
        // 100 ms a prefill and 2 ms a token. One token short of the minimum: no price.
        let short = fit(&[(1, 47, 194_000), (1, 1000, 2_100_000), (1, 1000, 2_100_000)]);
        assert_eq!(
            short.price(),
            Err(Unpriced::TooFewTokens { computed: 2047 })
        );
        let at = fit(&[(1, 48, 196_000), (1, 1000, 2_100_000), (1, 1000, 2_100_000)]);
        let p = at.price().expect("priced at the minimum");
        assert!((p.per_token_micros - 2000.0).abs() < 1e-6, "{p:?}");
        assert!((p.per_prefill_micros - 100_000.0).abs() < 1e-3, "{p:?}");
        // One reading of an engine fixes only its fixed cost; two fix a line, and say nothing
        // of its error.
        let one = fit(&[(2, 2048, 2_000_000)]);
        assert_eq!(
            one.price(),
            Err(Unpriced::TooFewReadings {
                readings: 1,
                engines: 1
            })
        );
        let two = fit(&[(1, 48, 196_000), (1, 2000, 4_100_000)]);
        let p = two.price().expect("priced by two readings");
        assert!((p.per_token_micros - 2000.0).abs() < 1e-6, "{p:?}");
        assert_eq!(p.per_token_error_micros, None);
        // Every prefill as large: the fixed cost and the price cannot be told apart.
        let alike = fit(&[
            (1, 1024, 1_000_000),
            (1, 1024, 1_100_000),
            (2, 2048, 2_000_000),
        ]);
        assert_eq!(alike.price(), Err(Unpriced::PrefillsAlike { spread: 0.0 }));
        // Longer prefills took less time: nothing to price.
        let flat = fit(&[(1, 100, 500_000), (1, 3000, 400_000), (1, 1500, 450_000)]);
        assert_eq!(flat.price(), Err(Unpriced::NotGrowing));
        // 250 µs ± 1,010 µs: too noisy to show.
        let noisy = fit(&[
            (1, 1000, 1_000_000),
            (1, 2000, 3_000_000),
            (1, 3000, 1_500_000),
        ]);
        assert!(
            matches!(noisy.price(), Err(Unpriced::Unsettled { per_token_micros, error_micros })
                if (per_token_micros - 250.0).abs() < 1e-6 && (error_micros - 1010.0).abs() < 1.0),
            "{:?}",
            noisy.price()
        );
        // What the status shows before the minimum: no figure while tokens were loaded, the
        // loads' time alone while none were, and the condition says why.
        let mut w = Window::default();
        w.record(
            0,
            60_000,
            &[reading("b", Ok(engine((1, 8, 200), 192, 100)))],
        );
        let s = w.summary(0, 60_000, "1m");
        assert_eq!(
            (s.prefill_seconds_saved, s.prefill_ms_per_token),
            (None, None)
        );
        assert_eq!(s.load_seconds.as_deref(), Some("0.100"));
        let c = price_condition(&w.price());
        assert_eq!(
            (c.status, c.reason, c.message.as_str()),
            (
                kvcache_api::condition::Status::Unknown,
                "TooFewTokensComputed",
                "the engines computed 8 prompt tokens within the last hour and a price needs 2048: status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded from the store"
            )
        );
        let mut w = Window::default();
        w.record(0, 60_000, &[reading("a", Ok(engine((1, 200, 400), 0, 0)))]);
        let s = w.summary(0, 60_000, "1m");
        assert_eq!(
            (s.prefill_seconds_saved.as_deref(), s.load_seconds),
            (Some("0.00"), None),
            "nothing loaded: nothing saved, whatever the price"
        );
        assert_eq!(price_condition(&alike.price()).reason, "PrefillsAlike");
        assert_eq!(price_condition(&flat.price()).reason, "PrefillsNotGrowing");
        assert_eq!(price_condition(&one.price()).reason, "TooFewReadings");
        assert!(
            price_condition(&two.price())
                .message
                .contains("(no error bar until a second reading beyond each engine's first)")
        );
        let c = price_condition(&noisy.price());
        assert_eq!(
            (
                c.reason,
                c.message.starts_with(
                    "the engines' prefills put a computed token at 0.2500 ms ± 1.0104 ms, more than 50 % uncertain"
                )
            ),
            ("PriceUnsettled", true),
            "{}",
            c.message
        );
    }

    #[test]
    fn the_price_and_its_error_bar_are_the_weighted_least_squares_fit() {
        // t = 66.7 ms + 1 ms a token, residuals +33.3, -66.7, +33.3 ms: the standard error of
        // the slope is sqrt(6.667e9 / 1 / 2e6) = 57.7 µs.
        let p = fit(&[
            (1, 1000, 1_100_000),
            (1, 2000, 2_000_000),
            (1, 3000, 3_100_000),
        ])
        .price()
        .expect("priced");
        assert!((p.per_token_micros - 1000.0).abs() < 1e-6, "{p:?}");
        assert!((p.per_prefill_micros - 66_666.667).abs() < 1e-2, "{p:?}");
        assert!(
            (p.per_token_error_micros.unwrap_or_default() - 57.735).abs() < 1e-3,
            "{p:?}"
        );
        // A reading of several requests weighs as that many readings of one: the same line.
        let apart = fit(&[
            (1, 1000, 1_100_000),
            (1, 1000, 1_100_000),
            (1, 2000, 2_000_000),
            (1, 3000, 3_100_000),
        ]);
        let together = fit(&[
            (2, 2000, 2_200_000),
            (1, 2000, 2_000_000),
            (1, 3000, 3_100_000),
        ]);
        let (apart, together) = (
            apart.price().expect("priced"),
            together.price().expect("priced"),
        );
        assert!(
            (apart.per_token_micros - together.per_token_micros).abs() < 1e-9
                && (apart.per_prefill_micros - together.per_prefill_micros).abs() < 1e-6,
            "{apart:?} {together:?}"
        );
        // A negative fixed cost is noise: shown as none; the price is the line's slope.
        let p = fit(&[
            (1, 1000, 900_000),
            (1, 2000, 2_000_000),
            (1, 3000, 3_100_000),
        ])
        .price()
        .expect("priced");
        assert_eq!(p.per_prefill_micros, 0.0);
        assert!((p.per_token_micros - 1100.0).abs() < 1e-9, "{p:?}");
        // The seconds saved carry the price's error times the tokens loaded.
        let (s, e) = saved(
            1000,
            200_000,
            Some(
                &fit(&[
                    (1, 1000, 1_100_000),
                    (1, 2000, 2_000_000),
                    (1, 3000, 3_100_000),
                ])
                .price()
                .expect("priced"),
            ),
        )
        .expect("saved");
        assert!((s - 800_000.0).abs() < 1e-3 && (e.unwrap_or_default() - 57_735.0).abs() < 1.0);
    }

    #[test]
    fn the_price_keeps_a_gone_pods_prefills_counts_a_restart_from_zero_and_forgets_after_an_hour() {
        let mut w = Window::default();
        w.record(
            0,
            60_000,
            &[reading("a", Ok(engine((1, 2000, 2_100), 0, 0)))],
        );
        // a missed one pass (not ready) and is read again: its prefills are not counted twice.
        w.record(15_000, 60_000, &[]);
        w.record(
            30_000,
            60_000,
            &[reading("a", Ok(engine((2, 2100, 2_300), 0, 0)))],
        );
        assert_eq!(
            w.price().map(|p| (p.computed_tokens, p.readings)),
            Ok((2100, 2))
        );
        // a's engine restarted: what it did since counts from zero, nothing goes negative.
        w.record(
            45_000,
            60_000,
            &[reading("a", Ok(engine((1, 500, 600), 0, 0)))],
        );
        let p = w.price().expect("priced");
        assert_eq!((p.computed_tokens, p.prefills, p.readings), (2600, 3, 3));
        // a gone, b new: a's prefills still price b's loads.
        w.record(
            60_000,
            60_000,
            &[reading("b", Ok(engine((1, 8, 120), 192, 50)))],
        );
        let p = w.price().expect("priced");
        assert_eq!((p.computed_tokens, p.prefills), (2608, 4));
        assert!(
            w.summary(60_000, 60_000, "1m")
                .prefill_seconds_saved
                .is_some()
        );
        // An hour on, what was read before it is forgotten.
        w.record(
            60_000 + PRICE_HISTORY_MS + PRICE_PERIOD_MS,
            60_000,
            &[reading("b", Ok(engine((1, 8, 120), 192, 50)))],
        );
        assert_eq!(w.price(), Err(Unpriced::TooFewTokens { computed: 0 }));
    }

    #[test]
    fn a_bindings_sum_adds_the_seconds_and_their_errors_in_quadrature_and_needs_every_figure() {
        let view = |saved: Option<&str>, error: Option<&str>| SharedCacheStatus {
            window: "5m".into(),
            load_seconds: Some("0.250".into()),
            prefill_seconds_saved: saved.map(str::to_owned),
            prefill_seconds_saved_error: error.map(str::to_owned),
            prefill_ms_per_token: Some("1.0000".into()),
            ..Default::default()
        };
        let (a, b) = (
            view(Some("3.00"), Some("0.30")),
            view(Some("-0.50"), Some("0.40")),
        );
        let s = sum(&[&a, &b]).expect("two");
        assert_eq!(
            (
                s.prefill_seconds_saved.as_deref(),
                s.prefill_seconds_saved_error.as_deref(),
                s.load_seconds.as_deref(),
                s.prefill_ms_per_token
            ),
            (Some("2.50"), Some("0.50"), Some("0.500"), None)
        );
        let unpriced = view(None, None);
        let s = sum(&[&a, &unpriced]).expect("two");
        assert_eq!(
            (s.prefill_seconds_saved, s.prefill_seconds_saved_error),
            (None, None),
            "a deployment without the figure would make the sum undercount"
        );
        assert_eq!(seconds_text(-1.0, 2), "0.00");
        assert_eq!(seconds_text(-10_000.0, 2), "-0.01");
    }

    #[test]
    fn an_unreadable_engine_makes_health_unknown_and_is_named() {
        let mut w = Window::default();
        let now = [
            reading("a", Ok(loading(10, 0))),
            reading(
                "b",
                Err(ReadError::Status {
                    url: "u".into(),
                    status: 500,
                }),
            ),
        ];
        w.record(0, 60_000, &now);
        let c = w.health(0, 60_000, &now);
        assert_eq!(
            (c.status, c.reason),
            (
                kvcache_api::condition::Status::Unknown,
                "EngineMetricsUnreadable"
            )
        );
        assert!(c.message.contains('b'), "{}", c.message);
    }

    #[test]
    fn an_engine_restarted_mid_window_neither_goes_negative_nor_doubles() {
        let mut w = Window::default();
        w.record(0, 60_000, &[reading("a", Ok(loading(50, 5)))]);
        w.record(10_000, 60_000, &[reading("a", Ok(loading(80, 8)))]);
        // The container restarted (same Pod uid): its counters start again from zero.
        w.record(20_000, 60_000, &[reading("a", Ok(loading(4, 1)))]);
        let s = w.summary(20_000, 60_000, "1m");
        assert_eq!(
            (s.loads, s.failed_loads),
            (4, 1),
            "the new run's counts alone"
        );
        assert_eq!((s.queried_tokens, s.hit_tokens), (40, 40));
    }

    fn reading(pod: &str, c: Result<EngineCounters, ReadError>) -> EngineReading {
        EngineReading {
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            counters: c,
        }
    }

    #[test]
    fn a_vllm_scrape_gives_its_queries_hits_and_tokens_from_the_store() {
        assert_eq!(
            parse_engine_metrics(EngineName::Vllm, "u", SCRAPE),
            Ok(EngineCounters {
                prefills: Prefills {
                    requests: 2,
                    computed_tokens: 208,
                    micros: 412_500,
                },
                ..counters(400, 192, 192)
            })
        );
    }

    #[test]
    fn series_are_summed_over_their_label_sets() {
        let text = "vllm:external_prefix_cache_queries_total{engine=\"0\"} 10\nvllm:external_prefix_cache_queries_total{engine=\"1\"} 5\nvllm:external_prefix_cache_hits_total 3\n";
        assert_eq!(
            parse_engine_metrics(EngineName::Vllm, "u", text),
            Ok(counters(15, 3, 0))
        );
    }

    #[test]
    fn a_scrape_without_the_hit_series_is_unreadable_not_zero() {
        let text = "vllm:num_requests_running 0\nvllm:external_prefix_cache_queries_total 5\n";
        let e = parse_engine_metrics(EngineName::Vllm, "http://p:8000/metrics", text)
            .expect_err("no hit series");
        assert!(
            matches!(e, ReadError::Unreadable { ref url, .. } if url == "http://p:8000/metrics")
        );
        assert_eq!(
            e.to_string(),
            "http://p:8000/metrics answered something unreadable: no vllm:external_prefix_cache_queries_total and vllm:external_prefix_cache_hits_total series: the engine runs without the store's connector or does not count external prefix hits"
        );
        assert_eq!(
            parse_engine_metrics(EngineName::Sglang, "u", SCRAPE),
            Err(ReadError::Unreadable {
                url: "u".into(),
                cause: BadAnswer::EngineUncounted
            })
        );
    }

    #[test]
    fn malformed_lines_and_negative_values_are_skipped() {
        let text = "vllm:external_prefix_cache_queries_total{engine=\"0\" 9\nvllm:external_prefix_cache_queries_total -3\nvllm:external_prefix_cache_queries_total NaN\nvllm:external_prefix_cache_queries_total 4\nvllm:external_prefix_cache_hits_total 1 1700000000000\n";
        assert_eq!(
            parse_engine_metrics(EngineName::Vllm, "u", text),
            Ok(counters(4, 1, 0))
        );
    }

    #[test]
    fn the_window_counts_growth_since_its_start_and_pods_first_read_inside_it_from_zero() {
        let mut w = Window::default();
        w.record(0, 60_000, &[reading("a", Ok(counters(100, 0, 0)))]);
        w.record(50_000, 60_000, &[reading("a", Ok(counters(300, 150, 150)))]);
        // Both samples are inside the window: a's counters count from zero.
        let s = w.summary(50_000, 60_000, "1m");
        assert_eq!((s.queried_tokens, s.hit_tokens), (300, 150));
        assert_eq!(s.hit_ratio.as_deref(), Some("0.50"));
        // 90 s: the first sample is the baseline.
        w.record(
            90_000,
            60_000,
            &[
                reading("a", Ok(counters(400, 250, 250))),
                reading("b", Ok(counters(200, 200, 200))),
            ],
        );
        let s = w.summary(90_000, 60_000, "1m");
        assert_eq!((s.queried_tokens, s.hit_tokens), (300 + 200, 250 + 200));
        assert_eq!(s.hit_ratio.as_deref(), Some("0.90"));
        assert_eq!(s.tokens_from_store, 450);
        assert_eq!(s.engines_read, 2);
    }

    #[test]
    fn a_pod_gone_leaves_the_window_and_a_failed_read_keeps_its_samples() {
        let mut w = Window::default();
        w.record(
            0,
            60_000,
            &[
                reading("a", Ok(counters(10, 5, 5))),
                reading("b", Ok(counters(10, 0, 0))),
            ],
        );
        w.record(
            1_000,
            60_000,
            &[reading(
                "a",
                Err(ReadError::Status {
                    url: "u".into(),
                    status: 500,
                }),
            )],
        );
        let s = w.summary(1_000, 60_000, "1m");
        assert_eq!((s.queried_tokens, s.hit_tokens, s.engines_read), (10, 5, 1));
    }

    #[test]
    fn a_restarted_engine_starts_its_samples_again() {
        let mut w = Window::default();
        w.record(0, 60_000, &[reading("a", Ok(counters(500, 400, 400)))]);
        w.record(70_000, 60_000, &[reading("a", Ok(counters(600, 450, 450)))]);
        w.record(80_000, 60_000, &[reading("a", Ok(counters(20, 10, 10)))]);
        let s = w.summary(80_000, 60_000, "1m");
        assert_eq!((s.queried_tokens, s.hit_tokens), (20, 10));
    }

    #[test]
    fn no_lookups_give_no_ratio() {
        let w = Window::default();
        let s = w.summary(0, 60_000, "1m");
        assert_eq!(s.hit_ratio, None);
        assert_eq!(ratio(5, 4).as_deref(), Some("1.00"));
    }

    fn role(ready: i32, unmanaged: bool) -> RoleObservation {
        RoleObservation {
            name: "server".into(),
            desired: 2,
            ready,
            updated: 2,
            total: 2,
            observed: true,
            unmanaged,
        }
    }

    #[test]
    fn only_an_attached_vllm_counts_and_take_over_roles_are_left_out() {
        let resolved = Resolution::Resolved {
            binding: "team-a/team-a".into(),
            pool: "shared-dram".into(),
            tenant: "default".into(),
        };
        let roles = [role(2, false), role(1, true)];
        assert_eq!(
            engines(EngineName::Vllm, &resolved, &roles),
            Engines::Counted { ready: 2 }
        );
        assert_eq!(
            engines(EngineName::Sglang, &resolved, &roles),
            Engines::Uncounted(EngineName::Sglang)
        );
        assert_eq!(
            engines(EngineName::Vllm, &Resolution::NotApplicable, &roles),
            Engines::NotAttached
        );
    }

    #[test]
    fn an_unreadable_engine_is_named_in_the_condition() {
        let ok = reading("a", Ok(counters(1, 1, 1)));
        let bad = reading(
            "b",
            Err(ReadError::Unreachable {
                url: "http://10.0.0.2:8000/metrics".into(),
                cause: kvcache_quota::admin::NoAnswer::TimedOut { after_ms: 1500 },
            }),
        );
        let c = condition(Engines::Counted { ready: 2 }, &[ok.clone(), bad]);
        assert_eq!(
            (c.status, c.reason),
            (
                kvcache_api::condition::Status::False,
                "EngineMetricsUnreadable"
            )
        );
        assert!(
            c.message
                .contains("b: no answer from http://10.0.0.2:8000/metrics"),
            "{}",
            c.message
        );
        let c = condition(Engines::Counted { ready: 1 }, std::slice::from_ref(&ok));
        assert_eq!(
            (c.reason, c.message.as_str()),
            (
                "EnginesRead",
                "read the shared-cache counters of 1 ready engine Pod(s)"
            )
        );
        let c = condition(Engines::Counted { ready: 40 }, &[ok]);
        assert_eq!(
            c.message,
            format!(
                "read the shared-cache counters of 1 ready engine Pod(s) (of 40: a pass reads at most {})",
                crate::read::ENGINE_PODS_PER_PASS
            )
        );
        assert_eq!(
            condition(Engines::Counted { ready: 0 }, &[]).reason,
            "NoEngineReady"
        );
        assert_eq!(
            condition(Engines::Uncounted(EngineName::Sglang), &[]).reason,
            "NotCountedByEngine"
        );
        assert_eq!(condition(Engines::NotAttached, &[]).reason, "NotApplicable");
    }
}
