//! What one request, one connection, one source and all clients together may hold, and the
//! answers a request or a connection refused gets: plain values and functions.

use std::time::Duration;

use axum::http::StatusCode;

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
