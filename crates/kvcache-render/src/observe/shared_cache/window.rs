//! One deployment's engines over a sliding window ([`Window`]): their samples, the prefills that
//! price a computed token, and from them `status.sharedCache` and `SharedCacheHealthy`.

use std::collections::{BTreeMap, VecDeque};

use kvcache_api::condition::Cond;
use kvcache_api::model::SharedCacheStatus;
use kvcache_api::model::conditions::SHARED_CACHE_HEALTHY;

use super::counters::{EngineCounters, EngineReading, Prefills, StoreOperations, median_micros};
use super::figures::{ratio, seconds_text};
use super::price::{PrefillFit, PrefillPrice, Unpriced, price_of, saved};

/// The samples of one deployment's engines over a sliding window, and its engines' prefills of
/// the last `PRICE_HISTORY_MS` that price a computed token.
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
pub(crate) const FALLBACK_SHARE: f64 = 0.10;

/// How far back the engines' prefills price a computed token: an hour, so that a window of
/// hits is priced by the prefills before it too, and a price follows the node's load.
pub(crate) const PRICE_HISTORY_MS: u64 = 3_600_000;
/// The prefills of the history are kept as one fit a period of this length (5 minutes).
pub(crate) const PRICE_PERIOD_MS: u64 = 300_000;

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

    /// The price of a computed token from the prefills of the last `PRICE_HISTORY_MS`, or why
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
    /// `FALLBACK_SHARE` of the engines' loads failed (each a prefill the engine paid for after
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
