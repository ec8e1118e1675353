//! What the operator can fail with: a reconcile (each cause has a label for metrics and logs), or
//! `run` before the controllers start.

use std::net::SocketAddr;

use kvcache_quota::status::{Release, binding_releasable};

/// Why a reconcile or the operator's start failed; [`Error::metric_label`] names the cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a call.
    #[error("{verb} {what}: {source}")]
    Kube {
        /// What was attempted, as the message reads: `get`, `list`, `apply`, `delete`, …
        verb: &'static str,
        /// The object or set of objects, e.g. `Deployment team-a/qwen-chat-server`.
        what: String,
        source: kube::Error,
    },
    /// The backend cannot be rendered (a stored object from before a rule, a missing image).
    #[error("rendering: {0}")]
    Render(#[from] kvcache_render::Error),
    /// A backend's deletion is held while pools use it.
    #[error("deletion held: {}", backend_in_use(backend, used_by))]
    BackendInUse {
        /// The KVCacheBackend's name.
        backend: String,
        /// The pools that use it.
        used_by: Vec<kvcache_api::backend::ObjectRef>,
    },
    /// A backend's teardown waits for its workloads to go.
    #[error("deletion held: {}", teardown_waiting(workloads))]
    TeardownWaiting {
        /// The leader Deployment and member DaemonSets still there, e.g. `DaemonSet x-member-0`.
        workloads: Vec<String>,
    },
    /// A Binding's deletion is held until its release is decided `Released`: its `Releasable`
    /// condition (reason and message) is this release's.
    #[error("deletion held: {}", binding_releasable(binding, release).message)]
    BindingHeld {
        /// The Binding, `namespace/name`.
        binding: String,
        /// Where its release stands: in use, or the master's refusal or silence.
        release: Release,
    },
    /// A pool's deletion is held while Bindings reference it.
    #[error("deletion held: {}", pool_held(pool, bindings))]
    PoolHeld {
        /// The KVCachePool's name.
        pool: String,
        /// The Bindings that reference it, `namespace/name`.
        bindings: Vec<String>,
    },
    /// The finalizer helper failed around the reconcile: adding or removing the finalizer, or
    /// an object without a name.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The webhook's certificate could not be made or read.
    #[error("webhook certificate: {0}")]
    Certificate(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// No client configuration (kubeconfig or in-cluster).
    #[error("cannot reach the API server: {0}")]
    Connect(#[source] kube::Error),
    /// A CRD is not installed.
    #[error(
        "the {crd} CustomResourceDefinition is not installed: apply deploy/crds/ (kubectl apply -f deploy/crds/) and start the operator again"
    )]
    CrdMissing {
        /// The CRD's `metadata.name`, e.g. `kvcachebackends.worker.gpustack.ai`.
        crd: String,
    },
    /// The operator's Lease could not be read or written.
    #[error("the operator's leader election: {0}")]
    Election(#[from] kube_lease_manager::LeaseManagerError),
    /// The Lease was lost while leading: the process exits so that it restarts as a standby.
    #[error("lost the operator's Lease {0} while leading; exiting to restart as a standby")]
    LeaseLost(String),
    /// A `--store-address-override` entry that is not `BACKEND=HOST:PORT` (the entry).
    #[error("{0:?} is not BACKEND=HOST:PORT")]
    NotAnOverride(String),
    /// A `--store-admin-from` entry that is not an address block (the entry).
    #[error("{0:?} is not ADDRESS/PREFIX (an IPv4 or IPv6 CIDR)")]
    NotACidr(String),
    /// A `--store-metrics-from` entry that is not a namespace name (the entry).
    #[error("{0:?} is not a namespace name (lowercase letters, digits and '-', at most 63)")]
    NotANamespace(String),
    /// SIGTERM could not be listened for.
    #[error("cannot listen for SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
    /// An admission request this webhook cannot judge (refused, the reason in its message).
    #[error("{0}")]
    Unjudgeable(#[from] Unjudgeable),
    /// The metrics and health server could not bind its address.
    #[error("cannot serve metrics and health on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl Error {
    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Render(_) => "render",
            Error::BackendInUse { .. }
            | Error::TeardownWaiting { .. }
            | Error::BindingHeld { .. }
            | Error::PoolHeld { .. } => "deletion_held",
            Error::Finalizer(_) => "finalizer",
            Error::Certificate(_) => "certificate",
            Error::Connect(_) => "connect",
            Error::CrdMissing { .. } => "crd_missing",
            Error::Election(_) | Error::LeaseLost(_) => "election",
            Error::Signal(_)
            | Error::Serve { .. }
            | Error::NotAnOverride(_)
            | Error::NotACidr(_)
            | Error::NotANamespace(_) => "start",
            Error::Unjudgeable(_) => "admission",
        }
    }

    /// Why a deletion waits, when this is a held deletion rather than a failure.
    pub fn held(&self) -> Option<String> {
        match self {
            Error::BackendInUse { backend, used_by } => Some(backend_in_use(backend, used_by)),
            Error::TeardownWaiting { workloads } => Some(teardown_waiting(workloads)),
            Error::BindingHeld { binding, release } => {
                Some(binding_releasable(binding, release).message)
            }
            Error::PoolHeld { pool, bindings } => Some(pool_held(pool, bindings)),
            _ => None,
        }
    }

    /// Wraps an error from making, reading or loading the webhook's certificate.
    pub fn certificate(e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Certificate(Box::new(e))
    }
}

/// Why the webhook cannot judge an admission request.
#[derive(Debug, thiserror::Error)]
pub enum Unjudgeable {
    /// A kind of another group was sent to this webhook (its configuration is wrong).
    #[error("kind {kind}.{group} is not judged by this webhook")]
    ForeignKind { kind: String, group: String },
    /// A CREATE or UPDATE without its object.
    #[error("the request carries no object")]
    NoObject,
    /// The object is not one of this operator's kinds, or more than one.
    #[error("the request carries no object of this operator's kinds")]
    NotOurs,
    /// The object does not round-trip through JSON.
    #[error("the object does not encode: {0}")]
    Encode(#[source] serde_json::Error),
    /// The object does not decode as its kind (strict reading of a manifest).
    #[error("the object does not decode: {0}")]
    Decode(#[source] kvcache_api::Error),
    /// The object does not decode as the kind its request names.
    #[error("the object does not decode: {0}")]
    DecodeJson(#[source] serde_json::Error),
}

/// Why a pool's deletion waits: the Bindings that reference it.
fn pool_held(pool: &str, bindings: &[String]) -> String {
    format!(
        "KVCachePool {pool} is referenced by KVCachePoolBinding {}",
        bindings.join(", ")
    )
}

/// Why a backend's deletion waits: the pools that use it.
fn backend_in_use(backend: &str, used_by: &[kvcache_api::backend::ObjectRef]) -> String {
    let pools: Vec<String> = used_by.iter().map(ToString::to_string).collect();
    format!("KVCacheBackend {backend} is used by {}", pools.join(", "))
}

/// Why a backend's teardown waits: the workloads still there.
fn teardown_waiting(workloads: &[String]) -> String {
    format!("waiting for {} to go", workloads.join(", "))
}

/// How soon a failed reconcile is retried when nothing more specific applies.
pub const RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// How soon a failed reconcile is retried: soon for a lost race on the finalizer patch (another
/// writer touched the object between read and patch), a few seconds otherwise.
pub fn retry_after(e: &Error) -> std::time::Duration {
    match e {
        Error::Finalizer(_) => std::time::Duration::from_millis(500),
        _ => RETRY,
    }
}

/// The reconcile's own error out of the finalizer helper's.
pub fn from_finalizer(e: kube::runtime::finalizer::Error<Error>) -> Error {
    match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(Box::new(other)),
    }
}

/// Wraps a client error with the verb and object.
pub fn kube(verb: &'static str, what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { verb, what, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_quota::admin::{NoAnswer, Unanswered};
    use kvcache_quota::status::RequestFailed;

    #[test]
    fn a_held_binding_says_what_its_releasable_condition_says() {
        let release = Release::LedgerRequestFailed(RequestFailed::DeletingEntry {
            tenant: "chat".into(),
            cause: Unanswered {
                method: "DELETE",
                url: "http://m:9003/api/v1/tenant_quotas?tenant_id=chat".into(),
                cause: NoAnswer::TimedOut { after_ms: 1500 },
            },
        });
        let e = Error::BindingHeld {
            binding: "team-a/chat".into(),
            release: release.clone(),
        };
        let why = binding_releasable("team-a/chat", &release).message;
        assert_eq!(
            why,
            "the ledger request for team-a/chat failed and its outcome is unknown, so it is held: releasing tenant chat: no answer to DELETE http://m:9003/api/v1/tenant_quotas?tenant_id=chat: timed out after 1500 ms"
        );
        assert_eq!(e.to_string(), format!("deletion held: {why}"));
        assert_eq!(e.held(), Some(why));
        assert_eq!(e.metric_label(), "deletion_held");
    }

    #[test]
    fn a_held_pool_names_its_bindings() {
        let e = Error::PoolHeld {
            pool: "shared".into(),
            bindings: vec!["team-a/chat".into(), "team-b/code".into()],
        };
        let why = "KVCachePool shared is referenced by KVCachePoolBinding team-a/chat, team-b/code";
        assert_eq!(e.to_string(), format!("deletion held: {why}"));
        assert_eq!(e.held().as_deref(), Some(why));
        assert_eq!(e.metric_label(), "deletion_held");
    }

    #[test]
    fn only_a_held_deletion_is_held() {
        let e = Error::TeardownWaiting {
            workloads: vec!["Deployment x".into(), "DaemonSet x-member-0".into()],
        };
        assert_eq!(
            e.held().as_deref(),
            Some("waiting for Deployment x, DaemonSet x-member-0 to go")
        );
        let e = Error::BackendInUse {
            backend: "mooncake-dram".into(),
            used_by: vec![kvcache_api::backend::ObjectRef {
                kind: "KVCachePool".into(),
                namespace: None,
                name: "shared-dram".into(),
            }],
        };
        assert_eq!(
            e.to_string(),
            "deletion held: KVCacheBackend mooncake-dram is used by KVCachePool shared-dram"
        );
        assert_eq!(e.metric_label(), "deletion_held");
        assert_eq!(Error::LeaseLost("l".into()).held(), None);
    }
}
