//! The end-to-end harness: a real Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler built from published Go modules) and a real Mooncake
//! store (`mooncake_master`, `mc_store_rest_server`, the Python client from PyPI), all as local
//! processes on 127.0.0.1.
//!
//! `cargo xtask test` installs the parts and tells this crate where they are through
//! `KVCACHE_K8S_BIN` and `KVCACHE_MOONCAKE_VENV`; run alone, it looks in the default cache.

pub mod audit;
pub mod cluster;
pub mod engine;
pub mod failover;
pub mod flood;
pub mod holder;
pub mod images;
pub mod nodes;
pub mod operator;
pub mod paths;
pub mod pki;
pub mod pods;
pub mod process;
pub mod prometheus;
pub mod reach;
pub mod rollout;
pub mod slots;
pub mod status;
pub mod store;
pub mod volumes;
pub mod walkthrough;

pub use cluster::{ControlPlane, TestCluster, shared};
pub use store::{Master, MasterOptions, Member, MemberOptions};

/// A kind the tests watch, wait on and apply: a static, cloneable, decodable resource (every
/// Kubernetes and project kind; not `DynamicObject`, whose type is known only at run time).
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// What the harness can fail with; every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A part that `cargo xtask setup` installs is missing.
    #[error(
        "{what} not found at {path}: run `cargo xtask setup` (or `cargo xtask test`), which installs it"
    )]
    Missing {
        /// What is missing.
        what: String,
        /// Where it was looked for.
        path: std::path::PathBuf,
    },
    /// A process that would not start.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// The process's short name, as [`process::Proc`] names it.
        what: String,
        source: std::io::Error,
    },
    /// A process that did not become ready in time.
    #[error("{what} was not ready after {seconds}s; its log is {log}")]
    NotReady {
        /// The process's short name, as [`process::Proc`] names it.
        what: String,
        /// How long we waited.
        seconds: u64,
        /// Where its output went.
        log: String,
    },
    /// File system trouble in the harness's own directories.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("generating certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// The Kubernetes client failed.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be read back.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// An HTTP read against a store process failed.
    #[error("HTTP {url}: {message}")]
    Http {
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The store answered an operation with an error code (a negative result, never a miss).
    #[error("store {op} against {master} returned {code}")]
    Store {
        /// The client step that failed: `setup`, `is_exist` or `get of a present key`.
        op: &'static str,
        /// The master's address the client dialled (`host:port`).
        master: String,
        /// The code the client printed on its `RESULT <step> <code>` line.
        code: i64,
    },
    /// The store's Python client printed no result the harness can read.
    #[error("no readable result from the store's Python client ({status}): {output}")]
    ClientOutput {
        /// The client process's exit status.
        status: String,
        /// The unreadable `RESULT` line, if any, then its last five stderr lines, newest first.
        output: String,
    },
    /// A file the harness reads is not what it should be.
    #[error("{path} is not a valid {what}: {reason}")]
    Invalid {
        path: String,
        /// What it should be.
        what: &'static str,
        /// Why it is not.
        reason: String,
    },
    /// An engine's answer (a completion, its metrics) that the harness cannot read.
    #[error("engine {pod}: {message}")]
    Engine {
        /// `namespace/pod` or the Pod.
        pod: String,
        /// What was wrong with the answer.
        message: String,
    },
    /// A condition a test expects, written in a form that is not `Type=Status[/Reason]`.
    #[error("condition {spec:?} is not Type=Status or Type=Status/Reason: {reason}")]
    ConditionSpec {
        /// What the test wrote.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Waiting on the API server for a state that never came.
    #[error("waiting for {what}: {reason}")]
    Wait {
        /// What was awaited.
        what: String,
        /// Why the wait ended.
        reason: String,
    },
    /// Building a workspace binary the tests run.
    #[error("building {what}: {reason}")]
    Build {
        /// The workspace package built, e.g. `kvcache-operator`.
        what: &'static str,
        /// What failed.
        reason: String,
    },
    /// A step of bringing up a node failed.
    #[error("node set-up: {step}: {message}")]
    NodeSetup {
        /// The step (the first line of its script).
        step: String,
        /// What it printed.
        message: String,
    },
    /// A harness thread panicked.
    #[error("the harness thread panicked")]
    Panicked,
    /// An HTTP request could not be built.
    #[error("building a request for {path}: {source}")]
    Request {
        /// The request's URL path.
        path: String,
        source: http::Error,
    },
}

/// Result with the harness error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}
