//! The store's admin answers as the status reads them: `/health` (does the master serve),
//! `/metrics` (capacity, the disk tier, clients, put counters; and every counter and gauge, which
//! the operator re-exports: [`crate::observe::store_series`]) and `/get_segments_detail` (one
//! row per mounted segment), each parsed on its own so one failed read does not hide the others;
//! and the drain jobs a member rollout runs (`/api/v1/drain_jobs`: the request, the master's
//! answers). The operator fetches them (`kvcache-operator`'s `store`); [`crate::status::backend`]
//! and [`crate::members::rollout`] judge them.

use std::sync::Arc;

use kvcache_quota::admin::NoAnswer;
use serde::Deserialize;

use crate::observe::exposition::Exposition;
use crate::observe::store_series::{MAX_SERIES, StoreSeries};

/// Why a read of the store failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// No answer (connection refused, timeout, DNS).
    #[error("no answer from {url}: {cause}")]
    Unreachable {
        /// The URL read: a master's admin route or an engine's `/metrics`.
        url: String,
        /// Why no answer came, e.g. connection refused or a timeout.
        cause: NoAnswer,
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
    #[error("{url} answered something unreadable: {cause}")]
    Unreadable {
        /// The URL read: a master's admin route or an engine's `/metrics`.
        url: String,
        /// What in the answer could not be read.
        cause: BadAnswer,
    },
    /// The master's own refusal: an error status with its JSON error (`error_code`, e.g.
    /// -1402 `JOB_NOT_FOUND`, -101 `SEGMENT_NOT_FOUND`, -1010 `UNAVAILABLE_IN_CURRENT_STATUS`).
    #[error("{url} answered HTTP {status}: {message} (error code {code})")]
    Refused {
        /// The URL called.
        url: String,
        /// The HTTP status answered.
        status: u16,
        /// The master's `error_code`.
        code: i32,
        /// The master's `error_message`.
        message: String,
    },
}

/// Why an answer could not be read ([`ReadError::Unreadable`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadAnswer {
    /// The body was cut short or is not text ([`NoAnswer::Cut`], [`NoAnswer::NotText`]).
    #[error(transparent)]
    Body(NoAnswer),
    /// The body is not the JSON expected.
    #[error("{message}")]
    Json {
        /// What in the body could not be read, in the JSON decoder's words.
        message: String,
    },
    /// An engine other than vLLM: none other counts shared-cache hits per engine.
    #[error("only vLLM counts shared-cache hits per engine")]
    EngineUncounted,
    /// An engine scrape without the hit and query series: the engine runs without the store's
    /// connector or does not count external prefix hits.
    #[error(
        "no {queries} and {hits} series: the engine runs without the store's connector or does not count external prefix hits"
    )]
    NoHitSeries {
        /// The query counter's series name.
        queries: &'static str,
        /// The hit counter's series name.
        hits: &'static str,
    },
}

impl BadAnswer {
    /// A JSON decoder's error.
    pub fn json(e: &serde_json::Error) -> BadAnswer {
        BadAnswer::Json {
            message: e.to_string(),
        }
    }
}

/// The master's `error_code` for a drain job it does not know (a new leader forgets jobs).
pub(crate) const JOB_NOT_FOUND: i32 = -1402;

impl ReadError {
    /// The route is not served: a plain 404 without the master's JSON error (a master older
    /// than the drain-job API answers `/api/v1/drain_jobs` so).
    pub fn not_served(&self) -> bool {
        matches!(self, ReadError::Status { status: 404, .. })
    }

    /// The master answered that it does not know the drain job.
    pub(crate) fn job_not_found(&self) -> bool {
        matches!(self, ReadError::Refused { code, .. } if *code == JOB_NOT_FOUND)
    }

    /// An error answer from `url`: the master's JSON error when the body is one, else the bare
    /// status.
    pub fn from_answer(url: &str, status: u16, body: &str) -> ReadError {
        #[derive(Deserialize)]
        struct Failure {
            error_code: i32,
            #[serde(default)]
            error_message: String,
        }
        match serde_json::from_str::<Failure>(body) {
            Ok(f) => ReadError::Refused {
                url: url.to_owned(),
                status,
                code: f.error_code,
                message: f.error_message,
            },
            Err(_) => ReadError::Status {
                url: url.to_owned(),
                status,
            },
        }
    }
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
    /// The serving master's RPC address, as the master view holds it (`etcd` HA only).
    #[serde(default)]
    pub leader_address: Option<String>,
    /// The master view's version (`etcd` HA only): it moves at every election.
    #[serde(default)]
    pub view_version: Option<i64>,
}

impl Health {
    /// Parses the JSON body.
    pub fn parse(url: &str, body: &str) -> Result<Health, ReadError> {
        serde_json::from_str(body).map_err(|e| ReadError::Unreadable {
            url: url.to_owned(),
            cause: BadAnswer::json(&e),
        })
    }
}

/// The `/metrics` samples the status uses, and every series the operator re-exports.
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
    /// `master_key_count`: objects the master knows.
    pub key_count: Option<u64>,
    /// The master's counters and gauges as the operator re-exports them
    /// ([`crate::observe::store_series`]); shared, so that a reading is cloned without them.
    pub series: Arc<StoreSeries>,
}

impl Metrics {
    /// Reads Prometheus text exposition ([`Exposition`]): the unlabelled samples the status
    /// needs (a byte gauge or a counter: finite and not negative), wherever they are printed,
    /// and the series re-exported, of which at most `MAX_SERIES` are held.
    pub fn parse(text: &str) -> Metrics {
        const STATUS: [&str; 8] = [
            "master_total_capacity_bytes",
            "master_total_file_capacity_bytes",
            "master_allocated_file_size_bytes",
            "master_active_clients",
            "master_put_start_requests_total",
            "master_put_end_requests_total",
            "master_put_revoke_requests_total",
            "master_key_count",
        ];
        let mut status = [None; STATUS.len()];
        let e = Exposition::parse_capped(text, MAX_SERIES, |s| {
            if let Some(i) = STATUS.iter().position(|n| *n == s.name)
                && s.labels.is_empty()
                && let Some(slot) = status.get_mut(i)
            {
                slot.get_or_insert(s.value);
            }
        });
        let [
            memory_bytes,
            file_bytes,
            file_allocated_bytes,
            active_clients,
            put_starts,
            put_ends,
            put_revokes,
            key_count,
        ] = status.map(|v: Option<f64>| {
            v.filter(|v| v.is_finite() && *v >= 0.0)
                // Byte gauges and counters are whole numbers, printed as integers or floats.
                .map(|v| v as u64)
        });
        Metrics {
            memory_bytes,
            file_bytes,
            file_allocated_bytes,
            active_clients,
            put_starts,
            put_ends,
            put_revokes,
            key_count,
            series: Arc::new(StoreSeries::from_exposition(&e, MAX_SERIES)),
        }
    }
}

/// Where a segment stands on the master (`status` in `/get_segments_detail`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SegmentStatus {
    /// Mounted and taking new objects.
    Ok,
    /// A drain job moves its objects away; readable, no new objects.
    Draining,
    /// Emptied by a drain job; waits for its member to unmount it.
    Drained,
    /// Readable, no new objects, its member is leaving.
    GracefullyUnmounting,
    /// Being unmounted.
    Unmounting,
    /// The master has not set it.
    Undefined,
    /// No status in the answer (a master older than 0.3.13), or one this reader does not know.
    #[default]
    #[serde(other)]
    Unknown,
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
    /// Bytes its allocator holds (the master reports 0 once the segment is not `OK`).
    #[serde(default)]
    pub allocator_used_bytes: u64,
    /// Whether it takes new objects, is being drained, or was drained.
    #[serde(default)]
    pub status: SegmentStatus,
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
                cause: BadAnswer::json(&e),
            })
    }
}

/// A drain job's request (`POST /api/v1/drain_jobs`): move every object off `segments` onto
/// `target_segments` (empty: any segment the master picks), `max_concurrency` moves at a time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DrainRequest {
    /// The segments to empty (segment names, `host:port`).
    pub segments: Vec<String>,
    /// Where their objects may go.
    pub target_segments: Vec<String>,
    /// Moves in flight at once.
    pub max_concurrency: u32,
}

/// The route that creates a drain job.
pub const DRAIN_JOBS_PATH: &str = "/api/v1/drain_jobs";

impl DrainRequest {
    /// How many objects a rollout's drain moves at a time. Measured with the 0.3.13.post1 master
    /// on loopback (1 MiB objects): 4 (the master's default) moved 3.8 MiB/s, 32 moved 15 MiB/s,
    /// and 128 no more than 32.
    pub const CONCURRENCY: u32 = 32;

    /// One segment to `targets`.
    pub fn new(segment: &str, targets: &[String]) -> DrainRequest {
        DrainRequest {
            segments: vec![segment.to_owned()],
            target_segments: targets.to_vec(),
            max_concurrency: Self::CONCURRENCY,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The job id from the master's answer to the create (`{"success":true,"job_id":…}`), or
    /// why there is none.
    pub fn parse_created(url: &str, status: u16, body: &str) -> Result<String, ReadError> {
        #[derive(Deserialize)]
        struct Created {
            #[serde(default)]
            success: bool,
            #[serde(default)]
            job_id: String,
        }
        if status != 200 {
            return Err(ReadError::from_answer(url, status, body));
        }
        match serde_json::from_str::<Created>(body) {
            Ok(c) if c.success && !c.job_id.is_empty() => Ok(c.job_id),
            Ok(_) => Err(ReadError::from_answer(url, status, body)),
            Err(e) => Err(ReadError::Unreadable {
                url: url.to_owned(),
                cause: BadAnswer::json(&e),
            }),
        }
    }
}

/// The path that asks the master about one drain job.
pub fn drain_query_path(job: &str) -> String {
    format!("{DRAIN_JOBS_PATH}/query?job_id={job}")
}

/// The path that cancels one drain job (a job with moves in flight cannot be cancelled).
pub fn drain_cancel_path(job: &str) -> String {
    format!("{DRAIN_JOBS_PATH}/cancel?job_id={job}")
}

/// Where a drain job stands (`status_name` of its query).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    /// Accepted, not planned yet.
    Created,
    /// Finding the objects to move.
    Planning,
    /// Moving objects.
    Running,
    /// Every object moved; the segment is `DRAINED`.
    Succeeded,
    /// Objects remain that could not be moved; the segment is `OK` again.
    Failed,
    /// Cancelled; the segment is `OK` again.
    Canceled,
    /// A status this reader does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

impl JobStatus {
    /// The job has ended (succeeded, failed or cancelled).
    pub fn ended(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled
        )
    }
}

/// A drain job as `GET /api/v1/drain_jobs/query` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct DrainJob {
    /// The job's id.
    #[serde(default)]
    pub job_id: String,
    /// Where it stands.
    #[serde(default, rename = "status_name")]
    pub status: JobStatus,
    /// The segments it empties.
    #[serde(default)]
    pub segments: Vec<String>,
    /// Objects moved.
    #[serde(default)]
    pub succeeded_units: u64,
    /// Moves that failed (retried up to the master's limit).
    #[serde(default)]
    pub failed_units: u64,
    /// Objects that cannot move yet: read within the lease (`-default_kv_lease_ttl`), pinned,
    /// or no target with room.
    #[serde(default)]
    pub blocked_units: u64,
    /// Moves in flight.
    #[serde(default)]
    pub active_units: u64,
    /// Bytes moved.
    #[serde(default)]
    pub migrated_bytes: u64,
    /// The master's words, e.g. `Drain job failed: unrecoverable units remain`.
    #[serde(default)]
    pub message: String,
    /// When the master created it (milliseconds since the epoch).
    #[serde(default)]
    pub created_at_ms_epoch: i64,
}

impl DrainJob {
    /// Parses the master's answer to a query (an error status is the master's refusal).
    pub fn parse(url: &str, status: u16, body: &str) -> Result<DrainJob, ReadError> {
        if status != 200 {
            return Err(ReadError::from_answer(url, status, body));
        }
        serde_json::from_str(body).map_err(|e| ReadError::Unreadable {
            url: url.to_owned(),
            cause: BadAnswer::json(&e),
        })
    }
}

/// The store's answers in one pass (each read on its own).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreReading {
    /// The master's `/health` answer, or why it could not be read.
    pub health: Result<Health, ReadError>,
    /// The master's `/metrics` figures, or why they could not be read.
    pub metrics: Result<Metrics, ReadError>,
    /// The segments `/get_segments_detail` lists, or why they could not be read.
    pub segments: Result<Vec<Segment>, ReadError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/get_segments_detail` of a 0.3.13.post1 master after a drain (captured on loopback).
    const DRAINED: &str = r#"{"total_segments":2,"segments":[{"segment_name":"127.0.0.1:12729","segment_id":"740612671729488647-16470794457785744","client_id":"15513339725995634181-1989518604341493161","base_address":"0x7fe457000000","size_bytes":67108864,"size_human":"0.0625 GiB","te_endpoint":"127.0.0.1:15711","protocol":"tcp","status":"DRAINED","allocator_used_bytes":0,"allocator_capacity_bytes":67108864,"allocator_usage_percent":0E0},{"segment_name":"127.0.0.1:12360","segment_id":"16233683210368398383-6851071194483234448","client_id":"378699378871883011-5232974566424061840","base_address":"0x7f14ba000000","size_bytes":67108864,"size_human":"0.0625 GiB","te_endpoint":"127.0.0.1:16810","protocol":"tcp","status":"OK","allocator_used_bytes":20971520,"allocator_capacity_bytes":67108864,"allocator_usage_percent":31.25}]}"#;

    #[test]
    fn the_status_reads_unlabelled_figures_and_every_series_is_kept_for_reexport() {
        let m = Metrics::parse(
            "# TYPE master_total_capacity_bytes gauge\nmaster_total_capacity_bytes 6.7108864e7\nmaster_key_count{shard=\"1\"} 5\nmaster_active_clients -1\nmaster_put_start_requests_total NaN\n",
        );
        assert_eq!(m.memory_bytes, Some(64 << 20));
        assert_eq!(
            m.key_count, None,
            "a labelled sample is not the master's own"
        );
        assert_eq!(m.active_clients, None);
        assert_eq!(m.put_starts, None);
        assert_eq!(m.series.len(), 4);
    }

    #[test]
    fn past_the_cap_the_series_are_counted_and_the_status_still_read() {
        let mut text: String = (0..MAX_SERIES + 100)
            .map(|i| format!("mooncake_tenant_quota_charged_bytes{{tenant_id=\"t{i}\"}} 1\n"))
            .collect();
        text.push_str("master_key_count 7\n");
        let m = Metrics::parse(&text);
        assert_eq!(m.key_count, Some(7), "read past the cap");
        assert_eq!(m.series.len(), MAX_SERIES);
        assert_eq!(m.series.skipped.over_cap, 101);
    }

    #[test]
    fn segments_say_whether_they_were_drained() {
        let s = Segment::parse_all("u", DRAINED).expect("parses");
        assert_eq!(
            s.iter().map(|s| s.status).collect::<Vec<_>>(),
            [SegmentStatus::Drained, SegmentStatus::Ok]
        );
        assert_eq!(s[1].allocator_used_bytes, 20 << 20);
        // An older master's row without a status, and a status this reader does not know.
        let old = Segment::parse_all(
            "u",
            r#"{"segments":[{"segment_name":"a:1"},{"segment_name":"b:1","status":"SOMETHING_NEW"}]}"#,
        )
        .expect("parses");
        assert_eq!(old[0].status, SegmentStatus::Unknown);
        assert_eq!(old[1].status, SegmentStatus::Unknown);
    }

    #[test]
    fn a_drain_request_is_the_masters_json() {
        let r = DrainRequest::new("10.0.0.1:13360", &["10.0.0.2:13360".to_owned()]);
        assert_eq!(
            r.body(),
            r#"{"segments":["10.0.0.1:13360"],"target_segments":["10.0.0.2:13360"],"max_concurrency":32}"#
        );
        assert_eq!(
            drain_query_path("7-9"),
            "/api/v1/drain_jobs/query?job_id=7-9"
        );
        assert_eq!(
            drain_cancel_path("7-9"),
            "/api/v1/drain_jobs/cancel?job_id=7-9"
        );
    }

    #[test]
    fn a_created_job_answers_its_id_and_a_refusal_its_code() {
        assert_eq!(
            DrainRequest::parse_created(
                "u",
                200,
                r#"{"success":true,"job_id":"883635332826080265-5753714137429996708","status":"CREATED","error_code":0,"error_message":""}"#
            ),
            Ok("883635332826080265-5753714137429996708".to_owned())
        );
        let busy = DrainRequest::parse_created(
            "u",
            409,
            r#"{"success":false,"error_code":-1010,"error_message":"UNAVAILABLE_IN_CURRENT_STATUS"}"#,
        );
        assert_eq!(
            busy,
            Err(ReadError::Refused {
                url: "u".into(),
                status: 409,
                code: -1010,
                message: "UNAVAILABLE_IN_CURRENT_STATUS".into()
            })
        );
        // A master without the route: a plain 404 page.
        let old = DrainRequest::parse_created("u", 404, "404 Not Found").expect_err("refused");
        assert!(old.not_served() && !old.job_not_found());
        assert!(matches!(
            DrainRequest::parse_created("u", 200, "{"),
            Err(ReadError::Unreadable { .. })
        ));
        assert!(matches!(
            DrainRequest::parse_created("u", 200, r#"{"success":false}"#),
            Err(ReadError::Status { status: 200, .. })
        ));
    }

    #[test]
    fn a_job_query_says_where_the_drain_stands() {
        let j = DrainJob::parse(
            "u",
            200,
            r#"{"success":true,"job_id":"883635332826080265-5753714137429996708","type":0,"type_name":"DRAIN","status":3,"status_name":"SUCCEEDED","created_at_ms_epoch":1796212867318,"last_updated_at_ms_epoch":1796212873319,"segments":["127.0.0.1:12729"],"succeeded_units":24,"failed_units":0,"blocked_units":0,"active_units":0,"migrated_bytes":12582912,"message":"Drain job finished successfully","error_code":0,"error_message":""}"#,
        )
        .expect("parses");
        assert_eq!(j.status, JobStatus::Succeeded);
        assert!(j.status.ended() && !JobStatus::Running.ended());
        assert_eq!((j.succeeded_units, j.migrated_bytes), (24, 12 << 20));
        let gone = DrainJob::parse(
            "u",
            404,
            r#"{"success":false,"error_code":-1402,"error_message":"JOB_NOT_FOUND"}"#,
        )
        .expect_err("unknown");
        assert!(gone.job_not_found() && !gone.not_served());
    }
}
