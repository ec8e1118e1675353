//! The elector's HTTP surface: `/readyz` is 200 only on the serving leader, `/healthz` always.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

/// Whether this process should receive traffic, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Ready.
    pub ready: bool,
    /// What `/readyz` says.
    pub reason: String,
}

impl Readiness {
    /// Not ready, because `reason`.
    pub fn not(reason: impl Into<String>) -> Self {
        Readiness {
            ready: false,
            reason: reason.into(),
        }
    }
}

async fn readyz(State(rx): State<Arc<watch::Receiver<Readiness>>>) -> (StatusCode, String) {
    let r = rx.borrow().clone();
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{}\n", r.reason))
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Serves `/readyz` and `/healthz` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, rx: watch::Receiver<Readiness>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/readyz", get(readyz))
        .route("/healthz", get(healthz))
        .with_state(Arc::new(rx));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
