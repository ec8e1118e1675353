//! Reading and writing the Lease through the API server.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Error as KubeError};

use crate::election::LeaseRecord;

/// The Lease annotation where the holder publishes its store address.
pub const ADDRESS_ANNOTATION: &str = "kvcache.gpustack.ai/leader-address";
pub use kvcache_api::STORE_VERSION_ANNOTATION;

/// Why a Lease call failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone else wrote the Lease first.
    #[error("the Lease changed under us (someone else wrote it first)")]
    Conflict,
    /// RBAC refuses the call.
    #[error(
        "permission denied: this Pod's ServiceAccount may not {verb} leases.coordination.k8s.io {name:?} in namespace {namespace} ({message}); grant get, create and update on that Lease to the leader's ServiceAccount (the operator renders this Role as <backend>-leader)"
    )]
    Forbidden {
        /// The call refused: `get`, `create` or `update`.
        verb: &'static str,
        /// Name of the Lease (`<backend>-leader`).
        name: String,
        /// The Lease's namespace, where the Role granting access must be.
        namespace: String,
        /// The API server's message.
        message: String,
    },
    /// The call took longer than the elector may wait for it (see
    /// `Election::call_budget`): counted as a failed call, whatever the API server did with it.
    #[error("{verb} Lease {name}: no answer within {after:?}")]
    TimedOut {
        /// The call that was cut: `get`, `create` or `update`.
        verb: &'static str,
        /// Name of the Lease (`<backend>-leader`).
        name: String,
        /// How long the elector waited.
        after: std::time::Duration,
    },
    /// Anything else (the API server unreachable, say).
    #[error("{verb} Lease {name}: {source}")]
    Api {
        /// The call that failed: `get`, `create` or `update`.
        verb: &'static str,
        /// Name of the Lease (`<backend>-leader`).
        name: String,
        /// What the client reported: a transport failure, or an API error other than 403 and 409.
        source: KubeError,
    },
}

/// One Lease in one namespace.
#[derive(Clone)]
pub struct LeaseClient {
    api: Api<Lease>,
    store_version: Option<String>,
    name: String,
    namespace: String,
    /// The metadata other writers own (the operator's labels and owner reference), as last
    /// read: a replace carries them, so the Lease keeps its owner (the API server refuses an
    /// owner reference changed by an account that may not delete the object, where owner
    /// references are enforced) and the labels the operator finds it by.
    kept: std::sync::Arc<std::sync::Mutex<ObjectMeta>>,
}

/// The metadata of `lease` that the elector does not write itself.
fn others(lease: &Lease) -> ObjectMeta {
    ObjectMeta {
        labels: lease.metadata.labels.clone(),
        owner_references: lease.metadata.owner_references.clone(),
        annotations: lease.metadata.annotations.clone(),
        ..Default::default()
    }
}

/// The election's view of a Lease object.
pub fn to_record(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity,
        address: lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ADDRESS_ANNOTATION).cloned()),
        duration_seconds: spec.lease_duration_seconds,
        transitions: spec.lease_transitions.unwrap_or(0),
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        resource_version: lease.metadata.resource_version.clone(),
    }
}

impl LeaseClient {
    /// The Lease `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        LeaseClient {
            api: Api::namespaced(client, namespace),
            store_version: None,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            kept: Default::default(),
        }
    }

    /// Runs `call` cut at `limit`: a renewal that hangs must not keep a master serving past the
    /// point where a standby may take over (`Election::call_budget`).
    async fn bounded<T>(
        &self,
        verb: &'static str,
        limit: std::time::Duration,
        call: impl std::future::Future<Output = Result<T, KubeError>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(limit, call).await {
            Ok(result) => result.map_err(|e| self.fail(verb, e)),
            Err(_) => Err(LeaseError::TimedOut {
                verb,
                name: self.name.clone(),
                after: limit,
            }),
        }
    }

    fn fail(&self, verb: &'static str, e: KubeError) -> LeaseError {
        match &e {
            KubeError::Api(s) if s.code == 403 => LeaseError::Forbidden {
                verb,
                name: self.name.clone(),
                namespace: self.namespace.clone(),
                message: s.message.clone(),
            },
            KubeError::Api(s) if s.code == 409 => LeaseError::Conflict,
            _ => LeaseError::Api {
                verb,
                name: self.name.clone(),
                source: e,
            },
        }
    }

    /// Publishes `version` (the master binary's own answer) on every write while holding.
    pub fn with_store_version(mut self, version: Option<String>) -> Self {
        self.store_version = version;
        self
    }

    /// The Lease API in its namespace (for watching the one Lease).
    pub fn api(&self) -> &Api<Lease> {
        &self.api
    }

    /// Name of the one Lease this client reads and writes.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Lease, or `None` when it does not exist; the call is cut at `limit`.
    pub async fn get(&self, limit: std::time::Duration) -> Result<Option<LeaseRecord>, LeaseError> {
        let l = self
            .bounded("get", limit, self.api.get_opt(&self.name))
            .await?;
        if let Some(l) = &l {
            self.keep(l);
        }
        Ok(l.as_ref().map(to_record))
    }

    fn keep(&self, lease: &Lease) {
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = others(lease);
    }

    /// Writes `record` (create when it has no resourceVersion, replace otherwise); the call is
    /// cut at `limit`.
    pub async fn write(
        &self,
        record: &LeaseRecord,
        acquire: bool,
        limit: std::time::Duration,
    ) -> Result<LeaseRecord, LeaseError> {
        let now = MicroTime(Timestamp::now());
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Annotations of other writers stay; the elector's own are written afresh.
        let mut annotations: BTreeMap<String, String> = kept
            .annotations
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k != ADDRESS_ANNOTATION && k != STORE_VERSION_ANNOTATION)
            .collect();
        if let Some(a) = &record.address {
            annotations.insert(ADDRESS_ANNOTATION.to_owned(), a.clone());
        }
        if let (Some(v), Some(_)) = (&self.store_version, record.holder()) {
            annotations.insert(STORE_VERSION_ANNOTATION.to_owned(), v.clone());
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: record.resource_version.clone(),
                annotations: Some(annotations),
                labels: kept.labels,
                owner_references: kept.owner_references,
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: record.holder.clone(),
                lease_duration_seconds: record.duration_seconds,
                lease_transitions: Some(record.transitions),
                acquire_time: acquire.then(|| now.clone()),
                renew_time: record.holder().map(|_| now.clone()),
                ..Default::default()
            }),
        };
        let written: Lease = match &record.resource_version {
            None => {
                self.bounded(
                    "create",
                    limit,
                    self.api.create(&PostParams::default(), &lease),
                )
                .await?
            }
            Some(_) => {
                self.bounded(
                    "update",
                    limit,
                    self.api.replace(&self.name, &PostParams::default(), &lease),
                )
                .await?
            }
        };
        self.keep(&written);
        Ok(to_record(&written))
    }
}
