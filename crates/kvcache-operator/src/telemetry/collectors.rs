//! The series read from the caches and the store readings at each scrape: per Binding, per
//! ModelDeployment, and the masters' own series re-exported.

use std::sync::Arc;

use kube::runtime::reflector::Store;

use super::labels::{BackendLabels, BindingLabels, ModelLabels, SkippedLabels};

/// A Binding's grant and usage as its status reports them (bytes); `None` where the status
/// has no figure (no ledger, or not read yet).
pub fn binding_figures(b: &kvcache_api::KVCachePoolBinding) -> (Option<u64>, Option<u64>) {
    let bytes = |q: Option<&kvcache_api::quantity::Quantity>| {
        q.and_then(|q| kvcache_api::quantity::parse_bytes(&q.0).ok())
    };
    let status = b.status.as_ref();
    (
        bytes(status.and_then(|s| s.effective_quota.as_ref())),
        bytes(status.and_then(|s| s.usage.as_ref())),
    )
}

/// A Binding's `QuotaPressure` as 1 (True) or 0 (False); `None` while it has none.
fn quota_pressure(b: &kvcache_api::KVCachePoolBinding) -> Option<i64> {
    use kvcache_api::pool::binding_conditions::QUOTA_PRESSURE;
    let c = b
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == QUOTA_PRESSURE)?;
    Some(i64::from(c.status == "True"))
}

/// A series read from a `status.sharedCache` (a ModelDeployment's, or a Binding's sum).
type SharedCachePick = fn(&kvcache_api::model::SharedCacheStatus) -> Option<f64>;

/// `status.sharedCache.hitRatio` as a number.
fn hit_ratio(c: &kvcache_api::model::SharedCacheStatus) -> Option<f64> {
    c.hit_ratio.as_deref().and_then(|r| r.parse().ok())
}

/// One gauge family per `(name, help, pick)` of `series`, over the labelled figures.
fn shared_cache_families<L>(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    figures: &[(L, kvcache_api::model::SharedCacheStatus)],
    series: &[(&str, &str, SharedCachePick)],
) -> Result<(), std::fmt::Error>
where
    L: prometheus_client::encoding::EncodeLabelSet,
{
    for (name, help, pick) in series {
        gauge_family(
            encoder,
            (name, help),
            figures.iter().filter_map(|(l, c)| Some((l, pick(c)?))),
        )?;
    }
    Ok(())
}

/// Writes the gauge family `name` (with `help`) with one sample per (labels, value).
fn gauge_family<'a, L, N>(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    (name, help): (&str, &str),
    samples: impl Iterator<Item = (&'a L, N)>,
) -> Result<(), std::fmt::Error>
where
    L: prometheus_client::encoding::EncodeLabelSet + 'a,
    N: prometheus_client::encoding::EncodeGaugeValue + std::fmt::Debug,
{
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::gauge::ConstGauge;
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (labels, v) in samples {
        ConstGauge::new(v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// Grants and usage per Binding, read from the shared Binding cache at each scrape (a Binding
/// gone from the cache is gone from the series).
#[derive(Default)]
pub(super) struct BindingCollector {
    pub(super) bindings: Arc<std::sync::OnceLock<Store<kvcache_api::KVCachePoolBinding>>>,
}

impl std::fmt::Debug for BindingCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BindingCollector")
    }
}

impl prometheus_client::collector::Collector for BindingCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let Some(store) = self.bindings.get() else {
            return Ok(());
        };
        let mut figures: Vec<(BindingLabels, Option<u64>, Option<u64>)> = store
            .state()
            .iter()
            .map(|b| {
                let (granted, used) = binding_figures(b);
                (BindingLabels::of(b), granted, used)
            })
            .collect();
        figures.sort_by(|a, b| (&a.0.namespace, &a.0.binding).cmp(&(&b.0.namespace, &b.0.binding)));
        let bytes = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        gauge_family(
            &mut encoder,
            (
                "binding_granted_bytes",
                "The grant the store computed for a Binding's domain (status.effectiveQuota)",
            ),
            figures
                .iter()
                .filter_map(|(l, granted, _)| Some((l, bytes(*granted)?))),
        )?;
        gauge_family(
            &mut encoder,
            (
                "binding_used_bytes",
                "Bytes the store reports a Binding's domain holds (status.usage)",
            ),
            figures
                .iter()
                .filter_map(|(l, _, used)| Some((l, bytes(*used)?))),
        )?;
        // QuotaPressure as a number, so the alert fires on the condition's own decision.
        let mut pressure: Vec<(BindingLabels, i64)> = store
            .state()
            .iter()
            .filter_map(|b| Some((BindingLabels::of(b), quota_pressure(b)?)))
            .collect();
        pressure
            .sort_by(|a, b| (&a.0.namespace, &a.0.binding).cmp(&(&b.0.namespace, &b.0.binding)));
        gauge_family(
            &mut encoder,
            (
                "binding_quota_pressure",
                "1 while a Binding's QuotaPressure condition is True (its domain at its grant), 0 while False",
            ),
            pressure.iter().map(|(l, v)| (l, *v)),
        )?;
        // The tenant's view (status.sharedCache, its deployments summed).
        let mut views: Vec<(BindingLabels, kvcache_api::model::SharedCacheStatus)> = store
            .state()
            .iter()
            .filter_map(|b| {
                let view = b.status.as_ref()?.shared_cache.clone()?;
                Some((BindingLabels::of(b), view))
            })
            .collect();
        views.sort_by(|a, b| (&a.0.namespace, &a.0.binding).cmp(&(&b.0.namespace, &b.0.binding)));
        let series: [(&str, &str, SharedCachePick); 3] = [
            (
                "binding_shared_cache_hit_ratio",
                "Share of the prompt tokens a Binding's deployments looked up that the store had, over the window",
                hit_ratio,
            ),
            (
                "binding_prefill_seconds_saved",
                "Prefill seconds the store saved a Binding's deployments over the window, at the price a computed token took in their engines' prefills (absent until that price is settled: PrefillPriced)",
                |c| {
                    c.prefill_seconds_saved
                        .as_deref()
                        .and_then(|r| r.parse().ok())
                },
            ),
            (
                "binding_shared_cache_failed_loads",
                "Loads from the store that failed for a Binding's deployments over the window",
                |c| Some(c.failed_loads as f64),
            ),
        ];
        shared_cache_families(&mut encoder, &views, &series)
    }
}

/// The shared-cache figures per ModelDeployment, read from the shared ModelDeployment cache at
/// each scrape (`status.sharedCache`, which the controller writes from the engines' counters).
#[derive(Default)]
pub(super) struct ModelCollector {
    pub(super) models: Arc<std::sync::OnceLock<Store<kvcache_api::ModelDeployment>>>,
}

impl std::fmt::Debug for ModelCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelCollector")
    }
}

impl prometheus_client::collector::Collector for ModelCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let Some(store) = self.models.get() else {
            return Ok(());
        };
        let mut figures: Vec<(ModelLabels, kvcache_api::model::SharedCacheStatus)> = store
            .state()
            .iter()
            .filter_map(|md| {
                let status = md.status.as_ref()?;
                let cache = status.shared_cache.clone()?;
                let domain = status
                    .kv_cache
                    .as_ref()
                    .and_then(|k| k.domain.as_ref())
                    .map(|d| d.name.clone())
                    .unwrap_or_default();
                Some((
                    ModelLabels {
                        namespace: md.metadata.namespace.clone().unwrap_or_default(),
                        deployment: md.metadata.name.clone().unwrap_or_default(),
                        domain,
                    },
                    cache,
                ))
            })
            .collect();
        figures.sort_by(|a, b| {
            (&a.0.namespace, &a.0.deployment).cmp(&(&b.0.namespace, &b.0.deployment))
        });
        let series: [(&str, &str, SharedCachePick); 7] = [
            (
                "model_shared_cache_hit_ratio",
                "Share of the prompt tokens a ModelDeployment's engines looked up in the store that the store had, over status.sharedCache.window",
                hit_ratio,
            ),
            (
                "model_shared_cache_queried_tokens",
                "Prompt tokens a ModelDeployment's engines looked up in the store over status.sharedCache.window",
                |c| Some(c.queried_tokens as f64),
            ),
            (
                "model_shared_cache_hit_tokens",
                "Prompt tokens the store had for a ModelDeployment's engines over status.sharedCache.window",
                |c| Some(c.hit_tokens as f64),
            ),
            (
                "model_tokens_from_store",
                "Prompt tokens a ModelDeployment's ready engines loaded from the store since each started",
                |c| Some(c.tokens_from_store as f64),
            ),
            (
                "model_shared_cache_loads",
                "Loads from the store a ModelDeployment's engines made over status.sharedCache.window",
                |c| Some(c.loads as f64),
            ),
            (
                "model_shared_cache_failed_loads",
                "Loads from the store that failed (each prompt computed after all) over status.sharedCache.window",
                |c| Some(c.failed_loads as f64),
            ),
            (
                "model_shared_cache_failed_saves",
                "Saves to the store that failed over status.sharedCache.window",
                |c| Some(c.failed_saves as f64),
            ),
        ];
        shared_cache_families(&mut encoder, &figures, &series)
    }
}

/// The latest reading of each backend's master the operator re-exports, by backend name.
pub type StoreReadings = Arc<
    std::sync::Mutex<
        std::collections::BTreeMap<String, Arc<kvcache_render::observe::store_series::StoreSeries>>,
    >,
>;

/// The masters' own series, re-exported from the latest reading of each backend
/// (`kvcache_operator_store_<the master's name>{backend=…}`, [`kvcache_render::observe::store_series`]),
/// and how many were kept and left out. Only the leading replica reads the stores, so only it
/// has any; a backend's series go when a read of its master fails and when it is deleted.
#[derive(Default)]
pub(super) struct StoreCollector {
    pub(super) readings: StoreReadings,
}

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCollector")
    }
}

impl prometheus_client::collector::Collector for StoreCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use kvcache_render::observe::store_series::{BACKEND_LABEL, Exported, merged};
        use prometheus_client::encoding::NoLabelSet;
        use prometheus_client::metrics::MetricType;
        // The Arcs are cloned and the lock let go before anything is written.
        let readings = self
            .readings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let merge = merged(readings.iter().map(|(b, s)| (b.as_str(), s.as_ref())));
        for family in &merge.families {
            let help = if family.help.is_empty() {
                "A series of a backend's master, re-exported by the operator"
            } else {
                family.help
            };
            let kind = match family.kind {
                Exported::Counter => MetricType::Counter,
                Exported::Gauge => MetricType::Gauge,
            };
            let mut descriptor = encoder.encode_descriptor(&family.descriptor, help, None, kind)?;
            for (backend, labels, value) in &family.samples {
                let set = ([(BACKEND_LABEL, *backend)], *labels);
                let mut sample = descriptor.encode_family(&set)?;
                match family.kind {
                    Exported::Counter => {
                        sample.encode_counter::<NoLabelSet, _, f64>(value, None)?
                    }
                    Exported::Gauge => sample.encode_gauge(value)?,
                }
            }
        }
        let written: Vec<(
            &String,
            usize,
            kvcache_render::observe::store_series::Skipped,
        )> = readings
            .iter()
            .map(|(b, s)| {
                let (kept, skipped) = merge.written(b, s);
                (b, kept, skipped)
            })
            .collect();
        let kept: Vec<(BackendLabels, i64)> = written
            .iter()
            .map(|(b, kept, _)| {
                let n = i64::try_from(*kept).unwrap_or(i64::MAX);
                (
                    BackendLabels {
                        backend: (*b).clone(),
                    },
                    n,
                )
            })
            .collect();
        gauge_family(
            &mut encoder,
            (
                "backend_store_series",
                "Series of a backend's master the operator re-exports (kvcache_operator_store_*) from its latest reading; absent while it holds none",
            ),
            kept.iter().map(|(l, n)| (l, *n)),
        )?;
        let skipped: Vec<(SkippedLabels, i64)> = written
            .iter()
            .flat_map(|(b, _, skipped)| {
                skipped.by_reason().map(|(reason, n)| {
                    let labels = SkippedLabels {
                        backend: (*b).clone(),
                        reason: reason.to_owned(),
                    };
                    (labels, i64::try_from(n).unwrap_or(i64::MAX))
                })
            })
            .collect();
        gauge_family(
            &mut encoder,
            (
                "backend_store_series_skipped",
                "Samples of a backend's master's latest reading not re-exported: over_cap (past the cap a backend), histogram, unreadable (lines), clash (a name or series taken)",
            ),
            skipped.iter().map(|(l, n)| (l, *n)),
        )
    }
}
