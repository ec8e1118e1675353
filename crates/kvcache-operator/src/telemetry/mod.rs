//! Logs, metrics (`/metrics`, Prometheus text through `prometheus-client`) and health
//! (`/healthz`, `/readyz`) served beside the controllers.
//!
//! The series are [`Metrics`] (`metrics.rs`, with their label sets in `labels.rs` and the
//! per-object series read from the caches at each scrape in `collectors.rs`); what the probes
//! answer is `probes.rs`; the port serving them is here.

mod collectors;
mod labels;
mod metrics;
mod probes;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

// The servers' tests (here and `webhook/tls.rs`) read the refusals by their labels.
#[cfg(test)]
pub use labels::RefusedLabels;
pub use labels::StoreLabels;
pub use metrics::Metrics;
pub use probes::{Readiness, WEBHOOK_LISTENER, health, readiness};

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
