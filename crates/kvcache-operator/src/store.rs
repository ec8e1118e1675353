//! Reading a store's admin surface (`/health`, `/metrics`, `/get_segments_detail`): three
//! independent reads with a short timeout, no redirects followed. The answers are parsed by
//! `kvcache-render::store`; an unreachable store is a value, never a panic.

use std::time::Duration;

use kvcache_render::store::{Health, Metrics, ReadError, Segment, StoreReading};

/// How long one read may take.
const TIMEOUT: Duration = Duration::from_millis(1500);

/// A client with the read timeout, following no redirect, reading error statuses as answers.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into()
}

fn get(url: &str) -> Result<String, ReadError> {
    let agent = agent();
    let mut response = agent.get(url).call().map_err(|e| ReadError::Unreachable {
        url: url.to_owned(),
        message: e.to_string(),
    })?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(ReadError::Status {
            url: url.to_owned(),
            status,
        });
    }
    response
        .body_mut()
        .read_to_string()
        .map_err(|e| ReadError::Unreadable {
            url: url.to_owned(),
            message: e.to_string(),
        })
}

/// A GET of `url` with the read timeout: the body of a 200 answer, or why there is none.
pub async fn fetch(url: String) -> Result<String, ReadError> {
    let u = url.clone();
    tokio::task::spawn_blocking(move || get(&u))
        .await
        .unwrap_or_else(|e| {
            Err(ReadError::Unreachable {
                url,
                message: e.to_string(),
            })
        })
}

/// Reads the store whose admin surface is at `admin` (`host:port`).
pub async fn read(admin: &str) -> StoreReading {
    let base = format!("http://{admin}");
    let (health, metrics, segments) = tokio::join!(
        fetch(format!("{base}/health")),
        fetch(format!("{base}/metrics")),
        fetch(format!("{base}/get_segments_detail")),
    );
    StoreReading {
        health: health.and_then(|b| Health::parse(&format!("{base}/health"), &b)),
        metrics: metrics.map(|t| Metrics::parse(&t)),
        segments: segments
            .and_then(|b| Segment::parse_all(&format!("{base}/get_segments_detail"), &b)),
    }
}

/// One call to the tenant ledger (`/api/v1/tenant_quotas`) at `admin`: the HTTP status and body,
/// or why no answer came.
pub async fn ledger(
    admin: &str,
    req: &kvcache_quota::admin::Request,
) -> Result<(u16, String), ReadError> {
    let url = format!("http://{admin}{}", req.path());
    let (method, body) = (req.method(), req.body());
    let u = url.clone();
    tokio::task::spawn_blocking(move || {
        let agent = agent();
        let sent = match (method, body) {
            ("PUT", Some(body)) => agent
                .put(&u)
                .header("Content-Type", "application/json")
                .send(body),
            ("DELETE", _) => agent.delete(&u).call(),
            _ => agent.get(&u).call(),
        };
        let mut response = sent.map_err(|e| ReadError::Unreachable {
            url: u.clone(),
            message: e.to_string(),
        })?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| ReadError::Unreadable {
                url: u.clone(),
                message: e.to_string(),
            })?;
        Ok((status, text))
    })
    .await
    .unwrap_or_else(|e| {
        Err(ReadError::Unreachable {
            url,
            message: e.to_string(),
        })
    })
}

/// `master_total_capacity_bytes` from the store at `admin`.
pub async fn capacity(admin: &str) -> Option<u64> {
    let text = fetch(format!("http://{admin}/metrics")).await.ok()?;
    Metrics::parse(&text).memory_bytes
}
