//! Logs, metrics (`/metrics`, Prometheus text through `prometheus-client`) and health
//! (`/healthz`, `/readyz`) served beside the controllers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
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
    /// The backend.
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
    /// 1 while this replica leads (runs the controllers), 0 while it stands by.
    pub leader: prometheus_client::metrics::gauge::Gauge,
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
        let leader = prometheus_client::metrics::gauge::Gauge::default();
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
            leader,
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

    /// Records a successful reconcile with its duration (failures are counted by the
    /// controller's error policy).
    pub fn succeeded<T, E>(
        &self,
        controller: &str,
        started: std::time::Instant,
        result: &Result<T, E>,
    ) {
        if result.is_ok() {
            self.reconciled(controller, "ok", started.elapsed().as_secs_f64());
        }
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

    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// What `/readyz` answers.
#[derive(Default)]
pub struct Readiness {
    /// The controllers' caches are synced.
    pub controllers: AtomicBool,
    /// The webhook serves (or none is asked for).
    pub webhook: AtomicBool,
}

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
}

async fn metrics(State(s): State<Shared>) -> (StatusCode, String) {
    match s.metrics.encode() {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn readyz(State(s): State<Shared>) -> (StatusCode, &'static str) {
    if !s.ready.controllers.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    } else if !s.ready.webhook.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the webhook has no certificate yet",
        )
    } else {
        (StatusCode::OK, "ok")
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    metrics_: Arc<Metrics>,
    ready: Arc<Readiness>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Shared {
            metrics: metrics_,
            ready,
        });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
