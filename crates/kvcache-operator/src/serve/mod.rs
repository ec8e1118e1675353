//! Bounded HTTP serving, the same for the webhook (over TLS) and the metrics and health port
//! (plain): what one request, one connection, one source address and all clients together may
//! hold of the process, so that no client can take the slots or the memory the API server's
//! reviews and the kubelet's probes need.
//!
//! - connections: a cap in all and a smaller one per source address, and a rate of new ones per
//!   source (a burst, then so many a second: `governor`'s keyed limiter); a connection past any
//!   of them is accepted and closed at once (counted), never left in the backlog in front of
//!   the API server's, and never costs a TLS handshake;
//! - a request: its headers within `header_read`, the whole of it (waiting for memory, reading
//!   the body, answering) within `request`, a body no larger than `body`, HTTP/2 streams per
//!   connection at most `streams` with small flow-control windows (a peer cannot make the
//!   server buffer more than a window per stream);
//! - a connection that makes no progress (no byte read or written) for `idle` is closed: one
//!   that never sends its first byte, a client that stops reading its answer, an idle
//!   keep-alive;
//! - memory: a request reserves its declared body and a base for its headers from a budget in
//!   all and from its source's share before its body is read; once read, what decoding it will
//!   cost ([`decode_cost`](bounds::decode_cost): its bytes and its JSON values) is reserved too, or the request is
//!   refused 413 when that is more than one source may hold. A request that cannot reserve
//!   within its time is answered 503.
//!
//! The decisions (which connection is refused, what a request reserves, which answer a refused
//! request gets) are plain functions and a small ledger, tested without sockets.
//!
//! The decisions are in `bounds.rs`, the ledger in `ledger.rs`; the connection's progress
//! deadline is `progress.rs`.

mod bounds;
mod ledger;
mod progress;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt;

pub use bounds::{Bounds, Early, Refused, decoding, reservation};
pub use ledger::{Ledger, Slot};
use progress::Progress;

/// What the server reports of what it refused.
pub trait Counts: Send + Sync + 'static {
    /// A connection closed unserved.
    fn connection_refused(&self, server: &'static str, why: Refused);
    /// A request answered without reaching its handler.
    fn request_refused(&self, server: &'static str, why: &Early);
}

/// Serves `router` on one accepted connection (plain or TLS) within `bounds`, holding `slot`
/// until it closes.
pub async fn connection<I>(
    io: I,
    router: Router,
    ledger: Arc<Ledger>,
    slot: Slot,
    counts: Arc<dyn Counts>,
    server: &'static str,
    watcher: hyper_util::server::graceful::Watcher,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let bounds = ledger.bounds();
    let slot = Arc::new(slot);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let (router, ledger, slot, counts) =
            (router.clone(), ledger.clone(), slot.clone(), counts.clone());
        async move {
            let answer = bounded(req, router, &ledger, &slot).await;
            Ok::<_, std::convert::Infallible>(match answer {
                Ok(response) => response,
                Err(early) => {
                    counts.request_refused(server, &early);
                    plain(early.answer())
                }
            })
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read)
        .max_buf_size(HTTP1_BUFFER);
    // No keep-alive pings: a connection quiet for `idle` is closed by `Progress` (pings would
    // keep an idle connection open for ever).
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(bounds.streams)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_header_list_size(H2_HEADER_LIST)
        .max_send_buf_size(H2_STREAM_WINDOW as usize);
    let io = Progress::new(io, bounds.idle);
    let connection = builder
        .serve_connection(TokioIo::new(io), service)
        .into_owned();
    watcher.watch(connection).await
}

/// The HTTP/1 read buffer's cap: headers must fit in it, a body is read through it.
const HTTP1_BUFFER: usize = 64 << 10;
/// HTTP/2 flow-control windows: what a peer may send before the server reads it.
const H2_STREAM_WINDOW: u32 = 64 << 10;
const H2_CONNECTION_WINDOW: u32 = 256 << 10;
const H2_HEADER_LIST: u32 = 16 << 10;

/// One request within the bounds: its declared body checked, its memory reserved, its body
/// capped, the whole of it timed.
async fn bounded(
    req: Request<hyper::body::Incoming>,
    router: Router,
    ledger: &Ledger,
    slot: &Slot,
) -> Result<Response<Body>, Early> {
    let bounds = ledger.bounds();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let kib = reservation(&bounds, declared)?;
    let deadline = tokio::time::Instant::now() + bounds.request;
    // Memory first: a request that gets none within its time is told the server is busy,
    // before any of its body is read.
    let held = tokio::time::timeout_at(deadline, ledger.reserve(slot, kib))
        .await
        .map_err(|_| Early::Busy)?;
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout_at(
        deadline,
        http_body_util::BodyExt::collect(http_body_util::Limited::new(body, bounds.body)),
    )
    .await
    .map_err(|_| Early::TimedOut(bounds.request))?;
    let body = match read {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Early::TooLarge {
                declared: declared.unwrap_or(bounds.body as u64 + 1),
                limit: bounds.body,
            });
        }
        Err(_) => return Err(Early::Unreadable),
    };
    // Then what decoding it costs, counted before it is decoded.
    let more = decoding(&bounds, &body, kib)?;
    let decoding = if more > 0 {
        Some(
            tokio::time::timeout_at(deadline, ledger.reserve(slot, more))
                .await
                .map_err(|_| Early::Busy)?,
        )
    } else {
        None
    };
    let answered = tokio::time::timeout_at(
        deadline,
        router.oneshot(Request::from_parts(parts, Body::from(body))),
    )
    .await;
    drop((held, decoding));
    match answered {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(never)) => match never {},
        Err(_) => Err(Early::TimedOut(bounds.request)),
    }
}

fn plain((status, text): (StatusCode, String)) -> Response<Body> {
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    // Whatever of the body is still unread stays so: the connection is not reused.
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// The source address of a peer, IPv4-mapped IPv6 read as IPv4 (one client, one source).
pub fn source(peer: std::net::SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Accepts connections on `listener` until `stop`, each within the ledger's bounds, wrapping
/// each in `wrap` (TLS, or none) and serving `router` on it; then drains for at most `drain`.
/// Returns when `stop` resolves (`Ok`) or the listener fails for good.
#[allow(clippy::too_many_arguments)]
pub async fn accept_loop<W, F, I>(
    listener: tokio::net::TcpListener,
    router: Router,
    ledger: Arc<Ledger>,
    counts: Arc<dyn Counts>,
    server: &'static str,
    wrap: W,
    stop: impl std::future::Future<Output = ()> + Send,
    drain: Duration,
) -> std::io::Result<()>
where
    W: Fn(tokio::net::TcpStream) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Option<I>> + Send + 'static,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The body limit is `Limited` around each body (see `bounded`); axum's own default (2 MB)
    // would refuse a review the bounds admit.
    let router = router.layer(axum::extract::DefaultBodyLimit::disable());
    let wrap = Arc::new(wrap);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    let mut failures = 0u32;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => { failures = 0; c }
                // A connection reset before it was accepted is that connection's problem.
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) => continue,
                Err(e) => {
                    // Out of file descriptors or memory: back off rather than spin; a listener
                    // that keeps failing has ended.
                    failures += 1;
                    tracing::warn!(server, error = %e, failures, "accepting a connection");
                    if failures >= ACCEPT_FAILURES {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let slot = match ledger.enter(source(peer)) {
            Ok(s) => s,
            Err(why) => {
                tracing::debug!(server, %peer, reason = why.label(), "connection refused");
                counts.connection_refused(server, why);
                drop(tcp);
                continue;
            }
        };
        // Answers are small writes: without this, Nagle's algorithm holds each one back until
        // the peer acknowledges the previous segment.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY");
        }
        let (router, ledger, counts, wrap, watcher) = (
            router.clone(),
            ledger.clone(),
            counts.clone(),
            wrap.clone(),
            graceful.watcher(),
        );
        tokio::spawn(async move {
            let Some(io) = wrap(tcp).await else {
                return;
            };
            if let Err(e) = connection(io, router, ledger, slot, counts, server, watcher).await {
                tracing::debug!(server, %peer, error = %e, "connection ended");
            }
        });
    }
    // No new connections; the requests in flight are answered and their connections closed
    // (HTTP/2 GOAWAY, HTTP/1 after the response), within `drain`.
    drop(listener);
    let open = ledger.open();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open,
            "{server} connections still open after the drain; closing them"
        );
    } else {
        tracing::info!(open, "{server} drained");
    }
    Ok(())
}

/// Accept failures in a row after which the listener counts as ended.
const ACCEPT_FAILURES: u32 = 100;
