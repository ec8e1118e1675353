//! `kvcache-operator run`: the controllers, with metrics and health beside them. The webhooks
//! and the operator's own leader election (separate issues) plug in here as further tasks.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use tracing::{error, info};

use crate::backend::{self, Poll};
use crate::telemetry::{self, LogFormat, Metrics, Readiness};

/// `kvcache-operator run` options; each has an environment fallback.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The operator's namespace: where store workloads run and the settings ConfigMap
    /// (`gpustack-settings`) lives.
    #[arg(long, env = "KVCACHE_NAMESPACE", default_value = kvcache_render::resolve::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, env = "KVCACHE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// How soon a backend's store is read again while its figures move (after a Pod, Lease or
    /// endpoint change, or a changed reading); the delay doubles while they hold still.
    #[arg(long, env = "KVCACHE_STORE_POLL_FAST", default_value = "200ms", value_parser = kvcache_elector::parse_duration)]
    pub store_poll_fast: Duration,
    /// The longest delay between two reads of a stable store.
    #[arg(long, env = "KVCACHE_STORE_POLL_STABLE", default_value = "15s", value_parser = kvcache_elector::parse_duration)]
    pub store_poll_stable: Duration,
    /// `text` or `json` logs.
    #[arg(long, env = "KVCACHE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// The operator's image (it delivers `kvcache-elector` into store Pods).
    #[arg(long, env = "KVCACHE_OPERATOR_IMAGE", default_value = kvcache_render::resolve::DEFAULT_OPERATOR_IMAGE)]
    pub operator_image: String,
    /// Reconcile only backends matching this label selector (several operators on one cluster:
    /// tests, a staged rollout). Empty: every backend.
    #[arg(long, env = "KVCACHE_BACKEND_SELECTOR", default_value = "")]
    pub backend_selector: String,
    /// `BACKEND=HOST:PORT`: read that backend's store admin surface (`/health`, `/metrics`) at
    /// this address instead of its leader Service. Only for running outside the cluster.
    #[arg(long = "store-address-override", env = "KVCACHE_STORE_ADDRESS_OVERRIDE", value_delimiter = ',', value_parser = parse_override)]
    pub store_address_overrides: Vec<(String, String)>,
}

fn parse_override(text: &str) -> Result<(String, String), String> {
    let (backend, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not BACKEND=HOST:PORT"))?;
    if backend.is_empty() || !kvcache_api::admission::is_host_port(address) {
        return Err(format!("{text:?} is not BACKEND=HOST:PORT"));
    }
    Ok((backend.to_owned(), address.to_owned()))
}

/// The configuration every controller reads.
#[derive(Clone, Debug)]
pub struct Config {
    /// The operator's namespace.
    pub namespace: String,
    /// The operator's image.
    pub operator_image: String,
    /// Store admin addresses by backend name.
    pub overrides: BTreeMap<String, String>,
    /// Fast re-read delay.
    pub poll_fast: Duration,
    /// Stable re-read delay.
    pub poll_stable: Duration,
    /// Which backends this operator reconciles.
    pub backend_selector: String,
}

/// What the controllers share (one per binary).
pub struct Shared {
    /// The API client.
    pub client: Client,
    /// The configuration.
    pub config: Config,
    /// Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The settings ConfigMap.
    pub settings: Store<ConfigMap>,
    /// Every pool.
    pub pools: Store<KVCachePool>,
    /// Every Binding.
    pub bindings: Store<KVCachePoolBinding>,
    /// Every backend.
    pub backends: Store<KVCacheBackend>,
    /// Every InstanceType.
    pub instance_types: Store<kvcache_api::model::InstanceType>,
    /// Every ModelDeployment.
    pub models: Store<kvcache_api::ModelDeployment>,
    /// Per-backend store polling.
    pub polls: Mutex<HashMap<String, Poll>>,
}

/// What `run` can fail with before the controllers start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No client configuration (kubeconfig or in-cluster).
    #[error("cannot reach the API server: {0}")]
    Client(#[from] kube::Error),
    /// A CRD is not installed.
    #[error(
        "the {crd} CustomResourceDefinition is not installed: apply deploy/crds/ (kubectl apply -f deploy/crds/) and start the operator again"
    )]
    CrdMissing {
        /// The CRD's name.
        crd: String,
    },
    /// The metrics/health server could not start.
    #[error("cannot serve metrics and health on {addr}: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// A reflector store kept up to date by its own task.
fn reflect<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .touched_objects()
        .for_each(|_| futures::future::ready(()));
    tokio::spawn(stream);
    reader
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    telemetry::init_logs(args.log_format);
    let client = Client::try_default().await?;
    // Refuse to start without our CRDs, saying how to install them.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in [
        KVCacheBackend::crd(),
        KVCachePool::crd(),
        KVCachePoolBinding::crd(),
    ] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        if crds.get_opt(&name).await?.is_none() {
            return Err(RunError::CrdMissing { crd: name });
        }
    }
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(Readiness::default());
    let server = {
        let (m, r, addr) = (metrics.clone(), ready.clone(), args.metrics_addr);
        let listener_check = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::Serve { addr, source })?;
        drop(listener_check);
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve(addr, m, r).await {
                error!(error = %e, "the metrics and health server stopped");
            }
        })
    };
    let ns = args.namespace.clone();
    let settings = reflect(
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        watcher::Config::default().fields(&format!(
            "metadata.name={}",
            kvcache_api::settings::SETTINGS_CONFIG_MAP
        )),
    );
    let pools = reflect(
        Api::<KVCachePool>::all(client.clone()),
        watcher::Config::default(),
    );
    let bindings = reflect(
        Api::<KVCachePoolBinding>::all(client.clone()),
        watcher::Config::default(),
    );
    let backends = reflect(
        Api::<KVCacheBackend>::all(client.clone()),
        watcher::Config::default(),
    );
    let instance_types = reflect(
        Api::<kvcache_api::model::InstanceType>::all(client.clone()),
        watcher::Config::default(),
    );
    let models = reflect(
        Api::<kvcache_api::ModelDeployment>::all(client.clone()),
        watcher::Config::default(),
    );
    for (what, wait) in [
        ("settings", settings.wait_until_ready().await.is_ok()),
        ("pools", pools.wait_until_ready().await.is_ok()),
        ("bindings", bindings.wait_until_ready().await.is_ok()),
        ("backends", backends.wait_until_ready().await.is_ok()),
        (
            "instance types",
            instance_types.wait_until_ready().await.is_ok(),
        ),
        ("model deployments", models.wait_until_ready().await.is_ok()),
    ] {
        if !wait {
            error!(what, "a cache never filled");
        }
    }
    let shared = Arc::new(Shared {
        recorder: backend::recorder(client.clone(), std::env::var("POD_NAME").ok()),
        client,
        config: Config {
            namespace: ns,
            operator_image: args.operator_image,
            overrides: args.store_address_overrides.into_iter().collect(),
            poll_fast: args.store_poll_fast,
            poll_stable: args.store_poll_stable.max(args.store_poll_fast),
            backend_selector: args.backend_selector,
        },
        metrics,
        settings,
        pools,
        bindings,
        backends,
        instance_types,
        models,
        polls: Mutex::new(HashMap::new()),
    });
    ready.controllers.store(true, Ordering::Relaxed);
    info!(namespace = %shared.config.namespace, "kvcache-operator running");
    // Pools and Bindings are reconciled by the operator that reconciles every backend (a
    // selector scopes backends only, for several operators on one cluster).
    if shared.config.backend_selector.is_empty() {
        tokio::join!(
            backend::run(shared.clone()),
            crate::pool::run_pools(shared.clone()),
            crate::pool::run_bindings(shared.clone()),
            crate::model::run(shared.clone()),
        );
    } else {
        backend::run(shared).await;
    }
    server.abort();
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_and_durations() {
        assert_eq!(
            parse_override("mooncake-dram=127.0.0.1:9003"),
            Ok(("mooncake-dram".into(), "127.0.0.1:9003".into()))
        );
        assert!(parse_override("mooncake-dram").is_err());
        assert!(parse_override("=127.0.0.1:9003").is_err());
        assert!(parse_override("b=localhost").is_err());
        assert_eq!(
            kvcache_elector::parse_duration("200ms"),
            Ok(Duration::from_millis(200))
        );
    }
}
