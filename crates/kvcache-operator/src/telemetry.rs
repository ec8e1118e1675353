//! Logs, metrics (`/metrics`, Prometheus text through `prometheus-client`) and health
//! (`/healthz`, `/readyz`) served beside the controllers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// Installs the log subscriber (`RUST_LOG` filters; `info` by default).
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// Labels of a reconcile outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `kvcachebackend`, …
    pub controller: String,
    /// `ok` or the error's metric label.
    pub result: String,
}

/// Labels of a store read.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Labels of a webhook request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// `validate`, …
    pub webhook: String,
    /// `allowed` or `refused`.
    pub outcome: String,
}

/// Labels of what a server refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `webhook` or `metrics`.
    pub server: String,
    /// Why: `full`, `source_full`, `source_rate`, `not_allowed` (connections); `too_large`,
    /// `too_complex`, `unreadable`, `busy`, `timed_out` (requests).
    pub reason: String,
}

/// Labels of a backend's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
}

/// Labels of a backend's member counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
    /// `ready` (member Pods Ready) or `mounted` (segments the leader lists).
    pub state: String,
}

/// Labels of a Binding's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BindingLabels {
    pub namespace: String,
    /// The Binding's name, without its namespace.
    pub binding: String,
    /// Its domain: the store tenant its deployments write under (`spec.domain.name`).
    pub domain: String,
}

impl BindingLabels {
    fn of(b: &kvcache_api::KVCachePoolBinding) -> Self {
        BindingLabels {
            namespace: b.metadata.namespace.clone().unwrap_or_default(),
            binding: b.metadata.name.clone().unwrap_or_default(),
            domain: kvcache_api::admission::tenant_of(b).to_owned(),
        }
    }
}

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
struct BindingCollector {
    bindings: Arc<std::sync::OnceLock<Store<kvcache_api::KVCachePoolBinding>>>,
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

/// Labels of a ModelDeployment's shared-cache series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub namespace: String,
    /// The ModelDeployment's name, without its namespace.
    pub deployment: String,
    /// The cache domain (the Binding's tenant) it writes under.
    pub domain: String,
}

/// The shared-cache figures per ModelDeployment, read from the shared ModelDeployment cache at
/// each scrape (`status.sharedCache`, which the controller writes from the engines' counters).
#[derive(Default)]
struct ModelCollector {
    models: Arc<std::sync::OnceLock<Store<kvcache_api::ModelDeployment>>>,
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
        std::collections::BTreeMap<String, Arc<kvcache_render::store_series::StoreSeries>>,
    >,
>;

/// Labels of what a backend's re-export left out.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkippedLabels {
    /// Name of the KVCacheBackend (cluster-scoped: no namespace label).
    pub backend: String,
    /// `over_cap`, `histogram`, `unreadable` or `clash` ([`kvcache_render::store_series::Skipped`]).
    pub reason: String,
}

/// The masters' own series, re-exported from the latest reading of each backend
/// (`kvcache_operator_store_<the master's name>{backend=…}`, [`kvcache_render::store_series`]),
/// and how many were kept and left out. Only the leading replica reads the stores, so only it
/// has any; a backend's series go when a read of its master fails and when it is deleted.
#[derive(Default)]
struct StoreCollector {
    readings: StoreReadings,
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
        use kvcache_render::store_series::{BACKEND_LABEL, Exported, merged};
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
        let written: Vec<(&String, usize, kvcache_render::store_series::Skipped)> = readings
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

/// The operator's own series.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by controller and outcome.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Reconcile durations by controller.
    pub reconcile_seconds: Family<ReconcileLabels, Histogram>,
    /// Store reads by backend and result.
    pub store_reads: Family<StoreLabels, Counter>,
    /// Webhook request durations by webhook and outcome.
    pub webhook_seconds: Family<WebhookLabels, Histogram>,
    /// Connections closed unserved, by server and reason.
    pub connections_refused: Family<RefusedLabels, Counter>,
    /// Requests answered without reaching their handler, by server and reason.
    pub requests_refused: Family<RefusedLabels, Counter>,
    /// 1 while this replica leads (runs the controllers), 0 while it stands by.
    pub leader: prometheus_client::metrics::gauge::Gauge,
    /// When the presented webhook certificate expires, seconds since the epoch (0: none).
    pub webhook_certificate_expiry: prometheus_client::metrics::gauge::Gauge,
    /// A backend's capacity as its status reports it (what members registered), bytes.
    pub backend_capacity: Family<BackendLabels, prometheus_client::metrics::gauge::Gauge>,
    /// A backend's member counts: Pods Ready and segments mounted on the leader.
    pub backend_members: Family<MemberLabels, prometheus_client::metrics::gauge::Gauge>,
    /// 1 while a backend's phase is `Degraded`.
    pub backend_degraded: Family<BackendLabels, prometheus_client::metrics::gauge::Gauge>,
    /// Segments on a managed backend's master that no member Pod of it mounted (confirmed).
    pub backend_unknown_segments: Family<BackendLabels, prometheus_client::metrics::gauge::Gauge>,
    /// The Binding cache the per-Binding series are read from (set once it exists).
    pub bindings: Arc<std::sync::OnceLock<Store<kvcache_api::KVCachePoolBinding>>>,
    /// The ModelDeployment cache the per-deployment shared-cache series are read from.
    pub models: Arc<std::sync::OnceLock<Store<kvcache_api::ModelDeployment>>>,
    /// The latest reading of each backend's master, re-exported at each scrape.
    pub store_readings: StoreReadings,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kvcache_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let reconcile_seconds = Family::<ReconcileLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let store_reads = Family::<StoreLabels, Counter>::default();
        let webhook_seconds = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 14))
        });
        let connections_refused = Family::<RefusedLabels, Counter>::default();
        let requests_refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections to the webhook or metrics server closed unserved: full (every slot taken), source_full (the source holds its share), source_rate (the source opens them too fast) or not_allowed (not a source the server serves)",
            connections_refused.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests answered without reaching their handler: too_large (body over the limit), busy (no memory for the body in time), timed_out",
            requests_refused.clone(),
        );
        let leader = prometheus_client::metrics::gauge::Gauge::default();
        let webhook_certificate_expiry = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "When the webhook's presented serving certificate expires, seconds since the epoch (0 while none is presented)",
            webhook_certificate_expiry.clone(),
        );
        let backend_capacity = Family::default();
        let backend_members = Family::default();
        let backend_degraded = Family::default();
        let backend_unknown_segments = Family::default();
        registry.register(
            "backend_capacity_bytes",
            "A backend's capacity as its status reports it: the segments its members registered",
            backend_capacity.clone(),
        );
        registry.register(
            "backend_members",
            "A backend's members by state: ready (member Pods Ready) or mounted (segments the leader lists)",
            backend_members.clone(),
        );
        registry.register(
            "backend_degraded",
            "1 while a backend's phase is Degraded",
            backend_degraded.clone(),
        );
        registry.register(
            "backend_unknown_segments",
            "Segments a managed backend's serving master lists that no member Pod of the backend mounted, once listed past the master's client TTL (status.unknownSegments, condition UnknownSegments)",
            backend_unknown_segments.clone(),
        );
        let collector = BindingCollector::default();
        let bindings = collector.bindings.clone();
        registry.register_collector(Box::new(collector));
        let model_collector = ModelCollector::default();
        let models = model_collector.models.clone();
        registry.register_collector(Box::new(model_collector));
        let store_collector = StoreCollector::default();
        let store_readings = store_collector.readings.clone();
        registry.register_collector(Box::new(store_collector));
        registry.register(
            "leader",
            "Whether this replica leads (runs the controllers): 1, or 0 while it stands by",
            leader.clone(),
        );
        registry.register(
            "webhook_request_duration_seconds",
            "Admission webhook request duration by webhook and outcome",
            webhook_seconds.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles by controller and outcome",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration by controller and outcome",
            reconcile_seconds.clone(),
        );
        registry.register(
            "store_reads",
            "Reads of a store's admin surface by backend and result",
            store_reads.clone(),
        );
        Metrics {
            registry,
            reconciles,
            reconcile_seconds,
            store_reads,
            webhook_seconds,
            connections_refused,
            requests_refused,
            leader,
            webhook_certificate_expiry,
            backend_capacity,
            backend_members,
            backend_degraded,
            backend_unknown_segments,
            bindings,
            models,
            store_readings,
        }
    }
}

impl Metrics {
    /// Records one reconcile.
    pub fn reconciled(&self, controller: &str, result: &str, seconds: f64) {
        let labels = ReconcileLabels {
            controller: controller.to_owned(),
            result: result.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_seconds
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// Records one webhook request.
    pub fn webhook(&self, webhook: &str, outcome: &str, seconds: f64) {
        self.webhook_seconds
            .get_or_create(&WebhookLabels {
                webhook: webhook.to_owned(),
                outcome: outcome.to_owned(),
            })
            .observe(seconds);
    }

    /// Sets a backend's series from the status just written and the member Pods observed.
    pub fn backend(
        &self,
        backend: &str,
        capacity: Option<u64>,
        ready: usize,
        mounted: usize,
        degraded: bool,
    ) {
        let b = BackendLabels {
            backend: backend.to_owned(),
        };
        match capacity {
            Some(c) => {
                self.backend_capacity
                    .get_or_create(&b)
                    .set(i64::try_from(c).unwrap_or(i64::MAX));
            }
            None => {
                self.backend_capacity.remove(&b);
            }
        }
        for (state, n) in [("ready", ready), ("mounted", mounted)] {
            self.backend_members
                .get_or_create(&MemberLabels {
                    backend: backend.to_owned(),
                    state: state.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.backend_degraded
            .get_or_create(&b)
            .set(i64::from(degraded));
    }

    /// Sets how many confirmed unknown segments `backend`'s master lists (`None`: not judged
    /// this pass, the last figure stays).
    pub fn unknown_segments(&self, backend: &str, confirmed: Option<usize>) {
        if let Some(n) = confirmed {
            self.backend_unknown_segments
                .get_or_create(&BackendLabels {
                    backend: backend.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Keeps `series`, the latest reading of `backend`'s master, for re-export; `None` (the
    /// read failed) drops what was kept, so the backend's series go absent.
    pub fn store_series(
        &self,
        backend: &str,
        series: Option<Arc<kvcache_render::store_series::StoreSeries>>,
    ) {
        let mut readings = self
            .store_readings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match series {
            Some(s) => readings.insert(backend.to_owned(), s),
            None => readings.remove(backend),
        };
    }

    /// Drops the store series of a backend whose master is not read (an external backend
    /// without an Admin endpoint, or a deleted one): its re-exported series and its reads'
    /// counts, whose presence says the master is read (`KVCacheStoreMetricsAbsent`).
    pub fn store_not_read(&self, backend: &str) {
        self.store_series(backend, None);
        for result in ["ok", "error"] {
            self.store_reads.remove(&StoreLabels {
                backend: backend.to_owned(),
                result: result.to_owned(),
            });
        }
    }

    /// Drops a deleted backend's series.
    pub fn backend_gone(&self, backend: &str) {
        self.store_not_read(backend);
        let b = BackendLabels {
            backend: backend.to_owned(),
        };
        self.backend_capacity.remove(&b);
        self.backend_degraded.remove(&b);
        self.backend_unknown_segments.remove(&b);
        for state in ["ready", "mounted"] {
            self.backend_members.remove(&MemberLabels {
                backend: backend.to_owned(),
                state: state.to_owned(),
            });
        }
    }

    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl crate::serve::Counts for Metrics {
    fn connection_refused(&self, server: &'static str, why: crate::serve::Refused) {
        self.connections_refused
            .get_or_create(&RefusedLabels {
                server: server.to_owned(),
                reason: why.label().to_owned(),
            })
            .inc();
    }

    fn request_refused(&self, server: &'static str, why: &crate::serve::Early) {
        self.requests_refused
            .get_or_create(&RefusedLabels {
                server: server.to_owned(),
                reason: why.label().to_owned(),
            })
            .inc();
    }
}

/// What `/healthz` and `/readyz` answer.
#[derive(Default)]
pub struct Readiness {
    /// The controllers' caches are synced.
    pub controllers: AtomicBool,
    /// The webhook serves (or none is asked for).
    pub webhook: AtomicBool,
    /// When the presented webhook certificate expires, seconds since the epoch (0: none
    /// presented).
    pub certificate_not_after: std::sync::atomic::AtomicI64,
    /// The loops that ended while the process runs on (the webhook listener, a controller):
    /// each fails the liveness probe, since nothing restarts them but a restart of the process.
    pub ended: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
}

/// The webhook listener's name among [`Readiness::ended`].
pub const WEBHOOK_LISTENER: &str = "the webhook listener";

impl Readiness {
    /// Records that `what` ended.
    pub fn ended(&self, what: &'static str) {
        self.ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(what);
    }

    fn ended_now(&self) -> Vec<&'static str> {
        self.ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

/// Whether the replica is alive as its liveness probe asks: not when a loop that only a restart
/// brings back has ended (`ended`: the webhook listener, a controller), and not when the
/// webhook's presented certificate has expired (`not_after`, seconds since the epoch; 0 when
/// none is presented) at `now`, since then the API server refuses every request the webhook
/// guards and a restart makes the keeper start afresh.
pub fn health(not_after: i64, now: i64, ended: &[&str]) -> Result<(), String> {
    if !ended.is_empty() {
        return Err(format!(
            "{} ended: restart the replica",
            ended.join(" and ")
        ));
    }
    if not_after > 0 && now >= not_after {
        return Err(format!(
            "the webhook's serving certificate expired {} s ago and was not renewed",
            now - not_after
        ));
    }
    Ok(())
}

/// Whether the replica is ready as its readiness probe asks: its caches synced
/// (`controllers`), and the webhook serving: a certificate loaded and trusted (`webhook`) and
/// its listener not ended.
pub fn readiness(controllers: bool, webhook: bool, ended: &[&str]) -> Result<(), &'static str> {
    if !controllers {
        Err("caches not synced yet")
    } else if ended.contains(&WEBHOOK_LISTENER) {
        Err("the webhook listener ended")
    } else if !webhook {
        Err(
            "the webhook has no certificate loaded, or the webhook configurations do not trust it yet",
        )
    } else {
        Ok(())
    }
}

#[derive(Clone)]
struct Context {
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
}

async fn metrics(State(s): State<Context>) -> (StatusCode, String) {
    s.metrics
        .webhook_certificate_expiry
        .set(s.ready.certificate_not_after.load(Ordering::Relaxed));
    match s.metrics.encode() {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn healthz(State(s): State<Context>) -> (StatusCode, String) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let ended = s.ready.ended_now();
    match health(
        s.ready.certificate_not_after.load(Ordering::Relaxed),
        now,
        &ended,
    ) {
        Ok(()) => (StatusCode::OK, "ok".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn readyz(State(s): State<Context>) -> (StatusCode, &'static str) {
    match readiness(
        s.ready.controllers.load(Ordering::Relaxed),
        s.ready.webhook.load(Ordering::Relaxed),
        &s.ready.ended_now(),
    ) {
        Ok(()) => (StatusCode::OK, "ok"),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// The routes of the metrics and health port.
fn router(metrics_: Arc<Metrics>, ready: Arc<Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Context {
            metrics: metrics_,
            ready,
        })
}

/// Serves `/metrics`, `/healthz` and `/readyz` within `bounds` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics_: Arc<Metrics>,
    ready: Arc<Readiness>,
    bounds: crate::serve::Bounds,
) -> std::io::Result<()> {
    let counts: Arc<dyn crate::serve::Counts> = metrics_.clone();
    crate::serve::accept_loop(
        listener,
        router(metrics_, ready),
        crate::serve::Ledger::new(bounds),
        counts,
        "metrics",
        |tcp| async move { Some(tcp) },
        std::future::pending(),
        std::time::Duration::ZERO,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_webhook_certificate_fails_the_liveness_probe() {
        assert_eq!(health(0, 1_000, &[]), Ok(()), "no certificate presented");
        assert_eq!(health(2_000, 1_000, &[]), Ok(()));
        assert_eq!(
            health(1_000, 1_060, &[]),
            Err("the webhook's serving certificate expired 60 s ago and was not renewed".into())
        );
        assert!(
            health(1_000, 1_000, &[]).is_err(),
            "expired at its own second"
        );
    }

    #[test]
    fn an_ended_loop_fails_the_liveness_probe_and_an_ended_listener_readiness() {
        assert_eq!(
            health(0, 1_000, &[WEBHOOK_LISTENER]),
            Err("the webhook listener ended: restart the replica".into())
        );
        assert_eq!(
            health(0, 1_000, &["the ModelDeployment controller"]),
            Err("the ModelDeployment controller ended: restart the replica".into())
        );
        assert_eq!(readiness(true, true, &[]), Ok(()));
        assert_eq!(
            readiness(true, true, &[WEBHOOK_LISTENER]),
            Err("the webhook listener ended"),
            "a loaded certificate does not make an ended listener serve"
        );
        assert!(readiness(true, false, &[]).is_err());
        assert!(readiness(false, true, &[]).is_err());
    }

    /// The store samples (`kvcache_operator_store_*`) of the operator's `/metrics` text, read
    /// back with the exposition reader: (name, backend, value).
    fn store_samples(m: &Metrics) -> Vec<(String, String, f64)> {
        let text = m.encode().expect("encodes");
        let e = kvcache_render::exposition::Exposition::parse(&text);
        assert_eq!(e.unreadable, [], "{text}");
        e.samples
            .into_iter()
            .filter(|s| {
                s.name.starts_with("kvcache_operator_store_") && !s.name.ends_with("reads_total")
            })
            .map(|s| {
                let backend = s
                    .labels
                    .iter()
                    .find(|(k, _)| k == "backend")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                (s.name, backend, s.value)
            })
            .collect()
    }

    #[test]
    fn a_backends_store_series_are_reexported_with_its_name_until_it_is_deleted() {
        let m = Metrics::default();
        let reading = |text: &str| Some(kvcache_render::store::Metrics::parse(text).series);
        m.store_series(
            "dram",
            reading("# HELP master_ping_requests_total Pings\n# TYPE master_ping_requests_total counter\nmaster_ping_requests_total 12\n# TYPE master_key_count gauge\nmaster_key_count 5\nmooncake_tenant_quota_charged_bytes{tenant_id=\"a \\\"b\\\"\"} NaN\n"),
        );
        m.store_series("disk", reading("master_key_count 7\n"));
        let samples = store_samples(&m);
        let find = |name: &str, backend: &str| {
            samples
                .iter()
                .find(|(n, b, _)| n == name && b == backend)
                .map(|s| s.2)
        };
        assert_eq!(
            find("kvcache_operator_store_master_ping_requests_total", "dram"),
            Some(12.0)
        );
        assert_eq!(
            find("kvcache_operator_store_master_key_count", "dram"),
            Some(5.0)
        );
        assert_eq!(
            find("kvcache_operator_store_master_key_count", "disk"),
            Some(7.0)
        );
        assert!(
            find(
                "kvcache_operator_store_mooncake_tenant_quota_charged_bytes",
                "dram"
            )
            .is_some_and(f64::is_nan)
        );
        // One family each, however many backends print it: Prometheus refuses a scrape that
        // describes a family twice.
        let text = m.encode().expect("encodes");
        let described = text
            .lines()
            .filter(|l| *l == "# TYPE kvcache_operator_store_master_key_count gauge")
            .count();
        assert_eq!(described, 1, "{text}");
        // The counts the absent alert reads.
        let e = kvcache_render::exposition::Exposition::parse(&text);
        let kept: Vec<(&str, f64)> = e
            .samples
            .iter()
            .filter(|s| s.name == "kvcache_operator_backend_store_series")
            .map(|s| (s.labels[0].1.as_str(), s.value))
            .collect();
        assert_eq!(kept, [("disk", 1.0), ("dram", 3.0)]);

        // A failed read drops the backend's series; a deleted backend's go too.
        m.store_series("disk", None);
        m.backend_gone("dram");
        assert_eq!(store_samples(&m), []);
        let text = m.encode().expect("encodes");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("kvcache_operator_backend_store_series")),
            "{text}"
        );
    }

    #[test]
    fn a_name_two_families_would_take_is_described_once_and_labels_never_twice() {
        let m = Metrics::default();
        let reading = |text: &str| Some(kvcache_render::store::Metrics::parse(text).series);
        // `foo` and `foo_total` are both `kvcache_operator_store_foo`, in one master and
        // across two; the master's own `backend`, `exported_backend` and `pod` labels.
        m.store_series(
            "a",
            reading("# TYPE foo gauge\nfoo 1\n# TYPE foo_total counter\nfoo_total 2\nx{backend=\"m\",exported_backend=\"n\",pod=\"p\"} 3\n"),
        );
        m.store_series("b", reading("# TYPE foo_total counter\nfoo_total 4\n"));
        let text = m.encode().expect("encodes");
        let e = kvcache_render::exposition::Exposition::parse(&text);
        assert_eq!(e.unreadable, [], "no label named twice: {text}");
        let mut described: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let all = described.len();
        described.sort_unstable();
        described.dedup();
        assert_eq!(described.len(), all, "{text}");
        assert_eq!(
            store_samples(&m)
                .iter()
                .map(|(n, b, v)| (n.as_str(), b.as_str(), *v))
                .collect::<Vec<_>>(),
            [
                ("kvcache_operator_store_foo", "a", 1.0),
                ("kvcache_operator_store_x", "a", 3.0)
            ]
        );
        let x = e
            .samples
            .iter()
            .find(|s| s.name == "kvcache_operator_store_x")
            .expect("x");
        let names: Vec<&str> = x.labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "backend",
                "exported_exported_backend",
                "exported_backend",
                "exported_pod"
            ]
        );
        let skipped = |backend: &str, reason: &str| {
            e.samples
                .iter()
                .find(|s| {
                    s.name == "kvcache_operator_backend_store_series_skipped"
                        && s.labels.contains(&("backend".into(), backend.into()))
                        && s.labels.contains(&("reason".into(), reason.into()))
                })
                .map(|s| s.value)
        };
        assert_eq!(skipped("a", "clash"), Some(1.0), "{text}");
        assert_eq!(skipped("b", "clash"), Some(1.0), "{text}");
        let kept = |backend: &str| {
            e.samples
                .iter()
                .find(|s| {
                    s.name == "kvcache_operator_backend_store_series"
                        && s.labels.contains(&("backend".into(), backend.into()))
                })
                .map(|s| s.value)
        };
        assert_eq!((kept("a"), kept("b")), (Some(2.0), Some(0.0)));
    }

    #[test]
    fn a_backend_whose_master_is_not_read_has_no_reads_counted() {
        let m = Metrics::default();
        let labels = |backend: &str| StoreLabels {
            backend: backend.into(),
            result: "ok".into(),
        };
        m.store_reads.get_or_create(&labels("dram")).inc();
        m.store_reads.get_or_create(&labels("external")).inc();
        m.store_series(
            "external",
            Some(kvcache_render::store::Metrics::parse("master_key_count 1\n").series),
        );
        // Its Admin endpoint removed: the master is no longer read.
        m.store_not_read("external");
        let text = m.encode().expect("encodes");
        let e = kvcache_render::exposition::Exposition::parse(&text);
        let read: Vec<&str> = e
            .samples
            .iter()
            .filter(|s| s.name == "kvcache_operator_store_reads_total")
            .filter_map(|s| s.labels.iter().find(|(k, _)| k == "backend"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(read, ["dram"], "{text}");
        assert_eq!(store_samples(&m), []);
        m.backend_gone("dram");
        let text = m.encode().expect("encodes");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("kvcache_operator_store_reads_total")),
            "{text}"
        );
    }

    /// The metrics port on a loopback listener with `bounds`; its address.
    async fn metrics_port(
        bounds: crate::serve::Bounds,
    ) -> (std::net::SocketAddr, Arc<Metrics>, Arc<Readiness>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let (metrics, ready) = (Arc::new(Metrics::default()), Arc::new(Readiness::default()));
        tokio::spawn(serve(listener, metrics.clone(), ready.clone(), bounds));
        (addr, metrics, ready)
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("writes");
        let mut text = String::new();
        c.read_to_string(&mut text).await.expect("reads");
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    #[tokio::test]
    async fn a_listener_that_ended_fails_healthz_over_http() {
        let (addr, _, ready) = metrics_port(crate::serve::Bounds::METRICS).await;
        assert_eq!(get(addr, "/healthz").await.0, 200);
        ready.ended(WEBHOOK_LISTENER);
        let (status, text) = get(addr, "/healthz").await;
        assert_eq!(status, 503, "{text}");
        assert!(
            text.ends_with("the webhook listener ended: restart the replica"),
            "{text}"
        );
        assert_eq!(get(addr, "/readyz").await.0, 503);
    }

    #[tokio::test]
    async fn slow_clients_cannot_starve_the_probes() {
        use tokio::io::AsyncWriteExt;
        let bounds = crate::serve::Bounds {
            connections: 8,
            per_source: 4,
            header_read: std::time::Duration::from_millis(300),
            ..crate::serve::Bounds::METRICS
        };
        let (addr, metrics, _) = metrics_port(bounds).await;
        // One source opens its share and more, each sending half a request line and stopping.
        let mut slow = Vec::new();
        for _ in 0..6 {
            let mut c = tokio::net::TcpStream::connect(addr)
                .await
                .expect("connects");
            let _ = c.write_all(b"GET /metr").await;
            slow.push(c);
        }
        // Another source (127.0.0.2 is loopback too) is still served at once.
        let other = tokio::net::TcpSocket::new_v4().expect("a socket");
        other
            .bind("127.0.0.2:0".parse().expect("an address"))
            .expect("binds");
        let mut c = other.connect(addr).await.expect("connects");
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("writes");
        let mut text = String::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::io::AsyncReadExt::read_to_string(&mut c, &mut text),
        )
        .await
        .expect("another source is answered while one holds its share")
        .expect("reads");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let refused = metrics
            .connections_refused
            .get_or_create(&RefusedLabels {
                server: "metrics".into(),
                reason: "source_full".into(),
            })
            .get();
        assert_eq!(
            refused, 2,
            "the two past the source's share of 4 were closed"
        );
    }
}
