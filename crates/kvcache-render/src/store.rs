//! The store's admin answers as the status reads them: `/health` (does the master serve),
//! `/metrics` (capacity, the disk tier, clients, put counters) and `/get_segments_detail` (one
//! row per mounted segment), each parsed on its own so one failed read does not hide the others.
//! The operator fetches them (`kvcache-operator`'s `store`); [`crate::status::backend`] judges
//! them.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Why a read of the store failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// No answer (connection refused, timeout, DNS).
    #[error("no answer from {url}: {message}")]
    Unreachable {
        /// The URL read: a master's admin route or an engine's `/metrics`.
        url: String,
        /// The HTTP client's error, e.g. connection refused or a timeout.
        message: String,
    },
    /// An HTTP error status.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// The URL read: a master's admin route or an engine's `/metrics`.
        url: String,
        /// The HTTP status answered instead of 200.
        status: u16,
    },
    /// An answer that does not parse.
    #[error("{url} answered something unreadable: {message}")]
    Unreadable {
        /// The URL read: a master's admin route or an engine's `/metrics`.
        url: String,
        /// What in the body could not be read, in the parser's words.
        message: String,
    },
}

/// `/health`: `service_ready` is the only verdict (`status` is always `ok`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Health {
    /// Whether the master serves.
    #[serde(default)]
    pub service_ready: bool,
    /// `leader` or `standby`.
    #[serde(default)]
    pub role: Option<String>,
    /// `serving`, `leader_warmup`, …
    #[serde(default)]
    pub ha_state: Option<String>,
}

impl Health {
    /// Parses the JSON body.
    pub fn parse(url: &str, body: &str) -> Result<Health, ReadError> {
        serde_json::from_str(body).map_err(|e| ReadError::Unreadable {
            url: url.to_owned(),
            message: e.to_string(),
        })
    }
}

/// The `/metrics` samples the status uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// `master_total_capacity_bytes`: registered memory segments.
    pub memory_bytes: Option<u64>,
    /// `master_total_file_capacity_bytes`: registered disk tier.
    pub file_bytes: Option<u64>,
    /// `master_allocated_file_size_bytes`: tier fill.
    pub file_allocated_bytes: Option<u64>,
    /// `master_active_clients`.
    pub active_clients: Option<u64>,
    /// `master_put_start_requests_total`.
    pub put_starts: Option<u64>,
    /// `master_put_end_requests_total`.
    pub put_ends: Option<u64>,
    /// `master_put_revoke_requests_total`.
    pub put_revokes: Option<u64>,
}

impl Metrics {
    /// Reads the unlabelled samples it needs from Prometheus text exposition.
    pub fn parse(text: &str) -> Metrics {
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((key, value)) = line.split_once(' ') else {
                continue;
            };
            if key.contains('{') {
                continue;
            }
            if let Ok(v) = value.trim().parse::<f64>()
                && v.is_finite()
                && v >= 0.0
            {
                // Byte gauges and counters are whole numbers, printed as integers or floats.
                samples.insert(key.to_owned(), v as u64);
            }
        }
        let get = |k: &str| samples.get(k).copied();
        Metrics {
            memory_bytes: get("master_total_capacity_bytes"),
            file_bytes: get("master_total_file_capacity_bytes"),
            file_allocated_bytes: get("master_allocated_file_size_bytes"),
            active_clients: get("master_active_clients"),
            put_starts: get("master_put_start_requests_total"),
            put_ends: get("master_put_end_requests_total"),
            put_revokes: get("master_put_revoke_requests_total"),
        }
    }
}

/// One segment of `/get_segments_detail`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Segment {
    /// `host:port` the member advertised (its Pod IP, or host IP on host networking).
    #[serde(default)]
    pub segment_name: String,
    /// The id the master gives the segment; the status lists members in its order.
    #[serde(default)]
    pub segment_id: String,
    /// The client that mounted it.
    #[serde(default)]
    pub client_id: String,
    /// The segment's size in bytes, as the member mounted it.
    #[serde(default)]
    pub size_bytes: u64,
    /// Bytes its allocator holds.
    #[serde(default)]
    pub allocator_used_bytes: u64,
}

impl Segment {
    /// The advertised host (the segment name without its port).
    pub fn host(&self) -> &str {
        self.segment_name
            .rsplit_once(':')
            .map_or(self.segment_name.as_str(), |(h, _)| h)
    }

    /// Parses the JSON body of `/get_segments_detail`.
    pub fn parse_all(url: &str, body: &str) -> Result<Vec<Segment>, ReadError> {
        #[derive(Deserialize)]
        struct Listing {
            #[serde(default)]
            segments: Vec<Segment>,
        }
        serde_json::from_str::<Listing>(body)
            .map(|l| l.segments)
            .map_err(|e| ReadError::Unreadable {
                url: url.to_owned(),
                message: e.to_string(),
            })
    }
}

/// The store's answers in one pass (each read on its own).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreReading {
    /// `/health`.
    pub health: Result<Health, ReadError>,
    /// `/metrics`.
    pub metrics: Result<Metrics, ReadError>,
    /// `/get_segments_detail`.
    pub segments: Result<Vec<Segment>, ReadError>,
}
