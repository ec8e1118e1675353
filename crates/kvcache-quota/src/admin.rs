//! The master's tenant-ledger admin API (`/api/v1/tenant_quotas` on the admin port): what to send
//! and what each answer means. The operator does the HTTP.

use serde::Deserialize;
use serde_json::Value;

use crate::ceiling::BindingCeiling;
use crate::error::Error;

/// The route on the master's admin port (9003 for a managed leader).
pub(crate) const ROUTE: &str = "/api/v1/tenant_quotas";

/// A request to the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// List every tenant.
    List,
    /// One tenant.
    Get(String),
    /// Create or change a tenant's ceiling.
    Upsert {
        /// The tenant id (a Binding's domain name), sent as `tenant_id`.
        tenant: String,
        /// Its ceiling, bytes.
        bytes: u64,
    },
    /// Remove a tenant (refused while it holds data).
    Delete(String),
    /// Remove every object the tenant holds (`POST /api/v1/remove_all?tenant_id=..&force=true`,
    /// leased objects too): the tenant's cached data is gone, other tenants' untouched.
    RemoveObjects(String),
}

/// The master's route that removes objects, all or one tenant's.
pub(crate) const REMOVE_ALL_ROUTE: &str = "/api/v1/remove_all";

impl Request {
    /// The HTTP method: `GET` to list or get, `PUT` to upsert, `DELETE` to delete.
    pub fn method(&self) -> &'static str {
        match self {
            Request::List | Request::Get(_) => "GET",
            Request::Upsert { .. } => "PUT",
            Request::Delete(_) => "DELETE",
            Request::RemoveObjects(_) => "POST",
        }
    }

    /// Path and query, e.g. `/api/v1/tenant_quotas?tenant_id=team-a`.
    pub fn path(&self) -> String {
        match self {
            Request::List => ROUTE.to_owned(),
            Request::Get(t) | Request::Upsert { tenant: t, .. } | Request::Delete(t) => {
                format!("{ROUTE}?tenant_id={}", query_escape(t))
            }
            Request::RemoveObjects(t) => {
                format!(
                    "{REMOVE_ALL_ROUTE}?tenant_id={}&force=true",
                    query_escape(t)
                )
            }
        }
    }

    /// The JSON body, for an upsert.
    pub fn body(&self) -> Option<String> {
        match self {
            Request::Upsert { bytes, .. } => Some(format!("{{\"requested_quota_bytes\":{bytes}}}")),
            _ => None,
        }
    }
}

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One tenant as the ledger reports it, for both entry generations: 0.3.12 reports `used_bytes`,
/// `reserved_bytes` and counts; 0.3.13 replaces them with `charged_bytes` and adds
/// `admission_closed`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct TenantEntry {
    /// The tenant id; for tenants the operator created, a Binding's domain name.
    pub tenant_id: String,
    /// The ceiling the ledger holds.
    #[serde(default)]
    pub requested_quota_bytes: u64,
    /// The grant the master computed.
    #[serde(default)]
    pub effective_quota_bytes: u64,
    /// 0.3.13: bytes charged to the tenant.
    #[serde(default)]
    pub charged_bytes: Option<u64>,
    /// 0.3.12: bytes committed.
    #[serde(default)]
    pub used_bytes: Option<u64>,
    /// 0.3.12: bytes reserved by puts in flight.
    #[serde(default)]
    pub reserved_bytes: Option<u64>,
    /// 0.3.12: objects committed.
    #[serde(default)]
    pub committed_count: Option<u64>,
    /// 0.3.12: objects in the metadata.
    #[serde(default)]
    pub metadata_object_count: Option<u64>,
    /// 0.3.13: new allocations refused for the tenant.
    #[serde(default)]
    pub admission_closed: Option<bool>,
    /// The master's flag: the grant was recut below current holdings.
    #[serde(default)]
    pub over_quota: bool,
    /// The tenant has an explicit policy (not an orphan of a removed one).
    #[serde(default)]
    pub has_explicit_policy: bool,
}

impl TenantEntry {
    /// Bytes the tenant holds, whichever generation answered.
    pub fn usage_bytes(&self) -> u64 {
        self.charged_bytes.or(self.used_bytes).unwrap_or(0)
    }
}

/// A refusal or failure the ledger reports, by its `error_code`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// -600: invalid quota or tenant id.
    #[error("the master refused the request as invalid: {0}")]
    Invalid(String),
    /// -1010: transient (the master is not serving yet); retry.
    #[error(
        "the master cannot answer in its current state (UNAVAILABLE_IN_CURRENT_STATUS); it is starting or not the leader yet, retrying"
    )]
    UnavailableInCurrentStatus,
    /// -1011: the master runs without multi-tenancy: there is no ledger.
    #[error(
        "the master runs without multi-tenancy (UNAVAILABLE_IN_CURRENT_MODE): it keeps no tenant ledger"
    )]
    UnavailableInCurrentMode,
    /// -1702: the tenant still holds objects.
    #[error(
        "the tenant still holds objects (TENANT_NOT_EMPTY); it can be released once its data is evicted or deleted"
    )]
    TenantNotEmpty,
    /// -1503: the policy file could not be written; nothing was applied.
    #[error(
        "the master could not write its tenant policy file (PERSISTENT_FAIL); nothing was applied: check that the policy volume is writable"
    )]
    PersistentFail,
    /// -704: the tenant is absent.
    #[error("the tenant is not in the ledger (OBJECT_NOT_FOUND)")]
    NotFound,
    /// Any other answer.
    #[error("the master answered HTTP {status} with error code {code}: {message}")]
    Other {
        /// HTTP status.
        status: u16,
        /// The store's error code, if any.
        code: i64,
        /// The store's message or the body.
        message: String,
    },
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    success: bool,
    #[serde(default)]
    data: Value,
    #[serde(default)]
    error_code: Option<Value>,
    #[serde(default)]
    error_message: Option<String>,
}

fn code_of(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => match s.as_str() {
            "INVALID_PARAMS" => Some(-600),
            "OBJECT_NOT_FOUND" => Some(-704),
            "UNAVAILABLE_IN_CURRENT_STATUS" => Some(-1010),
            "UNAVAILABLE_IN_CURRENT_MODE" => Some(-1011),
            "PERSISTENT_FAIL" => Some(-1503),
            "TENANT_NOT_EMPTY" => Some(-1702),
            other => other.parse().ok(),
        },
        _ => None,
    }
}

fn envelope(status: u16, body: &str) -> Result<Value, AdminError> {
    let env: Envelope = serde_json::from_str(body).map_err(|e| AdminError::Other {
        status,
        code: 0,
        message: format!(
            "unreadable body ({e}): {}",
            body.chars().take(200).collect::<String>()
        ),
    })?;
    if env.success && (200..300).contains(&status) {
        return Ok(env.data);
    }
    let code = env.error_code.as_ref().and_then(code_of).unwrap_or(0);
    let message = env.error_message.unwrap_or_default();
    Err(match code {
        -600 => AdminError::Invalid(message),
        -704 => AdminError::NotFound,
        -1010 => AdminError::UnavailableInCurrentStatus,
        -1011 => AdminError::UnavailableInCurrentMode,
        -1503 => AdminError::PersistentFail,
        -1702 => AdminError::TenantNotEmpty,
        _ => AdminError::Other {
            status,
            code,
            message,
        },
    })
}

/// Decodes the answer to [`Request::List`].
pub fn decode_list(status: u16, body: &str) -> Result<Vec<TenantEntry>, AdminError> {
    let data = envelope(status, body)?;
    serde_json::from_value(data).map_err(|e| AdminError::Other {
        status,
        code: 0,
        message: format!("the tenant list does not decode: {e}"),
    })
}

/// Decodes the answer to [`Request::Get`] or [`Request::Upsert`].
pub fn decode_entry(status: u16, body: &str) -> Result<TenantEntry, AdminError> {
    let data = envelope(status, body)?;
    serde_json::from_value(data).map_err(|e| AdminError::Other {
        status,
        code: 0,
        message: format!("the tenant entry does not decode: {e}"),
    })
}

/// Decodes the answer to [`Request::Delete`].
pub fn decode_ack(status: u16, body: &str) -> Result<(), AdminError> {
    envelope(status, body).map(|_| ())
}

/// Decodes the answer to [`Request::RemoveObjects`]: how many objects the master removed
/// (`{"success":true,"removed_count":N}`).
pub fn decode_removed(status: u16, body: &str) -> Result<u64, AdminError> {
    envelope(status, body)?;
    #[derive(Deserialize)]
    struct Removed {
        removed_count: u64,
    }
    serde_json::from_str::<Removed>(body)
        .map(|r| r.removed_count)
        .map_err(|e| AdminError::Other {
            status,
            code: 0,
            message: format!("the removal's answer does not decode: {e}"),
        })
}

/// The Bindings whose ceilings a pass must write: one per tenant (the first Binding naming it;
/// a raced duplicate claim is reported elsewhere, not written twice), and of those only the
/// ones the ledger does not already hold as the tenant's explicit policy. `listed` is `None`
/// when the ledger was not read, and then every tenant is written.
///
/// Rewriting an unchanged ceiling is not free: the master's policy update closes every
/// tenant's admission until it has recomputed the grants, and a put arriving in between fails
/// with `TENANT_NOT_REGISTERED` (Mooncake's `TenantQuotaTable::ApplyTenantPolicies`). Writing
/// every ceiling on every pass failed up to 6 of 4,096 puts of an idle client in `bench
/// transfer` (CHANGELOG.md, "Fixed").
pub fn ceilings_to_write<'a>(
    listed: Option<&[TenantEntry]>,
    views: &'a [BindingCeiling],
) -> Vec<&'a BindingCeiling> {
    let mut seen = std::collections::BTreeSet::new();
    views
        .iter()
        .filter(|v| seen.insert(v.tenant.as_str()))
        .filter(|v| {
            !listed.is_some_and(|entries| {
                entries.iter().any(|e| {
                    e.tenant_id == v.tenant
                        && e.has_explicit_policy
                        && e.requested_quota_bytes == v.ceiling_bytes
                })
            })
        })
        .collect()
}

/// A ledger request the master did not answer: which request, and why no answer came.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no answer to {method} {url}: {cause}")]
pub struct Unanswered {
    /// The request's HTTP method, as [`Request::method`] gives it.
    pub method: &'static str,
    /// The URL called, e.g. `http://kv-leader.kvcache-system:9003/api/v1/tenant_quotas`.
    pub url: String,
    /// Why no answer came.
    pub cause: NoAnswer,
}

/// Why a request to a store brought back no answer the operator could read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoAnswer {
    /// The URL cannot be sent: an external store's address that is not `host:port`.
    #[error("the URL is not valid")]
    InvalidUrl,
    /// The host name does not resolve: the master's Service is gone, or cluster DNS is down.
    #[error("its host name does not resolve")]
    UnknownHost,
    /// Nothing listens on the port: the master is down, restarting or not serving yet.
    #[error("connection refused")]
    Refused,
    /// No route to the host or its network.
    #[error("no route to the host")]
    NoRoute,
    /// The connection, or the whole answer, did not come within the client's timeout.
    #[error("timed out after {after_ms} ms")]
    TimedOut {
        /// The client's timeout, milliseconds.
        after_ms: u64,
    },
    /// The connection closed before any answer came (a master stopping, a stale kept-alive
    /// connection): no answer, as a refused one.
    #[error("the connection closed before any answer")]
    Closed,
    /// The connection closed before the answer was complete.
    #[error("the connection closed before the answer was complete")]
    Cut,
    /// The answer's body is not UTF-8 text.
    #[error("the answer is not UTF-8 text (an invalid byte at offset {at})")]
    NotText {
        /// The offset of the first invalid byte in the body.
        at: usize,
    },
    /// The answer's body ran past the client's cap (a store or an engine answering more than
    /// any real answer holds): the rest is not read.
    #[error("the answer is larger than the client reads ({limit_bytes} bytes)")]
    TooLarge {
        /// The client's cap on one answer's body, bytes.
        limit_bytes: u64,
    },
    /// Any other transport failure, in the HTTP client's words (its error and each cause).
    #[error("{0}")]
    Transport(String),
}

/// Why a ledger request brought back nothing usable: the master's refusal, or no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerFailure {
    /// The master answered with an error code.
    #[error(transparent)]
    Refused(#[from] AdminError),
    /// The master did not answer.
    #[error(transparent)]
    Unanswered(#[from] Unanswered),
}

/// The outcome of a ledger read, as the pool's conditions see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The ledger answered with its tenants.
    Listed(Vec<TenantEntry>),
    /// The master keeps no ledger (declared or reported).
    NoLedger,
    /// The list failed: refused or unanswered (`QuotaLedgerAvailable=False/LedgerUnreachable`).
    Unreachable(LedgerFailure),
    /// Not asked yet.
    NotObserved,
}

impl Outcome {
    /// The outcome of a list call: its decoded answer, or [`Unanswered`].
    pub fn from_list(result: Result<Result<Vec<TenantEntry>, AdminError>, Unanswered>) -> Self {
        match result {
            Ok(Ok(entries)) => Outcome::Listed(entries),
            Ok(Err(AdminError::UnavailableInCurrentMode)) => Outcome::NoLedger,
            Ok(Err(e)) => Outcome::Unreachable(e.into()),
            Err(e) => Outcome::Unreachable(e.into()),
        }
    }
}

/// Keeps `Error` reachable for callers who want one error type.
impl From<AdminError> for Error {
    fn from(e: AdminError) -> Self {
        Error::Unreadable {
            context: "tenant ledger".into(),
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(binding: &str, tenant: &str, ceiling_bytes: u64) -> BindingCeiling {
        BindingCeiling {
            binding: binding.into(),
            tenant: tenant.into(),
            ceiling_bytes,
        }
    }

    fn held(tenant: &str, bytes: u64, explicit: bool) -> TenantEntry {
        TenantEntry {
            tenant_id: tenant.into(),
            requested_quota_bytes: bytes,
            has_explicit_policy: explicit,
            ..TenantEntry::default()
        }
    }

    #[test]
    fn only_ceilings_the_ledger_does_not_hold_are_written() {
        let views = [
            view("a/kept", "team-a", 1 << 30),
            view("b/raised", "team-b", 2 << 30),
            view("c/new", "team-c", 1 << 30),
            view("d/orphan", "team-d", 1 << 30),
            view("a/second", "team-a", 4 << 30),
        ];
        let listed = [
            held("team-a", 1 << 30, true),
            held("team-b", 1 << 30, true),
            // Charged bytes left after its policy went: the ceiling is not in force.
            held("team-d", 1 << 30, false),
        ];
        let due: Vec<&str> = ceilings_to_write(Some(&listed), &views)
            .iter()
            .map(|v| v.binding.as_str())
            .collect();
        assert_eq!(due, ["b/raised", "c/new", "d/orphan"]);
    }

    #[test]
    fn an_unread_ledger_gets_every_tenant_once() {
        let views = [
            view("a/one", "team-a", 1),
            view("a/two", "team-a", 2),
            view("b/one", "team-b", 1),
        ];
        let due: Vec<&str> = ceilings_to_write(None, &views)
            .iter()
            .map(|v| v.binding.as_str())
            .collect();
        assert_eq!(due, ["a/one", "b/one"]);
    }

    #[test]
    fn requests_are_what_the_master_expects() {
        let up = Request::Upsert {
            tenant: "team-a".into(),
            bytes: 1 << 30,
        };
        assert_eq!(up.method(), "PUT");
        assert_eq!(up.path(), "/api/v1/tenant_quotas?tenant_id=team-a");
        assert_eq!(
            up.body().as_deref(),
            Some("{\"requested_quota_bytes\":1073741824}")
        );
        assert_eq!(Request::List.path(), "/api/v1/tenant_quotas");
        assert_eq!(
            Request::Delete("a b".into()).path(),
            "/api/v1/tenant_quotas?tenant_id=a%20b"
        );
        assert_eq!(Request::Delete("x".into()).method(), "DELETE");
        let remove = Request::RemoveObjects("team-a".into());
        assert_eq!(
            (remove.method(), remove.path().as_str(), remove.body()),
            (
                "POST",
                "/api/v1/remove_all?tenant_id=team-a&force=true",
                None
            )
        );
    }

    #[test]
    fn a_removal_answers_its_count_or_its_refusal() {
        // As the 0.3.13.post1 master answered on loopback for one tenant of two.
        assert_eq!(
            decode_removed(200, r#"{"success":true,"removed_count":5}"#),
            Ok(5)
        );
        assert_eq!(
            decode_removed(
                503,
                r#"{"success":false,"error_code":-1010,"error_message":"x"}"#
            ),
            Err(AdminError::UnavailableInCurrentStatus)
        );
        assert!(matches!(
            decode_removed(200, r#"{"success":true}"#),
            Err(AdminError::Other { .. })
        ));
    }

    #[test]
    fn both_entry_generations_decode() {
        // 0.3.13, as the real master answered on loopback.
        let new = r#"{"success":true,"data":[{"tenant_id":"default","requested_quota_bytes":67108864,"effective_quota_bytes":44739243,"charged_bytes":4096,"admission_closed":false,"over_quota":false,"has_explicit_policy":true}]}"#;
        let e = &decode_list(200, new).expect("decodes")[0];
        assert_eq!(
            (e.effective_quota_bytes, e.usage_bytes()),
            (44_739_243, 4096)
        );
        assert_eq!(e.admission_closed, Some(false));
        // 0.3.12.
        let old = r#"{"success":true,"data":{"tenant_id":"team-a","requested_quota_bytes":100,"effective_quota_bytes":50,"used_bytes":40,"reserved_bytes":5,"committed_count":1,"metadata_object_count":1,"over_quota":true,"has_explicit_policy":true}}"#;
        let e = decode_entry(200, old).expect("decodes");
        assert_eq!(
            (e.usage_bytes(), e.reserved_bytes, e.over_quota),
            (40, Some(5), true)
        );
        assert_eq!(e.committed_count, Some(1));
    }

    #[test]
    fn every_error_code_decodes() {
        let body = |code: &str, msg: &str| {
            format!(r#"{{"success":false,"error_code":{code},"error_message":"{msg}"}}"#)
        };
        let cases = [
            (
                400,
                body("-600", "Tenant quota must be in [1, 2^63 - 1] bytes"),
                AdminError::Invalid("Tenant quota must be in [1, 2^63 - 1] bytes".into()),
            ),
            (
                409,
                body("-1010", "UNAVAILABLE_IN_CURRENT_STATUS"),
                AdminError::UnavailableInCurrentStatus,
            ),
            (
                409,
                body("-1011", "UNAVAILABLE_IN_CURRENT_MODE"),
                AdminError::UnavailableInCurrentMode,
            ),
            (
                409,
                body("-1702", "TENANT_NOT_EMPTY"),
                AdminError::TenantNotEmpty,
            ),
            (
                500,
                body("-1503", "PERSISTENT_FAIL"),
                AdminError::PersistentFail,
            ),
            (404, body("-704", "OBJECT_NOT_FOUND"), AdminError::NotFound),
            (
                409,
                body("\"TENANT_NOT_EMPTY\"", "x"),
                AdminError::TenantNotEmpty,
            ),
        ];
        for (status, body, want) in cases {
            assert_eq!(decode_ack(status, &body), Err(want.clone()), "{body}");
            assert_eq!(decode_list(status, &body), Err(want), "{body}");
        }
        let odd = decode_ack(502, "<html>bad gateway</html>").expect_err("not JSON");
        assert!(
            matches!(odd, AdminError::Other { status: 502, .. }),
            "{odd:?}"
        );
        assert!(decode_ack(200, r#"{"success":true,"data":null}"#).is_ok());
    }

    #[test]
    fn outcomes() {
        assert_eq!(
            Outcome::from_list(Ok(Err(AdminError::UnavailableInCurrentMode))),
            Outcome::NoLedger
        );
        assert_eq!(Outcome::from_list(Ok(Ok(vec![]))), Outcome::Listed(vec![]));
        let refused = Outcome::from_list(Ok(Err(AdminError::PersistentFail)));
        assert_eq!(
            refused,
            Outcome::Unreachable(LedgerFailure::Refused(AdminError::PersistentFail))
        );
        let unanswered = Unanswered {
            method: "GET",
            url: "http://m:9003/api/v1/tenant_quotas".into(),
            cause: NoAnswer::Refused,
        };
        assert_eq!(
            Outcome::from_list(Err(unanswered.clone())),
            Outcome::Unreachable(LedgerFailure::Unanswered(unanswered))
        );
    }

    #[test]
    fn a_ledger_failure_reads_as_its_cause() {
        assert_eq!(
            LedgerFailure::from(AdminError::PersistentFail).to_string(),
            AdminError::PersistentFail.to_string()
        );
        let unanswered = Unanswered {
            method: "DELETE",
            url: "http://m:9003/api/v1/tenant_quotas?tenant_id=chat".into(),
            cause: NoAnswer::TimedOut { after_ms: 1500 },
        };
        assert_eq!(
            LedgerFailure::from(unanswered).to_string(),
            "no answer to DELETE http://m:9003/api/v1/tenant_quotas?tenant_id=chat: timed out after 1500 ms"
        );
    }
}
