//! The operator's own series and their registry.

use std::sync::Arc;

use kube::runtime::reflector::Store;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::collectors::{BindingCollector, ModelCollector, StoreCollector, StoreReadings};
use super::labels::{
    BackendLabels, MemberLabels, ReconcileLabels, RefusedLabels, StoreLabels, WebhookLabels,
};

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
        let mut metrics = Metrics {
            registry: Registry::with_prefix("kvcache_operator"),
            reconciles: Family::<ReconcileLabels, Counter>::default(),
            reconcile_seconds: Family::<ReconcileLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 14))
            }),
            store_reads: Family::<StoreLabels, Counter>::default(),
            webhook_seconds: Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 14))
            }),
            connections_refused: Family::<RefusedLabels, Counter>::default(),
            requests_refused: Family::<RefusedLabels, Counter>::default(),
            leader: prometheus_client::metrics::gauge::Gauge::default(),
            webhook_certificate_expiry: prometheus_client::metrics::gauge::Gauge::default(),
            backend_capacity: Family::default(),
            backend_members: Family::default(),
            backend_degraded: Family::default(),
            backend_unknown_segments: Family::default(),
            bindings: Arc::default(),
            models: Arc::default(),
            store_readings: StoreReadings::default(),
        };
        metrics.register();
        metrics
    }
}

impl Metrics {
    /// Registers every series and every collector with the registry.
    fn register(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "connections_refused",
            "Connections to the webhook or metrics server closed unserved: full (every slot taken), source_full (the source holds its share), source_rate (the source opens them too fast) or not_allowed (not a source the server serves)",
            self.connections_refused.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests answered without reaching their handler: too_large (body over the limit), busy (no memory for the body in time), timed_out",
            self.requests_refused.clone(),
        );
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "When the webhook's presented serving certificate expires, seconds since the epoch (0 while none is presented)",
            self.webhook_certificate_expiry.clone(),
        );
        registry.register(
            "backend_capacity_bytes",
            "A backend's capacity as its status reports it: the segments its members registered",
            self.backend_capacity.clone(),
        );
        registry.register(
            "backend_members",
            "A backend's members by state: ready (member Pods Ready) or mounted (segments the leader lists)",
            self.backend_members.clone(),
        );
        registry.register(
            "backend_degraded",
            "1 while a backend's phase is Degraded",
            self.backend_degraded.clone(),
        );
        registry.register(
            "backend_unknown_segments",
            "Segments a managed backend's serving master lists that no member Pod of the backend mounted, once listed past the master's client TTL (status.unknownSegments, condition UnknownSegments)",
            self.backend_unknown_segments.clone(),
        );
        registry.register_collector(Box::new(BindingCollector {
            bindings: self.bindings.clone(),
        }));
        registry.register_collector(Box::new(ModelCollector {
            models: self.models.clone(),
        }));
        registry.register_collector(Box::new(StoreCollector {
            readings: self.store_readings.clone(),
        }));
        registry.register(
            "leader",
            "Whether this replica leads (runs the controllers): 1, or 0 while it stands by",
            self.leader.clone(),
        );
        registry.register(
            "webhook_request_duration_seconds",
            "Admission webhook request duration by webhook and outcome",
            self.webhook_seconds.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles by controller and outcome",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration by controller and outcome",
            self.reconcile_seconds.clone(),
        );
        registry.register(
            "store_reads",
            "Reads of a store's admin surface by backend and result",
            self.store_reads.clone(),
        );
    }

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
        series: Option<Arc<kvcache_render::observe::store_series::StoreSeries>>,
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

    pub(super) fn encode(&self) -> Result<String, std::fmt::Error> {
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
