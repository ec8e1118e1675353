//! Reading a store's admin surface (`/health`, `/metrics`, `/get_segments_detail`), its tenant
//! ledger, its drain jobs (a member rollout's) and an engine's `/metrics`: one async HTTP/1
//! client held in the context (connections reused across reconciles), a timeout per request, a
//! cap on each answer's body (an engine's smaller, its reads taking turns), no redirect
//! followed. The answers are parsed
//! by `kvcache-render::observe::store`; an unreachable store is a value, never a panic.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvcache_quota::admin::{AdminError, NoAnswer, Request, Unanswered};
use kvcache_render::observe::store::{
    BadAnswer, DRAIN_JOBS_PATH, DrainJob, DrainRequest, Health, Metrics, ReadError, Segment,
    StoreReading, drain_cancel_path, drain_query_path,
};
use tokio::sync::Semaphore;

/// How long one request may take, answer body included.
const TIMEOUT: Duration = Duration::from_millis(1500);

/// The most one answer of a store's admin surface may hold: a ledger of 2,000 tenants is under
/// 1 MiB. An engine's `/metrics` has a cap of its own, [`ENGINE_METRICS_MAX_BYTES`].
const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The most one engine's `/metrics` body may hold. An engine runs a tenant's own image, so what
/// it answers is capped before the operator (256Mi) holds it: a body past this is an error
/// naming the URL and the cap ([`NoAnswer::TooLarge`]), of which no more is read. Measured
/// (README.md, "Shared-cache figures of a ModelDeployment"): vLLM 0.32.0 with the store's
/// connector answers 72 KB after a few requests; every store operation and status, every
/// route and a 60-character model name make about 170 KB for one engine, 950 KB for a Pod of
/// 8 data-parallel engines. The cap is 14 times the first, 6 times the second, and holds the
/// third.
const ENGINE_METRICS_MAX_BYTES: usize = 1 << 20;
const _: () = assert!(ENGINE_METRICS_MAX_BYTES < MAX_ANSWER_BYTES);

/// How many engine `/metrics` the whole operator reads at once, every reconcile together: the
/// engine bodies it holds are then at most this many times [`ENGINE_METRICS_MAX_BYTES`] (twice
/// that while a body is made whole), 32 MiB of the container's 256Mi, however many
/// deployments reconcile and whatever their Pods answer. A read waits for its turn before its
/// own timeout starts, so a slow engine delays others' reads and never fails them.
const ENGINE_READS_AT_ONCE: usize = 16;

/// How long an idle connection to a store is kept for the next read.
const IDLE: Duration = Duration::from_secs(30);

/// The operator's client for stores and engines (cheap to clone: one connection pool, one
/// turn-taking of engine reads).
#[derive(Clone, Debug)]
pub struct StoreClient {
    http: Client<HttpConnector, Full<Bytes>>,
    /// The turns of engine reads ([`ENGINE_READS_AT_ONCE`]).
    engine_reads: Arc<Semaphore>,
}

impl Default for StoreClient {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(TIMEOUT));
        connector.set_nodelay(true);
        StoreClient {
            http: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(IDLE)
                .build(connector),
            engine_reads: Arc::new(Semaphore::new(ENGINE_READS_AT_ONCE)),
        }
    }
}

impl StoreClient {
    /// One request: the status and body (read up to `limit` bytes), or why no answer came
    /// within [`TIMEOUT`].
    async fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<String>,
        limit: usize,
    ) -> Result<(u16, String), NoAnswer> {
        let mut request = hyper::Request::builder().method(method).uri(url);
        if body.is_some() {
            request = request.header("Content-Type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|_| NoAnswer::InvalidUrl)?;
        let answer = async {
            let response = self.http.request(request).await.map_err(|e| unsent(&e))?;
            let status = response.status().as_u16();
            let bytes = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| cut_or_too_large(e.as_ref(), limit))?
                .to_bytes();
            let text = String::from_utf8(Vec::from(bytes)).map_err(|e| NoAnswer::NotText {
                at: e.utf8_error().valid_up_to(),
            })?;
            Ok((status, text))
        };
        tokio::time::timeout(TIMEOUT, answer)
            .await
            .unwrap_or_else(|_| Err(timed_out()))
    }

    /// [`send`](Self::send) of a store's admin surface, with no answer as the reader's error
    /// for `url`.
    async fn send_read(
        &self,
        method: &str,
        url: &str,
        body: Option<String>,
    ) -> Result<(u16, String), ReadError> {
        self.send(method, url, body, MAX_ANSWER_BYTES)
            .await
            .map_err(|cause| read_error(url, cause))
    }

    /// A GET of `url` reading at most `limit` bytes: the body of a 200 answer, or why there is
    /// none.
    async fn get(&self, url: &str, limit: usize) -> Result<String, ReadError> {
        match self
            .send("GET", url, None, limit)
            .await
            .map_err(|cause| read_error(url, cause))?
        {
            (200, body) => Ok(body),
            (status, _) => Err(ReadError::Status {
                url: url.to_owned(),
                status,
            }),
        }
    }

    /// A GET of a store's admin route `url`: the body of a 200 answer, or why there is none.
    pub async fn fetch(&self, url: &str) -> Result<String, ReadError> {
        self.get(url, MAX_ANSWER_BYTES).await
    }

    /// A GET of an engine's `/metrics` at `url`, read up to [`ENGINE_METRICS_MAX_BYTES`] once
    /// one of the [`ENGINE_READS_AT_ONCE`] turns is free: the body of a 200 answer, or why
    /// there is none.
    pub async fn engine_metrics(&self, url: &str) -> Result<String, ReadError> {
        // The semaphore is never closed, so a turn always comes.
        let _turn = self.engine_reads.acquire().await.ok();
        self.get(url, ENGINE_METRICS_MAX_BYTES).await
    }

    /// Reads the store whose admin surface is at `admin` (`host:port`).
    pub async fn read(&self, admin: &str) -> StoreReading {
        let health_url = format!("http://{admin}/health");
        let metrics_url = format!("http://{admin}/metrics");
        let segments_url = format!("http://{admin}/get_segments_detail");
        // The segment listing after the metrics: a member mounting between the two reads is
        // then listed before its capacity counts, never counted without its row (a backend
        // at full capacity with a member missing from `status.members`).
        let (health, (metrics, segments)) = tokio::join!(self.fetch(&health_url), async {
            let metrics = self.fetch(&metrics_url).await;
            (metrics, self.fetch(&segments_url).await)
        });
        StoreReading {
            health: health.and_then(|b| Health::parse(&health_url, &b)),
            metrics: metrics.map(|t| Metrics::parse(&t)),
            segments: segments.and_then(|b| Segment::parse_all(&segments_url, &b)),
        }
    }

    /// One call to the tenant ledger (`/api/v1/tenant_quotas`) at `admin`: its answer (an error
    /// status is one) as `decode` reads it, or which request got no answer and why.
    pub async fn ledger<T>(
        &self,
        admin: &str,
        req: &Request,
        decode: impl FnOnce(u16, &str) -> Result<T, AdminError>,
    ) -> Result<Result<T, AdminError>, Unanswered> {
        let url = format!("http://{admin}{}", req.path());
        let body = match req.method() {
            "PUT" => req.body(),
            _ => None,
        };
        self.send(req.method(), &url, body, MAX_ANSWER_BYTES)
            .await
            .map(|(status, body)| decode(status, &body))
            .map_err(|cause| Unanswered {
                method: req.method(),
                url,
                cause,
            })
    }

    /// Asks the master at `admin` to drain a segment: the job's id, or why there is none (a
    /// plain 404: the master has no drain jobs; the master's JSON error: its refusal).
    pub async fn create_drain(&self, admin: &str, req: &DrainRequest) -> Result<String, ReadError> {
        let url = format!("http://{admin}{DRAIN_JOBS_PATH}");
        let (status, body) = self.send_read("POST", &url, Some(req.body())).await?;
        DrainRequest::parse_created(&url, status, &body)
    }

    /// Where the drain job `job` stands on the master at `admin`.
    pub async fn drain_job(&self, admin: &str, job: &str) -> Result<DrainJob, ReadError> {
        let url = format!("http://{admin}{}", drain_query_path(job));
        let (status, body) = self.send_read("GET", &url, None).await?;
        DrainJob::parse(&url, status, &body)
    }

    /// Cancels the drain job `job` on the master at `admin` (the master refuses while moves are
    /// in flight or once the job ended).
    pub async fn cancel_drain(&self, admin: &str, job: &str) -> Result<(), ReadError> {
        let url = format!("http://{admin}{}", drain_cancel_path(job));
        match self.send_read("POST", &url, None).await? {
            (200, _) => Ok(()),
            (status, body) => Err(ReadError::from_answer(&url, status, &body)),
        }
    }

    /// `master_total_capacity_bytes` from the store at `admin`.
    pub async fn capacity(&self, admin: &str) -> Option<u64> {
        let text = self.fetch(&format!("http://{admin}/metrics")).await.ok()?;
        Metrics::parse(&text).memory_bytes
    }
}

fn timed_out() -> NoAnswer {
    NoAnswer::TimedOut {
        after_ms: u64::try_from(TIMEOUT.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Why the client got no answer at all, from its error's causes: the connector's own I/O error
/// when there is one (refused, timed out, no route), a name that did not resolve (the connector
/// calls that cause "dns error"), else the client's words.
fn unsent(e: &hyper_util::client::legacy::Error) -> NoAnswer {
    if e.is_connect() {
        let connect = std::error::Error::source(e);
        if connect.is_some_and(|c| c.to_string() == "dns error") {
            return NoAnswer::UnknownHost;
        }
        match io_kind(e) {
            Some(std::io::ErrorKind::ConnectionRefused) => return NoAnswer::Refused,
            Some(std::io::ErrorKind::TimedOut) => return timed_out(),
            Some(std::io::ErrorKind::HostUnreachable | std::io::ErrorKind::NetworkUnreachable) => {
                return NoAnswer::NoRoute;
            }
            _ => {}
        }
    }
    match std::iter::successors(std::error::Error::source(e), |c| c.source())
        .find_map(|c| c.downcast_ref::<hyper::Error>())
    {
        // Nothing of an answer came: the request was not answered (unlike a body cut short).
        Some(h) if h.is_incomplete_message() => NoAnswer::Closed,
        _ => NoAnswer::Transport(chain(e)),
    }
}

/// Why a body was not read whole: past the request's cap `limit`, or cut as [`cut`] says.
fn cut_or_too_large(e: &(dyn std::error::Error + Send + Sync + 'static), limit: usize) -> NoAnswer {
    if e.is::<LengthLimitError>() {
        return NoAnswer::TooLarge {
            limit_bytes: limit as u64,
        };
    }
    match e.downcast_ref::<hyper::Error>() {
        Some(h) => cut(h),
        None => NoAnswer::Transport(e.to_string()),
    }
}

fn cut(e: &hyper::Error) -> NoAnswer {
    if e.is_incomplete_message() || e.is_closed() || io_kind(e).is_some() {
        NoAnswer::Cut
    } else {
        NoAnswer::Transport(chain(e))
    }
}

/// The kind of the first I/O error among `e`'s causes.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    std::iter::successors(Some(e), |c| c.source())
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind)
}

/// `e` and each of its causes, joined by ": ".
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |c| c.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// No answer from `url`, as the reader of a store's or engine's surface reports it: a body cut
/// short or not text is unreadable, anything else unreachable.
fn read_error(url: &str, cause: NoAnswer) -> ReadError {
    let url = url.to_owned();
    match cause {
        NoAnswer::Cut | NoAnswer::NotText { .. } => ReadError::Unreadable {
            url,
            cause: BadAnswer::Body(cause),
        },
        cause => ReadError::Unreachable { url, cause },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `answers` (status, body) one connection each on a loopback port.
    async fn serve(answers: Vec<(u16, &'static str)>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            for (status, body) in answers {
                let (mut s, _) = listener.accept().await.expect("a connection");
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        addr.to_string()
    }

    #[tokio::test]
    async fn a_200_is_its_body_and_an_error_status_is_named() {
        let addr = serve(vec![(200, "ok"), (503, "down")]).await;
        let client = StoreClient::default();
        assert_eq!(
            client.fetch(&format!("http://{addr}/health")).await,
            Ok("ok".to_owned())
        );
        assert!(matches!(
            client.fetch(&format!("http://{addr}/health")).await,
            Err(ReadError::Status { status: 503, .. })
        ));
    }

    #[tokio::test]
    async fn an_answer_past_the_cap_is_not_read() {
        let big: &'static str = Box::leak("x".repeat(MAX_ANSWER_BYTES + 1).into_boxed_str());
        let under: &'static str = Box::leak("y".repeat(MAX_ANSWER_BYTES).into_boxed_str());
        let addr = serve(vec![(200, big), (200, under)]).await;
        let client = StoreClient::default();
        let url = format!("http://{addr}/metrics");
        assert_eq!(
            client.fetch(&url).await,
            Err(ReadError::Unreachable {
                url: url.clone(),
                cause: NoAnswer::TooLarge {
                    limit_bytes: MAX_ANSWER_BYTES as u64
                }
            })
        );
        assert_eq!(
            client.fetch(&url).await.map(|b| b.len()),
            Ok(MAX_ANSWER_BYTES)
        );
    }

    #[tokio::test]
    async fn an_engine_body_is_read_up_to_its_own_cap_and_past_it_is_an_error_naming_both() {
        let at: &'static str = Box::leak("y".repeat(ENGINE_METRICS_MAX_BYTES).into_boxed_str());
        let past: &'static str =
            Box::leak("x".repeat(ENGINE_METRICS_MAX_BYTES + 1).into_boxed_str());
        let addr = serve(vec![(200, at), (200, past), (200, past)]).await;
        let client = StoreClient::default();
        let url = format!("http://{addr}/metrics");
        assert_eq!(
            client.engine_metrics(&url).await.map(|b| b.len()),
            Ok(ENGINE_METRICS_MAX_BYTES)
        );
        let e = client.engine_metrics(&url).await.expect_err("past the cap");
        assert_eq!(
            e,
            ReadError::Unreachable {
                url: url.clone(),
                cause: NoAnswer::TooLarge {
                    limit_bytes: ENGINE_METRICS_MAX_BYTES as u64
                }
            }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "no answer from {url}: the answer is larger than the client reads ({ENGINE_METRICS_MAX_BYTES} bytes)"
            )
        );
        // The engine's cap is its own: a store's admin answer of the same size is read.
        assert_eq!(
            client.fetch(&url).await.map(|b| b.len()),
            Ok(ENGINE_METRICS_MAX_BYTES + 1)
        );
    }

    #[tokio::test]
    async fn an_engine_body_past_the_cap_is_not_read_to_its_end() {
        // An engine that announces 1 GiB and keeps sending: the read ends at the cap, with
        // the sender still writing.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("a connection");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 1u64 << 30);
            let _ = s.write_all(head.as_bytes()).await;
            let chunk = vec![b'x'; 64 << 10];
            while s.write_all(&chunk).await.is_ok() {
                counted.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
            }
        });
        let url = format!("http://{addr}/metrics");
        assert_eq!(
            StoreClient::default().engine_metrics(&url).await,
            Err(ReadError::Unreachable {
                url,
                cause: NoAnswer::TooLarge {
                    limit_bytes: ENGINE_METRICS_MAX_BYTES as u64
                }
            })
        );
        assert!(sent.load(std::sync::atomic::Ordering::Relaxed) < 64 << 20);
    }

    #[tokio::test]
    async fn engine_reads_take_turns_across_the_whole_client() {
        // Engines that accept and never answer: the reads beyond the turns wait, and start
        // (each with its own timeout) once a turn is free.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let (accepted, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
                let _ = accepted.send(tokio::time::Instant::now());
            }
        });
        let client = StoreClient::default();
        let url = format!("http://{addr}/metrics");
        let started = tokio::time::Instant::now();
        let reads: Vec<_> = (0..ENGINE_READS_AT_ONCE + 4)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move { client.engine_metrics(&url).await })
            })
            .collect();
        let mut at = Vec::new();
        for _ in 0..ENGINE_READS_AT_ONCE + 4 {
            at.push(seen.recv().await.expect("a connection"));
        }
        // The first turns went at once; the last four only after the first reads timed out.
        assert!(at[ENGINE_READS_AT_ONCE - 1] - started < TIMEOUT);
        assert!(at[ENGINE_READS_AT_ONCE] - started >= TIMEOUT);
        for read in reads {
            // Every read, the waiting ones too, ends with its own timeout, not a failure of the
            // wait.
            assert!(matches!(
                read.await.expect("the read ends"),
                Err(ReadError::Unreachable {
                    cause: NoAnswer::TimedOut { .. },
                    ..
                })
            ));
        }
    }

    #[tokio::test]
    async fn a_ledger_answer_keeps_its_status() {
        let addr = serve(vec![(404, r#"{"success":false}"#)]).await;
        let client = StoreClient::default();
        let answer = client
            .ledger(&addr, &Request::List, kvcache_quota::admin::decode_list)
            .await;
        assert_eq!(
            answer,
            Ok(Err(AdminError::Other {
                status: 404,
                code: 0,
                message: String::new()
            }))
        );
    }

    #[tokio::test]
    async fn an_unanswered_ledger_call_names_its_request_and_why() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = listener.local_addr().expect("its address").to_string();
        drop(listener);
        let client = StoreClient::default();
        let unanswered = client
            .ledger(&addr, &Request::List, kvcache_quota::admin::decode_list)
            .await
            .expect_err("nothing listens");
        let url = format!("http://{addr}/api/v1/tenant_quotas");
        assert_eq!(
            unanswered,
            Unanswered {
                method: "GET",
                url: url.clone(),
                cause: NoAnswer::Refused
            }
        );
        assert_eq!(
            unanswered.to_string(),
            format!("no answer to GET {url}: connection refused")
        );
        assert_eq!(
            client.fetch(&url).await.expect_err("nothing listens"),
            ReadError::Unreachable {
                url,
                cause: NoAnswer::Refused
            }
        );
    }

    #[tokio::test]
    async fn a_connection_closed_before_any_answer_is_no_answer_not_an_unreadable_one() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("a connection");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            // Closed with the request read and nothing answered.
        });
        let client = StoreClient::default();
        let url = format!("http://{addr}/metrics");
        let cause = client
            .send("GET", &url, None, MAX_ANSWER_BYTES)
            .await
            .expect_err("no answer");
        assert_eq!(cause, NoAnswer::Closed);
        assert_eq!(
            read_error(&url, cause),
            ReadError::Unreachable {
                url: url.clone(),
                cause: NoAnswer::Closed
            }
        );
    }

    #[tokio::test]
    async fn an_answer_cut_short_or_not_text_is_unreadable() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            for reply in [
                &b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc"[..],
                &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\na\xffb"[..],
            ] {
                let (mut s, _) = listener.accept().await.expect("a connection");
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply).await;
            }
        });
        let client = StoreClient::default();
        let url = format!("http://{addr}/metrics");
        assert_eq!(
            client.send("GET", &url, None, MAX_ANSWER_BYTES).await,
            Err(NoAnswer::Cut)
        );
        assert_eq!(
            client.send("GET", &url, None, MAX_ANSWER_BYTES).await,
            Err(NoAnswer::NotText { at: 1 })
        );
        assert_eq!(
            read_error(&url, NoAnswer::Cut),
            ReadError::Unreadable {
                url: url.clone(),
                cause: BadAnswer::Body(NoAnswer::Cut)
            }
        );
        assert_eq!(
            read_error(&url, NoAnswer::NotText { at: 1 }).to_string(),
            format!(
                "{url} answered something unreadable: the answer is not UTF-8 text (an invalid byte at offset 1)"
            )
        );
    }

    #[tokio::test]
    async fn an_address_that_is_no_url_is_said_so() {
        let client = StoreClient::default();
        assert_eq!(
            client
                .send("GET", "http://a b:1/", None, MAX_ANSWER_BYTES)
                .await,
            Err(NoAnswer::InvalidUrl)
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_an_unknown_host() {
        let client = StoreClient::default();
        assert_eq!(
            client
                .send(
                    "GET",
                    "http://kvcache-no-such-host.invalid:9003/health",
                    None,
                    MAX_ANSWER_BYTES
                )
                .await,
            Err(NoAnswer::UnknownHost)
        );
    }

    #[tokio::test]
    async fn a_drain_is_created_asked_about_and_cancelled_as_the_master_answers() {
        let addr = serve(vec![
            (
                200,
                r#"{"success":true,"job_id":"1-2","status":"CREATED","error_code":0,"error_message":""}"#,
            ),
            (
                200,
                r#"{"success":true,"job_id":"1-2","status_name":"RUNNING","migrated_bytes":1024}"#,
            ),
            (
                409,
                r#"{"success":false,"error_code":-1010,"error_message":"UNAVAILABLE_IN_CURRENT_STATUS"}"#,
            ),
            (404, "404 Not Found"),
        ])
        .await;
        let client = StoreClient::default();
        let req = DrainRequest::new("10.0.0.1:13360", &[]);
        assert_eq!(client.create_drain(&addr, &req).await, Ok("1-2".to_owned()));
        let job = client.drain_job(&addr, "1-2").await.expect("an answer");
        assert_eq!(
            (job.status, job.migrated_bytes),
            (kvcache_render::observe::store::JobStatus::Running, 1024)
        );
        assert!(matches!(
            client.cancel_drain(&addr, "1-2").await,
            Err(ReadError::Refused { code: -1010, .. })
        ));
        let old = client
            .create_drain(&addr, &req)
            .await
            .expect_err("no route");
        assert!(old.not_served());
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_not_a_panic() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = listener.local_addr().expect("its address");
        drop(listener);
        assert!(matches!(
            StoreClient::default()
                .fetch(&format!("http://{addr}/"))
                .await,
            Err(ReadError::Unreachable { .. })
        ));
    }
}
