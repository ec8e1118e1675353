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

use std::collections::{BTreeMap, VecDeque};

use kvcache_api::condition::Cond;
use kvcache_api::model::conditions::{SHARED_CACHE_HEALTHY, SHARED_CACHE_OBSERVED};
use kvcache_api::model::{EngineName, SharedCacheStatus};

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
/// The `source` label value of tokens the engine computed.
pub const COMPUTED: &str = "local_compute";
/// vLLM's time spent in prefill, a histogram (its `_sum` in seconds).
pub(crate) const VLLM_PREFILL_SECONDS: &str = "vllm:request_prefill_time_seconds_sum";

/// vLLM's Mooncake store connector: operations by `operation` and `status` (`ok`, `error`).
pub(crate) const VLLM_STORE_OPERATIONS: &str = "vllm:mooncake_store_operation_total";
/// Its operations' time, a histogram by `operation`.
pub(crate) const VLLM_STORE_TIME_BUCKETS: &str =
    "vllm:mooncake_store_operation_time_seconds_bucket";
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
    /// Prompt tokens the engine computed itself.
    pub computed_tokens: u64,
    /// The engine's time in prefill, microseconds (`vllm:request_prefill_time_seconds_sum`).
    pub prefill_micros: u64,
}

impl EngineCounters {
    /// The engine's own prefill cost per token, microseconds: its prefill time over the prompt
    /// tokens it computed since it started; `None` before it computed any.
    pub fn prefill_micros_per_token(&self) -> Option<f64> {
        (self.computed_tokens > 0).then(|| self.prefill_micros as f64 / self.computed_tokens as f64)
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
        }
    }

    /// `self` and `other` summed (histograms bucket by bucket).
    fn add(&mut self, other: &StoreOperations) {
        self.loads += other.loads;
        self.failed_loads += other.failed_loads;
        self.saves += other.saves;
        self.failed_saves += other.failed_saves;
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

/// One sample line of the Prometheus text format: its name, labels and value. Comments, blank
/// lines and lines that do not parse are skipped (a scrape is read for the series it needs).
fn samples(text: &str) -> impl Iterator<Item = (&str, Vec<(&str, String)>, f64)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let (name, mut rest) = line.split_at(name_end);
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            let (parsed, after) = label_set(body)?;
            labels = parsed;
            rest = after;
        }
        let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
        Some((name, labels, value))
    })
}

/// The labels of `{k="v",...}` (after the brace) and the text after the closing brace.
fn label_set(mut s: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, rest) = s.split_once('=')?;
        let mut chars = rest.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim(), value));
        s = &rest[1 + end + 1..];
    }
}

/// A whole, non-negative counter value (`NaN`, infinities and negatives are no counter).
fn counter(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0).then_some(v as u64)
}

/// An engine's counters from the text of its `/metrics` at `url`. Every series is summed over
/// its label sets (vLLM labels each with the model and engine index). A scrape without the hit
/// and query series is [`ReadError::Unreadable`]: the engine runs without the store's connector
/// or is a version that does not count, which is not a hit ratio of zero.
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
    let (mut queries, mut hits, mut from_store) = (None::<u64>, None::<u64>, 0u64);
    let mut operations = StoreOperations::default();
    let mut load_time: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut computed, mut prefill_micros) = (0u64, 0u64);
    for (name, labels, value) in samples(text) {
        if name == VLLM_PREFILL_SECONDS && value.is_finite() && value >= 0.0 {
            prefill_micros += (value * 1e6).round() as u64;
            continue;
        }
        let Some(v) = counter(value) else { continue };
        let label = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
        };
        match name {
            VLLM_STORE_OPERATIONS => {
                // vLLM writes `ok`, `error` (the call raised) or `partial_failure` (some keys
                // of the batch failed: a store that refuses a put at the tenant's grant, a member
                // the engine cannot reach); anything but `ok` is a failed operation.
                let failed = label("status") != Some("ok");
                match label("operation") {
                    Some(LOAD_OPERATION) => {
                        operations.loads += v;
                        operations.failed_loads += if failed { v } else { 0 };
                    }
                    Some(SAVE_OPERATION) => {
                        operations.saves += v;
                        operations.failed_saves += if failed { v } else { 0 };
                    }
                    _ => {}
                }
            }
            VLLM_STORE_TIME_BUCKETS if label("operation") == Some(LOAD_OPERATION) => {
                let le = match label("le") {
                    Some("+Inf") => Some(u64::MAX),
                    Some(s) => s
                        .parse::<f64>()
                        .ok()
                        .filter(|b| b.is_finite() && *b >= 0.0)
                        .map(|b| (b * 1e6).round() as u64),
                    None => None,
                };
                if let Some(le) = le {
                    *load_time.entry(le).or_default() += v;
                }
            }
            VLLM_QUERIES => *queries.get_or_insert(0) += v,
            VLLM_HITS => *hits.get_or_insert(0) += v,
            VLLM_TOKENS_BY_SOURCE if label("source") == Some(FROM_STORE) => from_store += v,
            VLLM_TOKENS_BY_SOURCE if label("source") == Some(COMPUTED) => computed += v,
            _ => {}
        }
    }
    match (queries, hits) {
        (Some(queried_tokens), Some(hit_tokens)) => Ok(EngineCounters {
            queried_tokens,
            hit_tokens,
            tokens_from_store: from_store,
            operations: StoreOperations {
                load_time: load_time.into_iter().collect(),
                ..operations
            },
            computed_tokens: computed,
            prefill_micros,
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

/// The samples of one deployment's engines over a sliding window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    /// Per Pod uid: (milliseconds, counters), oldest first.
    pods: BTreeMap<String, VecDeque<(u64, EngineCounters)>>,
    /// Per Pod uid: its name, for the condition.
    names: BTreeMap<String, String>,
}

/// Above this share of failed loads in the window, `SharedCacheHealthy` turns False.
pub const FALLBACK_SHARE: f64 = 0.10;

impl Window {
    /// Records this pass's readings taken at `now_ms`. Pods not among `readings` are gone (or no
    /// longer ready) and leave the window; a Pod whose read failed keeps its earlier samples. A
    /// counter that went down is a restarted engine: its samples start again.
    pub fn record(&mut self, now_ms: u64, window_ms: u64, readings: &[EngineReading]) {
        self.pods
            .retain(|uid, _| readings.iter().any(|r| &r.uid == uid));
        self.names
            .retain(|uid, _| readings.iter().any(|r| &r.uid == uid));
        for r in readings {
            self.names.insert(r.uid.clone(), r.pod.clone());
            let Ok(c) = &r.counters else { continue };
            let samples = self.pods.entry(r.uid.clone()).or_default();
            if samples.back().is_some_and(|(_, last)| {
                c.queried_tokens < last.queried_tokens
                    || c.hit_tokens < last.hit_tokens
                    || c.operations.went_down(&last.operations)
            }) {
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
    }

    /// The deployment's shared-cache figures over the last `window_ms` before `now_ms`: for each
    /// engine the growth of its counters since the window's start (since its first sample when
    /// it was first read inside the window: an engine's counters start at zero, so a Pod first
    /// read within the window counts from its start), summed.
    pub fn summary(&self, now_ms: u64, window_ms: u64, window: &str) -> SharedCacheStatus {
        let (mut queried, mut hit, mut total_from_store) = (0u64, 0u64, 0u64);
        let mut operations = StoreOperations::default();
        let mut saved_micros = 0.0f64;
        let mut priced = false;
        for (_, last, grown) in self.growth(now_ms, window_ms) {
            queried += grown.queried_tokens;
            hit += grown.hit_tokens;
            total_from_store += last.tokens_from_store;
            operations.add(&grown.operations);
            // Each engine's own price of a token (docs/shared-cache-hits.md#prefill-time-saved).
            if let Some(per_token) = last.prefill_micros_per_token() {
                saved_micros += grown.tokens_from_store as f64 * per_token;
                priced = true;
            }
        }
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
            prefill_seconds_saved: priced.then(|| format!("{:.1}", saved_micros / 1e6)),
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
            let grown = EngineCounters {
                queried_tokens: last.queried_tokens.saturating_sub(base.queried_tokens),
                hit_tokens: last.hit_tokens.saturating_sub(base.hit_tokens),
                tokens_from_store: last
                    .tokens_from_store
                    .saturating_sub(base.tokens_from_store),
                operations: last.operations.since(&base.operations),
                computed_tokens: last.computed_tokens.saturating_sub(base.computed_tokens),
                prefill_micros: last.prefill_micros.saturating_sub(base.prefill_micros),
            };
            Some((uid, last, grown))
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

/// Several deployments' figures as one (a Binding's, from the ModelDeployments that use it):
/// every count summed and the ratio recomputed; the window is the first's (one operator writes
/// them all with its one `--shared-cache-window`); the seconds saved summed where given; no load
/// median (medians do not add). `None` for none.
pub fn sum(statuses: &[&SharedCacheStatus]) -> Option<SharedCacheStatus> {
    let first = statuses.first()?;
    let mut out = SharedCacheStatus {
        window: first.window.clone(),
        ..SharedCacheStatus::default()
    };
    let mut saved: Option<f64> = None;
    for s in statuses {
        out.queried_tokens += s.queried_tokens;
        out.hit_tokens += s.hit_tokens;
        out.tokens_from_store += s.tokens_from_store;
        out.engines_read += s.engines_read;
        out.loads += s.loads;
        out.failed_loads += s.failed_loads;
        out.saves += s.saves;
        out.failed_saves += s.failed_saves;
        if let Some(v) = s
            .prefill_seconds_saved
            .as_deref()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *saved.get_or_insert(0.0) += v;
        }
    }
    out.hit_ratio = ratio(out.hit_tokens, out.queried_tokens);
    out.prefill_seconds_saved = saved.map(|v| format!("{v:.1}"));
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
"#;

    fn counters(q: u64, h: u64, s: u64) -> EngineCounters {
        EngineCounters {
            queried_tokens: q,
            hit_tokens: h,
            tokens_from_store: s,
            operations: StoreOperations::default(),
            computed_tokens: 0,
            prefill_micros: 0,
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

    #[test]
    fn prefill_saved_is_the_tokens_loaded_in_the_window_at_each_engines_own_price() {
        let text = "vllm:external_prefix_cache_queries_total 10\nvllm:external_prefix_cache_hits_total 5\nvllm:prompt_tokens_by_source_total{source=\"local_compute\"} 1000\nvllm:request_prefill_time_seconds_sum{engine=\"0\"} 4.0\n";
        let c = parse_engine_metrics(EngineName::Vllm, "u", text).expect("readable");
        assert_eq!((c.computed_tokens, c.prefill_micros), (1000, 4_000_000));
        assert_eq!(c.prefill_micros_per_token(), Some(4000.0));
        // Engine a: 4 ms a token, 500 tokens from the store in the window; b: 2 ms, 1,000.
        let priced = |from_store: u64, micros: u64| EngineCounters {
            tokens_from_store: from_store,
            computed_tokens: 1000,
            prefill_micros: micros,
            ..counters(1, 1, 0)
        };
        let mut w = Window::default();
        w.record(
            0,
            60_000,
            &[
                reading("a", Ok(priced(100, 4_000_000))),
                reading("b", Ok(priced(0, 2_000_000))),
            ],
        );
        w.record(
            70_000,
            60_000,
            &[
                reading("a", Ok(priced(600, 4_000_000))),
                reading("b", Ok(priced(1000, 2_000_000))),
            ],
        );
        let s = w.summary(70_000, 60_000, "1m");
        assert_eq!(
            s.prefill_seconds_saved.as_deref(),
            Some("4.0"),
            "0.5 x 4 ms ... 2.0 + 2.0 s"
        );
        // An engine that computed nothing yet has no price: nothing is claimed.
        let mut w = Window::default();
        w.record(0, 60_000, &[reading("a", Ok(counters(10, 10, 10)))]);
        assert_eq!(w.summary(0, 60_000, "1m").prefill_seconds_saved, None);
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
                computed_tokens: 208,
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
