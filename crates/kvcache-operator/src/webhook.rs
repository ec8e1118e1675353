//! The admission webhook, served over HTTPS by `kvcache-operator run` on every replica.
//!
//! `/validate` judges the five kinds: the single-object rules of `kvcache-api::admission`
//! (`validate_create` / `validate_update`, with the cluster's settings) and the cross-object
//! rules of `kvcache-api::admission::cross`. What a request gets back is decided by
//! [`validate`], a pure function of the request and a snapshot of the related objects; the
//! handler only takes the snapshot and encodes the answer.
//!
//! Where lookups come from (catalogue 2.4.10 asks for live reads where a rule needs them):
//! - settings, pools, backends, Bindings: the operator's reflector stores. A Binding created in
//!   the same instant as another one on the same domain can pass both checks; that race is
//!   what `DomainExclusive=False/DomainClaimedByMultipleBindings` reports afterwards (2.3.6).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{Status, StatusCause, StatusDetails};
use kvcache_api::admission::cross::{self, Claimant, LedgerKnown};
use kvcache_api::admission::{Admission, Verdict};
use kvcache_api::model::InstanceType;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment, Settings};
use tracing::{info, warn};

use crate::certs::Presented;
use crate::run::Shared;

/// The group every judged kind belongs to.
pub const GROUP: &str = "worker.gpustack.ai";

/// The objects the cross-object rules read.
#[derive(Clone, Debug, Default)]
pub struct World {
    /// Every backend.
    pub backends: Vec<Arc<KVCacheBackend>>,
    /// Every pool.
    pub pools: Vec<Arc<KVCachePool>>,
    /// Every Binding.
    pub bindings: Vec<Arc<KVCachePoolBinding>>,
}

impl World {
    fn backend(&self, name: &str) -> Option<&KVCacheBackend> {
        self.backends
            .iter()
            .find(|b| b.name_any() == name)
            .map(|b| &**b)
    }

    fn pool(&self, name: &str) -> Option<&KVCachePool> {
        self.pools
            .iter()
            .find(|p| p.name_any() == name)
            .map(|p| &**p)
    }

    /// The backend a pool names, if the pool exists.
    fn backend_of_pool(&self, pool: &str) -> Option<&str> {
        self.pool(pool).and_then(|p| p.spec.backend())
    }

    /// What is known of a backend's ledger: a pool on it observed it, or the backend declares
    /// it off.
    fn ledger(&self, backend: &str) -> LedgerKnown {
        if self
            .backend(backend)
            .and_then(|b| b.spec.connection.managed.as_ref())
            .is_some_and(|m| !m.leader.multi_tenancy)
        {
            return LedgerKnown::Absent;
        }
        let observed = self
            .pools
            .iter()
            .filter(|p| p.spec.backend() == Some(backend))
            .filter_map(|p| p.status.as_ref())
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == "QuotaLedgerAvailable");
        match observed {
            Some(c) if c.status == "True" => LedgerKnown::Present,
            Some(c) if c.reason == "MultiTenancyDisabled" => LedgerKnown::Absent,
            _ => LedgerKnown::Unknown,
        }
    }
}

fn decode<K: serde::de::DeserializeOwned>(o: &DynamicObject) -> Result<K, String> {
    serde_json::to_value(o)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("the object does not decode: {e}"))
}

/// The objects of a request, decoded.
fn objects<K: serde::de::DeserializeOwned>(
    req: &AdmissionRequest<DynamicObject>,
) -> Result<(K, Option<K>), String> {
    let new = req
        .object
        .as_ref()
        .ok_or_else(|| "the request carries no object".to_owned())
        .and_then(decode)?;
    let old = match (&req.operation, &req.old_object) {
        (Operation::Update, Some(o)) => Some(decode(o)?),
        _ => None,
    };
    Ok((new, old))
}

/// The single-object rules for `new` (against `old` on an update).
fn judge<K: Admission>(new: &K, old: Option<&K>, settings: &Settings) -> Verdict {
    match old {
        Some(old) => new.validate_update(old, settings),
        None => new.validate_create(settings),
    }
}

fn merge(mut a: Verdict, b: Verdict) -> Verdict {
    a.violations.extend(b.violations);
    a.warnings.extend(b.warnings);
    a
}

/// The verdict on one request of one of our kinds.
pub fn verdict(
    req: &AdmissionRequest<DynamicObject>,
    settings: &Settings,
    world: &World,
) -> Result<Verdict, String> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(Verdict::default());
    }
    Ok(match req.kind.kind.as_str() {
        "KVCacheBackend" => {
            let (new, old) = objects::<KVCacheBackend>(req)?;
            judge(&new, old.as_ref(), settings)
        }
        "KVCachePool" => {
            let (new, old) = objects::<KVCachePool>(req)?;
            let v = judge(&new, old.as_ref(), settings);
            if old.is_none() {
                let backend = new.spec.backend().and_then(|b| world.backend(b));
                merge(v, cross::pool_against(&new, backend))
            } else {
                v
            }
        }
        "KVCachePoolBinding" => {
            let (new, old) = objects::<KVCachePoolBinding>(req)?;
            let v = judge(&new, old.as_ref(), settings);
            if old.is_none() {
                let backend = world.backend_of_pool(&new.spec.pool_ref.name);
                let claims: Vec<Claimant<'_>> = world
                    .bindings
                    .iter()
                    .filter(|b| b.metadata.deletion_timestamp.is_none())
                    .filter_map(|b| {
                        world
                            .backend_of_pool(&b.spec.pool_ref.name)
                            .map(|backend| Claimant {
                                binding: b,
                                backend,
                            })
                    })
                    .collect();
                let ledger = backend.map_or(LedgerKnown::Unknown, |b| world.ledger(b));
                merge(v, cross::binding_against(&new, backend, &claims, ledger))
            } else {
                v
            }
        }
        "ModelDeployment" => {
            let (new, old) = objects::<ModelDeployment>(req)?;
            judge(&new, old.as_ref(), settings)
        }
        "InstanceType" => {
            let (new, old) = objects::<InstanceType>(req)?;
            judge(&new, old.as_ref(), settings)
        }
        other => return Err(format!("kind {other} is not judged by this webhook")),
    })
}

/// The answer to a request: admitted with warnings, or refused with a 422 `Invalid` status
/// whose causes name each field (as the API server's own validation does).
pub fn validate(
    req: &AdmissionRequest<DynamicObject>,
    settings: &Settings,
    world: &World,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req);
    let v = match verdict(req, settings, world) {
        Ok(v) => v,
        Err(why) => return response.deny(why),
    };
    if !v.warnings.is_empty() {
        response.warnings = Some(v.warnings.clone());
    }
    if v.allowed() {
        return response;
    }
    let kind = req.kind.kind.clone();
    let name = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.name.clone())
        .unwrap_or_else(|| req.name.clone());
    let message = format!(
        "{kind}.{GROUP} \"{name}\" is invalid: {}",
        v.violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let causes = v
        .violations
        .iter()
        .map(|violation| StatusCause {
            reason: if violation.message.starts_with("Duplicate value") {
                "FieldValueDuplicate".into()
            } else {
                "FieldValueInvalid".into()
            },
            message: violation.message.clone(),
            field: violation.field.clone(),
        })
        .collect();
    response.allowed = false;
    response.result = Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(StatusDetails {
            name,
            group: GROUP.into(),
            kind,
            uid: String::new(),
            causes,
            retry_after_seconds: 0,
        });
    response
}

/// What the handlers read.
pub struct Webhook {
    /// The operator's shared state (stores, metrics).
    pub shared: Arc<Shared>,
}

impl Webhook {
    fn world(&self) -> World {
        World {
            backends: self.shared.backends.state(),
            pools: self.shared.pools.state(),
            bindings: self.shared.bindings.state(),
        }
    }
}

async fn validate_handler(
    State(hook): State<Arc<Webhook>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let started = Instant::now();
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "an AdmissionReview without a request");
            return axum::Json(AdmissionResponse::invalid(e.to_string()).into_review());
        }
    };
    let settings = crate::backend::settings(&hook.shared);
    let response = validate(&req, &settings, &hook.world());
    let outcome = if response.allowed {
        "allowed"
    } else {
        "refused"
    };
    hook.shared
        .metrics
        .webhook("validate", outcome, started.elapsed().as_secs_f64());
    info!(
        kind = %req.kind.kind,
        namespace = req.namespace.as_deref().unwrap_or(""),
        name = %req.name,
        operation = ?req.operation,
        outcome,
        "admission"
    );
    axum::Json(response.into_review())
}

/// The webhook's routes.
pub fn router(hook: Arc<Webhook>) -> Router {
    Router::new()
        .route("/validate", post(validate_handler))
        .with_state(hook)
}

/// Serves the routes over TLS with the presented certificate until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    presented: Arc<Presented>,
) -> std::io::Result<()> {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_no_client_auth()
    .with_cert_resolver(presented);
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, "webhook serving");
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "accepting a webhook connection");
                continue;
            }
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = TowerToHyperService::new(router);
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "webhook connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        kind: &str,
        operation: &str,
        object: serde_json::Value,
    ) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "1", "kind": {"group": GROUP, "version": "v1", "kind": kind},
                "resource": {"group": GROUP, "version": "v1", "resource": "x"},
                "name": object["metadata"]["name"], "namespace": object["metadata"]["namespace"],
                "operation": operation, "userInfo": {}, "object": object
            }
        }))
        .expect("a review");
        review.try_into().expect("a request")
    }

    fn binding(ns: &str, domain: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "team", "namespace": ns},
            "spec": {"poolRef": {"name": "shared"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"name": domain, "blockSize": 64, "dtype": "bfloat16"}}
        })
    }

    fn world() -> World {
        let pool: KVCachePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "shared"},
            "spec": {"backends": ["m"], "quota": {"total": "1Gi"}}
        }))
        .expect("pool");
        let first: KVCachePoolBinding =
            serde_json::from_value(binding("team-a", "qwen")).expect("binding");
        World {
            backends: vec![],
            pools: vec![Arc::new(pool)],
            bindings: vec![Arc::new(first)],
        }
    }

    #[test]
    fn a_duplicate_domain_is_a_422_naming_the_field_as_a_duplicate() {
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-b", "qwen")),
            &Settings::default(),
            &world(),
        );
        assert!(!r.allowed);
        assert_eq!(r.result.code, 422);
        assert_eq!(r.result.reason, "Invalid");
        assert!(r.result.message.starts_with("KVCachePoolBinding.worker.gpustack.ai \"team\" is invalid: spec.domain.name: Duplicate value"), "{}", r.result.message);
        let details = r.result.details.expect("details");
        assert_eq!(details.causes[0].field, "spec.domain.name");
        assert_eq!(details.causes[0].reason, "FieldValueDuplicate");
        // Another domain passes (with the unproven-ledger warning: no pool observed it).
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-b", "llama")),
            &Settings::default(),
            &world(),
        );
        assert!(r.allowed, "{:?}", r.result);
        assert!(
            r.warnings
                .is_some_and(|w| w.iter().any(|w| w.contains("tenant compatibility floor")))
        );
    }

    #[test]
    fn an_update_is_judged_by_the_single_object_rules_only_and_a_delete_passes() {
        let mut req = request("KVCachePoolBinding", "UPDATE", binding("team-b", "qwen"));
        req.old_object = req.object.clone();
        assert!(validate(&req, &Settings::default(), &world()).allowed);
        let req = request("KVCachePoolBinding", "DELETE", binding("team-b", "qwen"));
        assert!(validate(&req, &Settings::default(), &world()).allowed);
    }

    #[test]
    fn an_object_that_does_not_decode_is_refused_saying_so_not_a_panic() {
        let mut broken = binding("team-b", "qwen");
        broken["spec"]["quota"] = serde_json::json!("lots");
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", broken),
            &Settings::default(),
            &world(),
        );
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("does not decode"),
            "{}",
            r.result.message
        );
        let r = validate(
            &request("Pod", "CREATE", binding("team-b", "qwen")),
            &Settings::default(),
            &world(),
        );
        assert!(
            !r.allowed && r.result.message.contains("not judged"),
            "{}",
            r.result.message
        );
    }
}
