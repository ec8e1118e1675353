//! The elector's HTTP surface: `/readyz` is 200 only on the serving leader, `/healthz` always,
//! and `/identity` names the leader elector (`crate::identity`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

use crate::identity::{self, LeaderIdentity};

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

/// What `/identity` answers: the Lease and identity, with whether it leads now.
#[derive(Clone)]
pub struct Named {
    /// The Lease, its namespace and this elector's identity (`leading` is read from `leading`).
    pub who: LeaderIdentity,
    /// Whether this elector holds the Lease now.
    pub leading: watch::Receiver<bool>,
}

async fn named(State(n): State<Arc<Named>>) -> axum::Json<LeaderIdentity> {
    axum::Json(LeaderIdentity {
        leading: *n.leading.borrow(),
        ..n.who.clone()
    })
}

/// Serves `/readyz`, `/healthz` and, for a leader elector, `/identity` on `addr` until the
/// process ends.
pub async fn serve(
    addr: SocketAddr,
    rx: watch::Receiver<Readiness>,
    named_as: Option<Named>,
) -> std::io::Result<()> {
    let mut app = Router::new()
        .route("/readyz", get(readyz))
        .route("/healthz", get(healthz))
        .with_state(Arc::new(rx));
    if let Some(n) = named_as {
        app = app.merge(
            Router::new()
                .route(identity::PATH, get(named))
                .with_state(Arc::new(n)),
        );
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
