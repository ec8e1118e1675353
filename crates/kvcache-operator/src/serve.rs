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
//!   cost ([`decode_cost`]: its bytes and its JSON values) is reserved too, or the request is
//!   refused 413 when that is more than one source may hold. A request that cannot reserve
//!   within its time is answered 503.
//!
//! The decisions (which connection is refused, what a request reserves, which answer a refused
//! request gets) are plain functions and a small ledger, tested without sockets.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// What decoding a body costs in memory per byte of it: the bytes read, the strings of the
/// decoded review, and the copy kube's `DynamicObject` buffers (`#[serde(flatten)]`).
pub const BYTE_COST: usize = 3;

/// What decoding costs per JSON value on top: a `serde_json::Value` is 32 bytes, a map entry
/// more, and `#[serde(flatten)]` holds each value once more while it decodes. A 4 MiB review of
/// `[0,0,…]` (2 million values) measured 131 MiB decoded: 65 bytes a value.
pub const VALUE_COST: usize = 96;

/// What every request reserves at least: its headers (HTTP/2's list capped at 16 KiB) and its
/// state.
pub const REQUEST_BASE: usize = 16 << 10;

/// The largest request body the webhook reads. The API server refuses a request body over
/// 3 MiB, and etcd stores no object over 1.5 MiB (its default `--max-request-bytes`): the
/// review of an UPDATE carries the new object and the stored one, and a few KiB of envelope
/// (user, kind, options) beside them, so two 1.5 MiB objects and the envelope fit with room.
pub const REVIEW_BODY_LIMIT: usize = 4 << 20;

/// What decoding a body will cost, counted without decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeCost {
    /// The JSON values it holds (each `,` `:` `[` `{` outside a string starts one more).
    pub values: usize,
    /// Bytes decoding it may hold: [`BYTE_COST`] a byte and [`VALUE_COST`] a value.
    pub bytes: usize,
}

/// Counts what decoding `body` as JSON will cost: one pass, no allocation.
pub fn decode_cost(body: &[u8]) -> DecodeCost {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b':' | b'[' | b'{' => values += 1,
                _ => {}
            }
        }
    }
    DecodeCost {
        values,
        bytes: body
            .len()
            .saturating_mul(BYTE_COST)
            .saturating_add(values.saturating_mul(VALUE_COST)),
    }
}

/// New connections one source may open: `burst` at once, then `per_second`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Connections a second, once the burst is spent.
    pub per_second: u32,
    /// Connections at once.
    pub burst: u32,
}

/// What one server lets clients hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// From the connection's accept to the TLS handshake's end (TLS servers only).
    pub handshake: Duration,
    /// From a request's first byte to its last header (HTTP/1); an HTTP/2 connection that
    /// stops answering pings within it is closed.
    pub header_read: Duration,
    /// From a request's headers to its answer: waiting for memory, reading the body, judging.
    pub request: Duration,
    /// The largest request body, in bytes.
    pub body: usize,
    /// Connections open at once, from all sources.
    pub connections: usize,
    /// Connections open at once from one source address (at most half of `connections`).
    pub per_source: usize,
    /// New connections from one source address: a client that opens a connection for each
    /// request (each a TLS handshake, the costliest thing a forged review makes the server do)
    /// is held to this rate; a client that keeps its connections open, as the API server and
    /// Prometheus do, never meets it.
    pub source_rate: Rate,
    /// Concurrent HTTP/2 streams on one connection.
    pub streams: u32,
    /// Bytes that requests, their bodies and their decoding may hold at once, from all
    /// sources; one source may hold a quarter of it.
    pub memory: usize,
    /// A connection with no byte read or written for this long is closed (longer than
    /// `request`, so no request in flight is cut by it).
    pub idle: Duration,
}

impl Bounds {
    /// The webhook's: the API server sends a review within its own 10 s timeout (the
    /// configurations' `timeoutSeconds`), over HTTP/2 a few connections per API server, over
    /// HTTP/1 up to one per review in flight: one source may hold half the connections, so an
    /// API server keeps 64 however busy and no one other source can take them all. 128
    /// connections of at most ~0.4 MiB of buffers each (TLS records, the HTTP/1 read buffer
    /// or the HTTP/2 connection window, which bounds all its streams together) and 96 MiB of
    /// requests stay inside the container's 256 Mi limit beside the caches (README "Admission
    /// under load").
    pub const WEBHOOK: Bounds = Bounds {
        handshake: Duration::from_secs(10),
        header_read: Duration::from_secs(10),
        request: Duration::from_secs(10),
        body: REVIEW_BODY_LIMIT,
        connections: 128,
        per_source: 64,
        source_rate: Rate {
            per_second: 32,
            burst: 64,
        },
        streams: 8,
        memory: 96 << 20,
        idle: Duration::from_secs(20),
    };

    /// The metrics and health port's: Prometheus and the kubelet send bodiless GETs, one or
    /// two at a time each.
    pub const METRICS: Bounds = Bounds {
        handshake: Duration::from_secs(10),
        header_read: Duration::from_secs(5),
        request: Duration::from_secs(10),
        body: 16 << 10,
        connections: 32,
        per_source: 16,
        source_rate: Rate {
            per_second: 8,
            burst: 16,
        },
        streams: 4,
        memory: 2 << 20,
        idle: Duration::from_secs(15),
    };

    /// What one source may hold of [`Bounds::memory`].
    pub fn source_memory(&self) -> usize {
        self.memory / 4
    }
}

/// Why a connection was closed unserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `connections` are open already.
    Full,
    /// Its source holds `per_source` connections already.
    SourceFull,
    /// Its source is not among the sources this server is told to serve (the webhook's: the
    /// control plane's addresses, when the installation names them).
    NotAllowed,
    /// Its source opened more than `source_rate` allows.
    TooFast,
}

impl Refused {
    /// The `reason` label of `kvcache_operator_connections_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refused::Full => "full",
            Refused::SourceFull => "source_full",
            Refused::NotAllowed => "not_allowed",
            Refused::TooFast => "source_rate",
        }
    }
}

/// Whether a new connection from a source holding `from_source` connections, with `open` in
/// all, is served; `allowed`: whether its source is one the server serves.
pub fn admit_connection(
    bounds: &Bounds,
    open: usize,
    from_source: usize,
    allowed: bool,
) -> Result<(), Refused> {
    if !allowed {
        Err(Refused::NotAllowed)
    } else if open >= bounds.connections {
        Err(Refused::Full)
    } else if from_source >= bounds.per_source {
        Err(Refused::SourceFull)
    } else {
        Ok(())
    }
}

/// What a request reserves of the memory budget before its body is read, in KiB (the
/// semaphores' unit), or the answer it gets at once: 413 when it declares a body over the
/// limit. It reserves its declared body and [`REQUEST_BASE`]; a body without a declared length
/// reserves the limit.
pub fn reservation(bounds: &Bounds, declared: Option<u64>) -> Result<u32, Early> {
    let length = match declared {
        Some(n) if n > bounds.body as u64 => {
            return Err(Early::TooLarge {
                declared: n,
                limit: bounds.body,
            });
        }
        Some(n) => usize::try_from(n).unwrap_or(bounds.body),
        None => bounds.body,
    };
    Ok(to_kib(length.saturating_add(REQUEST_BASE)))
}

/// What a request whose body was read reserves on top of [`reservation`]'s `reserved` KiB to
/// decode it, or 413 when decoding it would take more than one source may hold.
pub fn decoding(bounds: &Bounds, body: &[u8], reserved: u32) -> Result<u32, Early> {
    let cost = decode_cost(body);
    let total = cost.bytes.saturating_add(REQUEST_BASE);
    if total > bounds.source_memory() {
        return Err(Early::TooComplex {
            values: cost.values,
            cost: total,
            share: bounds.source_memory(),
        });
    }
    Ok(to_kib(total).saturating_sub(reserved))
}

fn to_kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// An answer given without the request reaching its handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Early {
    /// The declared body is over the limit: 413.
    TooLarge { declared: u64, limit: usize },
    /// Decoding the body would cost more than one source may hold: 413.
    TooComplex {
        values: usize,
        cost: usize,
        share: usize,
    },
    /// The body could not be read to its end (the client reset the stream or sent a malformed
    /// body): 400.
    Unreadable,
    /// No memory could be reserved for the body within the request's time: 503.
    Busy,
    /// The request was not read and answered within the request bound: 408.
    TimedOut(Duration),
}

impl Early {
    /// The status and the text the client reads.
    pub fn answer(&self) -> (StatusCode, String) {
        match self {
            Early::TooLarge { declared, limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "a request body of {declared} bytes is over this server's limit of {limit} bytes"
                ),
            ),
            Early::TooComplex {
                values,
                cost,
                share,
            } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "a request body of {values} JSON values would take {} MiB to decode, over the {} MiB one source may hold",
                    cost >> 20,
                    share >> 20
                ),
            ),
            Early::Unreadable => (
                StatusCode::BAD_REQUEST,
                "the request body could not be read to its end".into(),
            ),
            Early::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is reading as many request bodies as its memory allows: retry".into(),
            ),
            Early::TimedOut(d) => (
                StatusCode::REQUEST_TIMEOUT,
                format!("the request was not read and answered within {d:?}"),
            ),
        }
    }

    /// The `reason` label of `kvcache_operator_requests_refused_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Early::TooLarge { .. } => "too_large",
            Early::TooComplex { .. } => "too_complex",
            Early::Unreadable => "unreadable",
            Early::Busy => "busy",
            Early::TimedOut(_) => "timed_out",
        }
    }
}

/// The connections and memory held per source, and in all.
pub struct Ledger {
    bounds: Bounds,
    /// The sources served; empty: every source.
    allowed: Vec<ipnet::IpNet>,
    memory: Arc<Semaphore>,
    state: Mutex<State>,
    /// New connections per source (sources it no longer tells apart from new ones are
    /// forgotten once it remembers [`SOURCES_REMEMBERED`]).
    rate: governor::DefaultKeyedRateLimiter<IpAddr>,
}

/// Sources the connection rate remembers before it forgets those back at a full burst.
const SOURCES_REMEMBERED: usize = 4096;

/// `governor`'s quota for a [`Rate`] (a zero reads as one).
fn quota(rate: Rate) -> governor::Quota {
    let at_least_one = |n: u32| std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
    governor::Quota::per_second(at_least_one(rate.per_second)).allow_burst(at_least_one(rate.burst))
}

#[derive(Default)]
struct State {
    open: usize,
    sources: HashMap<IpAddr, Source>,
}

struct Source {
    open: usize,
    memory: Arc<Semaphore>,
}

/// A served connection's place in the [`Ledger`], given back when dropped.
pub struct Slot {
    ledger: Arc<Ledger>,
    source: IpAddr,
    memory: Arc<Semaphore>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.ledger.lock();
        state.open = state.open.saturating_sub(1);
        if let Some(s) = state.sources.get_mut(&self.source) {
            s.open = s.open.saturating_sub(1);
            if s.open == 0 {
                state.sources.remove(&self.source);
            }
        }
    }
}

/// Memory a request holds while it is read and answered.
pub struct Held {
    _all: OwnedSemaphorePermit,
    _source: OwnedSemaphorePermit,
}

impl Ledger {
    /// An empty ledger for a server with `bounds` serving every source.
    pub fn new(bounds: Bounds) -> Arc<Self> {
        Self::serving(bounds, Vec::new())
    }

    /// An empty ledger for a server with `bounds` serving only the sources in `allowed` (every
    /// source when it is empty).
    pub fn serving(bounds: Bounds, allowed: Vec<ipnet::IpNet>) -> Arc<Self> {
        Arc::new(Ledger {
            bounds,
            allowed,
            memory: Arc::new(Semaphore::new(kib(bounds.memory))),
            state: Mutex::new(State::default()),
            rate: governor::RateLimiter::keyed(quota(bounds.source_rate)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection from `source`, or why there is none.
    pub fn enter(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refused> {
        let mut state = self.lock();
        let from_source = state.sources.get(&source).map_or(0, |s| s.open);
        let allowed = self.allowed.is_empty() || self.allowed.iter().any(|n| n.contains(&source));
        admit_connection(&self.bounds, state.open, from_source, allowed)?;
        // Last, so that only a connection the caps admit spends its source's rate.
        if self.rate.len() > SOURCES_REMEMBERED {
            self.rate.retain_recent();
        }
        if self.rate.check_key(&source).is_err() {
            return Err(Refused::TooFast);
        }
        state.open += 1;
        let share = kib(self.bounds.source_memory());
        let entry = state.sources.entry(source).or_insert_with(|| Source {
            open: 0,
            memory: Arc::new(Semaphore::new(share)),
        });
        entry.open += 1;
        let memory = entry.memory.clone();
        Ok(Slot {
            ledger: self.clone(),
            source,
            memory,
        })
    }

    /// The bounds it keeps.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Connections open now, in all.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Reserves `kib` of memory for a request on `slot`: first from its source's share, then
    /// from the budget in all; waits until both are free (a reservation larger than the share
    /// waits until the caller's deadline: [`decoding`] refuses those first).
    pub async fn reserve(&self, slot: &Slot, kib: u32) -> Held {
        let source = acquire(&slot.memory, kib).await;
        let all = acquire(&self.memory, kib).await;
        Held {
            _all: all,
            _source: source,
        }
    }
}

/// `n` permits of `semaphore` (a semaphore is never closed here; the caller bounds the wait).
async fn acquire(semaphore: &Arc<Semaphore>, n: u32) -> OwnedSemaphorePermit {
    loop {
        if let Ok(p) = semaphore.clone().acquire_many_owned(n).await {
            return p;
        }
    }
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

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
    let bounds = ledger.bounds;
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
    let bounds = ledger.bounds;
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

/// A connection's IO that fails with `TimedOut` once neither a read nor a write has made
/// progress for `idle`: a peer that never sends its first byte, stops reading its answer, or
/// leaves the connection idle is closed, whatever the protocol does meanwhile.
struct Progress<I> {
    io: I,
    idle: Duration,
    quiet: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<I> Progress<I> {
    fn new(io: I, idle: Duration) -> Self {
        Progress {
            io,
            idle,
            quiet: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// After a poll of the IO: progress moves the deadline; no progress checks it.
    fn after<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
        progressed: impl FnOnce(&T) -> bool,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::task::Poll;
        match polled {
            Poll::Ready(Ok(v)) => {
                if progressed(&v) {
                    let next = tokio::time::Instant::now() + self.idle;
                    self.quiet.as_mut().reset(next);
                }
                Poll::Ready(Ok(v))
            }
            Poll::Pending => match std::future::Future::poll(self.quiet.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no progress on the connection",
                ))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Progress<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        let after = buf.filled().len();
        self.after(cx, polled, |()| after > before)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Progress<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.after(cx, polled, |n| *n > 0)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        self.after(cx, polled, |()| false)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.after(cx, polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Accept failures in a row after which the listener counts as ended.
const ACCEPT_FAILURES: u32 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            connections: 4,
            per_source: 2,
            memory: 256 << 10,
            body: 8 << 10,
            ..Bounds::WEBHOOK
        }
    }

    #[test]
    fn a_connection_past_either_cap_is_refused() {
        let b = bounds();
        assert_eq!(admit_connection(&b, 0, 0, true), Ok(()));
        assert_eq!(
            admit_connection(&b, 3, 1, true),
            Ok(()),
            "one below both caps"
        );
        assert_eq!(admit_connection(&b, 3, 2, true), Err(Refused::SourceFull));
        assert_eq!(admit_connection(&b, 4, 0, true), Err(Refused::Full));
        assert_eq!(admit_connection(&b, 0, 0, false), Err(Refused::NotAllowed));
    }

    #[test]
    fn a_source_opening_connections_past_its_rate_is_refused_and_others_are_not() {
        let b = Bounds {
            connections: 64,
            per_source: 2,
            source_rate: Rate {
                per_second: 1,
                burst: 3,
            },
            ..bounds()
        };
        let ledger = Ledger::new(b);
        let a: IpAddr = "10.0.0.1".parse().expect("an address");
        let held = ledger.enter(a).expect("the first");
        let _second = ledger.enter(a).expect("the second");
        // Refused by its cap: no rate spent.
        for _ in 0..5 {
            assert_eq!(ledger.enter(a).err(), Some(Refused::SourceFull));
        }
        drop(held);
        drop(ledger.enter(a).expect("the burst's third"));
        assert_eq!(
            ledger.enter(a).err(),
            Some(Refused::TooFast),
            "one past the burst"
        );
        let _other = ledger
            .enter("10.0.0.2".parse().expect("an address"))
            .expect("another source has a rate of its own");
        std::thread::sleep(Duration::from_millis(1100));
        drop(ledger.enter(a).expect("a second later, one more"));
        assert_eq!(ledger.enter(a).err(), Some(Refused::TooFast));
    }

    #[test]
    fn one_source_cannot_take_every_slot() {
        let ledger = Ledger::new(bounds());
        let a: IpAddr = "10.0.0.1".parse().expect("an address");
        let b: IpAddr = "10.0.0.2".parse().expect("an address");
        let first = ledger.enter(a).expect("a slot");
        let _second = ledger.enter(a).expect("a slot");
        assert_eq!(ledger.enter(a).err(), Some(Refused::SourceFull));
        let _other = ledger.enter(b).expect("another source still gets a slot");
        drop(first);
        let _again = ledger
            .enter(a)
            .expect("a closed connection gives its slot back");
        let _fourth = ledger
            .enter("10.0.0.3".parse().expect("an address"))
            .expect("the last slot");
        assert_eq!(ledger.open(), 4);
        let d: IpAddr = "10.0.0.4".parse().expect("an address");
        assert_eq!(ledger.enter(d).err(), Some(Refused::Full));
    }

    #[test]
    fn ipv4_mapped_peers_are_one_source_with_their_ipv4() {
        let mapped: std::net::SocketAddr = "[::ffff:10.0.0.1]:5000".parse().expect("an address");
        assert_eq!(source(mapped), "10.0.0.1".parse::<IpAddr>().expect("v4"));
    }

    #[test]
    fn a_body_at_the_limit_reserves_and_one_past_it_is_refused() {
        let b = bounds();
        assert_eq!(
            reservation(&b, Some(8 << 10)),
            Ok(8 + 16),
            "the body and its base"
        );
        assert_eq!(
            reservation(&b, Some((8 << 10) + 1)),
            Err(Early::TooLarge {
                declared: (8 << 10) + 1,
                limit: 8 << 10
            })
        );
        assert_eq!(
            reservation(&b, Some(0)),
            Ok(16),
            "a bodiless request costs its base"
        );
        assert_eq!(
            reservation(&b, None),
            reservation(&b, Some(8 << 10)),
            "an undeclared body reserves the limit"
        );
        let (status, text) = Early::TooLarge {
            declared: 9000,
            limit: 8192,
        }
        .answer();
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(text.contains("9000") && text.contains("8192"), "{text}");
    }

    #[test]
    fn the_bounds_fit_the_largest_body_in_one_sources_share() {
        for b in [Bounds::WEBHOOK, Bounds::METRICS] {
            let largest = reservation(&b, Some(b.body as u64)).expect("at the limit");
            assert!(
                (largest as usize) <= kib(b.source_memory()),
                "a body at the limit ({largest} KiB reserved) must fit one source's share: {b:?}"
            );
            assert!(
                b.per_source * 2 <= b.connections,
                "a source holds at most half"
            );
        }
    }

    #[tokio::test]
    async fn a_source_at_its_memory_share_waits_while_another_is_served() {
        let ledger = Ledger::new(bounds());
        let a = ledger
            .enter("10.0.0.1".parse().expect("v4"))
            .expect("a slot");
        let b = ledger
            .enter("10.0.0.2".parse().expect("v4"))
            .expect("a slot");
        // A quarter of 256 KiB: 64 KiB each source.
        let held = ledger.reserve(&a, 64).await;
        let waiting = tokio::time::timeout(Duration::from_millis(100), ledger.reserve(&a, 1)).await;
        assert!(waiting.is_err(), "the source's share is taken");
        let other = tokio::time::timeout(Duration::from_millis(100), ledger.reserve(&b, 64)).await;
        assert!(other.is_ok(), "another source is served from its own share");
        drop(held);
        let again = tokio::time::timeout(Duration::from_millis(100), ledger.reserve(&a, 64)).await;
        assert!(again.is_ok(), "a request done gives its memory back");
    }

    /// A plain server with `bounds` whose `/` reads a JSON string and answers its length.
    async fn echo(bounds: Bounds) -> (std::net::SocketAddr, Arc<Ledger>) {
        async fn length(axum::Json(v): axum::Json<serde_json::Value>) -> String {
            v.as_str().map_or(0, str::len).to_string()
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let metrics = Arc::new(crate::telemetry::Metrics::default());
        let ledger = Ledger::new(bounds);
        tokio::spawn(accept_loop(
            listener,
            Router::new().route("/", axum::routing::post(length)),
            ledger.clone(),
            metrics,
            "test",
            |tcp| async move { Some(tcp) },
            std::future::pending(),
            Duration::ZERO,
        ));
        (addr, ledger)
    }

    /// Sends `head` and `body` as written, then reads the answer: (status, text).
    async fn exchange(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        c.write_all(head.as_bytes()).await.expect("writes");
        // The server may answer and close before the whole body is sent.
        let _ = c.write_all(body).await;
        let mut text = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut text))
            .await
            .expect("answered within 5 s");
        let text = String::from_utf8_lossy(&text).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    fn json_of(len: usize) -> Vec<u8> {
        let mut v = vec![b'a'; len];
        v[0] = b'"';
        v[len - 1] = b'"';
        v
    }

    fn post(len: usize) -> String {
        format!(
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
        )
    }

    #[tokio::test]
    async fn a_body_at_the_limit_is_served_and_one_past_it_refused_with_the_limit_named() {
        let (addr, _) = echo(bounds()).await;
        let limit = 8 << 10;
        let (status, text) = exchange(addr, &post(limit), &json_of(limit)).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.ends_with(&(limit - 2).to_string()), "{text}");
        let (status, text) = exchange(addr, &post(limit + 1), &json_of(limit + 1)).await;
        assert_eq!(status, 413, "{text}");
        assert!(
            text.contains("a request body of 8193 bytes is over this server's limit of 8192 bytes"),
            "{text}"
        );
        // Undeclared (chunked), the body is cut at the limit as it is read.
        let body = json_of(limit + 1);
        let chunked = format!("{:x}\r\n", body.len());
        let mut sent = chunked.into_bytes();
        sent.extend_from_slice(&body);
        sent.extend_from_slice(b"\r\n0\r\n\r\n");
        let (status, text) = exchange(
            addr,
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
            &sent,
        )
        .await;
        assert_eq!(status, 413, "{text}");
    }

    #[tokio::test]
    async fn a_body_that_trickles_is_cut_at_the_request_bound() {
        let (addr, _) = echo(Bounds {
            request: Duration::from_millis(400),
            ..bounds()
        })
        .await;
        let started = std::time::Instant::now();
        // Ten bytes of a declared thousand, then nothing.
        let (status, text) = exchange(addr, &post(1000), b"\"aaaaaaaaa").await;
        assert_eq!(status, 408, "{text}");
        assert!(text.contains("within 400ms"), "{text}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_request_that_gets_no_memory_in_time_is_told_the_server_is_busy() {
        let (addr, ledger) = echo(Bounds {
            request: Duration::from_millis(500),
            ..bounds()
        })
        .await;
        // The loopback source's whole share (a quarter of 256 KiB) held elsewhere.
        let slot = ledger
            .enter("127.0.0.1".parse().expect("v4"))
            .expect("a slot");
        let held = ledger.reserve(&slot, 64).await;
        let (status, text) = exchange(addr, &post(4096), &json_of(4096)).await;
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("retry"), "{text}");
        drop(held);
        let (status, text) = exchange(addr, &post(4096), &json_of(4096)).await;
        assert_eq!(status, 200, "memory given back is served: {text}");
    }

    #[test]
    fn decoding_counts_values_outside_strings_only() {
        assert_eq!(
            decode_cost(b"\"a,b:[{\"").values,
            1,
            "punctuation in a string"
        );
        assert_eq!(
            decode_cost(br#""a\",b""#).values,
            1,
            "an escaped quote stays in the string"
        );
        assert_eq!(decode_cost(b"[0,0,0]").values, 4);
        assert_eq!(decode_cost(br#"{"a":1,"b":[2]}"#).values, 6);
        let c = decode_cost(b"[0,0]");
        assert_eq!(c.bytes, 5 * BYTE_COST + 3 * VALUE_COST);
    }

    #[test]
    fn a_review_of_small_values_is_refused_before_it_is_decoded() {
        let b = Bounds::WEBHOOK;
        // Two million zeros: 4 MiB of text, ~200 MiB decoded.
        let mut zeros = b"[".to_vec();
        zeros.extend(std::iter::repeat_n(b"0,".as_slice(), (b.body - 4) / 2).flatten());
        zeros.push(b'0');
        zeros.push(b']');
        assert!(zeros.len() <= b.body);
        let reserved = reservation(&b, Some(zeros.len() as u64)).expect("under the limit");
        match decoding(&b, &zeros, reserved) {
            Err(e @ Early::TooComplex { .. }) => {
                let (status, text) = e.answer();
                assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
                assert!(text.contains("JSON values"), "{text}");
            }
            other => panic!("decoded: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_connection_that_never_sends_its_first_byte_is_closed_when_idle() {
        use tokio::io::AsyncReadExt;
        let (addr, ledger) = echo(Bounds {
            idle: Duration::from_millis(300),
            header_read: Duration::from_secs(30),
            ..bounds()
        })
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let started = std::time::Instant::now();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("closed within 5 s");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(started.elapsed() >= Duration::from_millis(250));
        // Its slot is given back.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while ledger.open() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the slot was not given back"
            );
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn a_server_told_its_sources_serves_them_alone() {
        let net: ipnet::IpNet = "10.0.0.0/30".parse().expect("a CIDR");
        let ledger = Ledger::serving(bounds(), vec![net]);
        assert!(ledger.enter("10.0.0.2".parse().expect("v4")).is_ok());
        assert_eq!(
            ledger.enter("10.0.0.9".parse().expect("v4")).err(),
            Some(Refused::NotAllowed)
        );
        let open = Ledger::new(bounds());
        assert!(
            open.enter("10.0.0.9".parse().expect("v4")).is_ok(),
            "no list: every source"
        );
    }
}
