//! What can go wrong in this crate: one error, each cause naming the field and the fix.

/// What can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A byte quantity that does not parse.
    #[error(
        "{field}: {value:?} is not a byte size: {reason}; write a whole number of bytes with an optional suffix, such as 512Mi, 8Gi or 4Ti"
    )]
    Quantity {
        /// Where the value sits, e.g. `spec.quota.total`.
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        reason: QuantityError,
    },
    /// A CPU quantity that does not parse.
    #[error(
        "{field}: {value:?} is not a CPU amount: {reason}; write millicores or cores, such as 500m, 1 or 2"
    )]
    Cpu {
        /// Where the value sits, e.g. `spec.connection.managed.leader.resources.requests.cpu`.
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        reason: QuantityError,
    },
    /// A manifest that is not YAML or JSON.
    #[error("{source_name}: document {index} is not valid YAML: {message}")]
    ManifestSyntax {
        /// File or other source name.
        source_name: String,
        /// 1-based document index in the source.
        index: usize,
        /// Why it does not parse, as the YAML or JSON reader words it.
        message: String,
    },
    /// A manifest of a kind this operator does not handle.
    #[error(
        "{source_name}: document {index} is {api_version}/{kind}, which is not one of this operator's kinds (worker.gpustack.ai/v1 KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment, InstanceType)"
    )]
    UnknownKind {
        /// File or other source name.
        source_name: String,
        /// 1-based document index.
        index: usize,
        /// The document's `apiVersion` as written; empty when it has none.
        api_version: String,
        /// The document's `kind` as written; empty when it has none.
        kind: String,
    },
    /// A manifest whose fields do not fit its kind.
    #[error("{source_name}: {kind} {name:?} does not fit its schema: {message}")]
    ManifestShape {
        /// File or other source name.
        source_name: String,
        /// The document's `kind`, one of this operator's five.
        kind: String,
        /// The object's name, if it has one.
        name: String,
        /// What does not fit.
        message: String,
    },
    /// A cluster setting whose value cannot be used.
    #[error("{source_name}: {key}: {value:?} {problem}")]
    SettingValue {
        /// The ConfigMap or file it was read from.
        source_name: String,
        /// The setting's key (`kvcache_api::settings::keys`).
        key: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong with it and what to write instead.
        problem: &'static str,
    },
    /// A CRD that could not be serialised.
    #[error("could not write the {kind} CRD: {message}")]
    CrdOutput {
        /// The CRD's `spec.names.kind`, e.g. `KVCacheBackend`.
        kind: String,
        /// The YAML serialiser's message.
        message: String,
    },
}

/// Why a quantity is not a whole count: each a sentence fragment a user can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Nothing was written.
    #[error("it is empty")]
    Empty,
    /// It starts with `-`: sizes, ceilings and millicores here are never negative.
    #[error("a quantity here cannot be negative")]
    Negative,
    /// No digits before the suffix.
    #[error("it does not start with a number")]
    NoNumber,
    /// `m` on a byte size.
    #[error("milli-units (m) are not whole bytes")]
    MilliBytes,
    /// `e`/`E` followed by something that is not an integer.
    #[error("the exponent in {0:?} is not a whole number")]
    Exponent(String),
    /// A suffix Kubernetes does not know.
    #[error("{0:?} is not a quantity suffix (use Ki, Mi, Gi, Ti, Pi, Ei or k, M, G, T, P, E)")]
    Suffix(String),
    /// Beyond 64 bits.
    #[error("it is larger than a 64-bit count")]
    TooLarge,
    /// A fraction of the unit.
    #[error("it is not a whole number of {0}")]
    NotWhole(&'static str),
}
