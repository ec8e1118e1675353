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
use tracing::{error, info, warn};

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
    /// How often a pool re-reads its master's ledger while nothing changes (grants move with
    /// capacity; a backend status change re-reads at once).
    #[arg(long, env = "KVCACHE_LEDGER_INTERVAL", default_value = "15s", value_parser = kvcache_elector::parse_duration)]
    pub ledger_interval: Duration,
    /// How often a ModelDeployment is reconciled while nothing it watches changes.
    #[arg(long, env = "KVCACHE_MODEL_RESYNC", default_value = "5m", value_parser = kvcache_elector::parse_duration)]
    pub model_resync: Duration,
    /// How often a ModelDeployment with ready attached engines reads their `/metrics` for
    /// `status.sharedCache`.
    #[arg(long, env = "KVCACHE_ENGINE_METRICS_INTERVAL", default_value = "15s", value_parser = kvcache_elector::parse_duration)]
    pub engine_metrics_interval: Duration,
    /// How far back `status.sharedCache`'s token counts and hit ratio reach.
    #[arg(long, env = "KVCACHE_SHARED_CACHE_WINDOW", default_value = "5m", value_parser = kvcache_elector::parse_duration)]
    pub shared_cache_window: Duration,
    /// Run the controllers only while holding the Lease `--leader-election-lease` in
    /// `--namespace` (several replicas: one reconciles, the others serve webhooks and wait). The
    /// installation sets it.
    #[arg(long, env = "KVCACHE_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The operator's own Lease.
    #[arg(
        long,
        env = "KVCACHE_LEADER_ELECTION_LEASE",
        default_value = "kvcache-operator"
    )]
    pub leader_election_lease: String,
    /// How long the Lease holds without renewal (seconds); a standby takes over after it, or at
    /// once when the leader releases it on SIGTERM.
    #[arg(long, env = "KVCACHE_LEADER_ELECTION_DURATION", default_value_t = 15)]
    pub leader_election_duration: u64,
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
    /// Where the admission webhook listens (HTTPS). Unset: no webhook is served (the
    /// installation sets `0.0.0.0:9443`).
    #[arg(long, env = "KVCACHE_WEBHOOK_ADDR")]
    pub webhook_addr: Option<SocketAddr>,
    /// The Service the API server reaches the webhook through (in `--namespace`); its DNS names
    /// are in the serving certificate.
    #[arg(
        long,
        env = "KVCACHE_WEBHOOK_SERVICE",
        default_value = "kvcache-operator"
    )]
    pub webhook_service: String,
    /// More names (DNS names or IP addresses) for the serving certificate.
    #[arg(
        long = "webhook-name",
        env = "KVCACHE_WEBHOOK_NAMES",
        value_delimiter = ','
    )]
    pub webhook_names: Vec<String>,
    /// The Secret (in `--namespace`) holding the webhook's CA and serving pair.
    #[arg(
        long,
        env = "KVCACHE_WEBHOOK_SECRET",
        default_value = "kvcache-operator-webhook-tls"
    )]
    pub webhook_secret: String,
    /// The validating and mutating webhook configurations whose `caBundle` the operator keeps.
    #[arg(
        long,
        env = "KVCACHE_WEBHOOK_CONFIGURATION",
        default_value = "kvcache-operator"
    )]
    pub webhook_configuration: String,
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
    /// A pool's ledger re-read interval.
    pub ledger_interval: Duration,
    /// A ModelDeployment's resync interval.
    pub model_resync: Duration,
    /// How often attached engines' counters are read.
    pub engine_metrics_interval: Duration,
    /// The window of `status.sharedCache`.
    pub shared_cache_window: Duration,
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
    /// Per ModelDeployment (`namespace/name`): its uid and its engines' counter samples
    /// (`status.sharedCache`).
    pub engine_windows: Mutex<EngineWindows>,
}

/// The shared-cache windows of the ModelDeployments, by `namespace/name`, with the uid they
/// were recorded for.
pub type EngineWindows = HashMap<String, (String, kvcache_render::shared_cache::Window)>;

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
    /// The operator's Lease could not be read or written.
    #[error("the operator's leader election: {0}")]
    Election(#[from] kube_lease_manager::LeaseManagerError),
    /// The Lease was lost while leading: the process exits so that it restarts as a standby.
    #[error("lost the operator's Lease {0} while leading; exiting to restart as a standby")]
    LeaseLost(String),
    /// SIGTERM could not be listened for.
    #[error("cannot listen for SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
    /// The metrics/health server could not start.
    #[error("cannot serve metrics and health on {addr}: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// A reflector over `api` whose cache drops `managedFields` before storing (most of a
/// server-side-applied object's bytes, and read by nothing here): the store and the event
/// stream that keeps it filled (with back-off), for the caller to drive.
fn stripped_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
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
    let stream = reflector::reflector(
        writer,
        watcher(api, config).modify(|o: &mut K| o.meta_mut().managed_fields = None),
    )
    .default_backoff();
    (reader, stream)
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
    let (reader, stream) = stripped_reflector(api, config);
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    reader
}

/// How many reconciles of one controller run at once. Unbounded, 2,000 ModelDeployments
/// reconciled together overloaded the API server of the scale benchmark (504 Gateway Timeout).
pub const CONCURRENCY: u16 = 16;

/// A controller whose primary watch goes through a [`stripped_reflector`] of our own, with
/// bounded concurrency.
pub fn controller<K>(api: Api<K>, config: watcher::Config) -> kube::runtime::Controller<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, stream) = stripped_reflector(api, config);
    kube::runtime::Controller::for_stream(stream.applied_objects(), reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
}

/// The webhook's tasks: the certificate keeper and the server, which stops on `stop`.
struct WebhookTasks {
    keeping: tokio::task::JoinHandle<()>,
    serving: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl WebhookTasks {
    /// Stops accepting connections and waits for the requests in flight (at most
    /// [`crate::webhook::DRAIN`]).
    async fn drain(self) {
        self.keeping.abort();
        let _ = self.stop.send(true);
        let _ = self.serving.await;
    }
}

/// A reconcile function whose every call runs in a span naming the controller, the object's
/// namespace and name and a trace id of its own, so that every log line of one reconcile
/// (JSON with `--log-format json`: the span's fields are on each line) can be found together.
pub fn traced<K, F, Fut>(
    controller: &'static str,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<Shared>) -> tracing::instrument::Instrumented<Fut>
where
    K: kube::Resource,
    F: Fn(Arc<K>, Arc<Shared>) -> Fut,
{
    use tracing::Instrument;
    move |object, shared| {
        let meta = object.meta();
        let span = tracing::info_span!(
            "reconcile",
            controller,
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            // `object`, not `name`: JSON logs print the span's own name under `name`.
            object = meta.name.as_deref().unwrap_or_default(),
            trace_id = %trace_id(),
        );
        reconcile(object, shared).instrument(span)
    }
}

/// A fresh 128-bit id in the W3C trace-context spelling (32 hex digits): two 64-bit hashes of
/// a process-wide counter under the process's random hasher keys.
pub fn trace_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::AtomicU64;
    static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let keys = KEYS.get_or_init(std::hash::RandomState::new);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u64| {
        let mut h = keys.build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}

/// What a relation watch passes on: an object whose desired state changed (its generation),
/// whose finalizers changed, or that was deleted. Status-only writes pass by, so that a status
/// one controller writes (the pool pass writes every Binding's) never requeues the objects that
/// only depend on the spec. The first sight of each object passes.
pub fn spec_changes<K>(
    api: Api<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let mut seen: HashMap<String, SpecKey> = HashMap::new();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let out = match event {
                Err(e) => Some(Err(e)),
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    let key = SpecKey::of(&o);
                    let uid = o.meta().uid.clone().unwrap_or_default();
                    (seen.insert(uid, key.clone()) != Some(key)).then_some(Ok(o))
                }
                Ok(watcher::Event::Delete(o)) => {
                    seen.remove(&o.meta().uid.clone().unwrap_or_default());
                    Some(Ok(o))
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
            };
            futures::future::ready(out)
        })
}

/// What [`spec_changes`] compares.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SpecKey {
    generation: Option<i64>,
    finalizers: Vec<String>,
    deleting: bool,
}

impl SpecKey {
    fn of<K: kube::Resource>(o: &K) -> Self {
        let m = o.meta();
        SpecKey {
            generation: m.generation,
            finalizers: m.finalizers.clone().unwrap_or_default(),
            deleting: m.deletion_timestamp.is_some(),
        }
    }
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
    ready
        .webhook
        .store(args.webhook_addr.is_none(), Ordering::Relaxed);
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
    // The per-Binding series are read from this cache at each scrape.
    let _ = metrics.bindings.set(bindings.clone());
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
    // The per-deployment shared-cache series are read from this cache at each scrape.
    let _ = metrics.models.set(models.clone());
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
            ledger_interval: args.ledger_interval,
            model_resync: args.model_resync,
            engine_metrics_interval: args.engine_metrics_interval,
            shared_cache_window: args.shared_cache_window,
        },
        metrics,
        settings,
        pools,
        bindings,
        backends,
        instance_types,
        models,
        polls: Mutex::new(HashMap::new()),
        engine_windows: Mutex::new(HashMap::new()),
    });
    ready.controllers.store(true, Ordering::Relaxed);
    // Whether this replica writes: with leader election only while it leads. A standby
    // serves webhooks and metrics and writes nothing (not even the webhook's certificate).
    let (writing, writer) = tokio::sync::watch::channel(!args.leader_elect);
    // The webhook serves on every replica, beside the controllers.
    let webhook = args.webhook_addr.map(|addr| {
        let presented = Arc::new(crate::certs::Presented::default());
        let service = &args.webhook_service;
        let ns = &shared.config.namespace;
        let mut names = vec![
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.cluster.local"),
        ];
        names.extend(args.webhook_names.iter().cloned());
        let keeper = crate::certs::Keeper {
            client: shared.client.clone(),
            namespace: ns.clone(),
            secret: args.webhook_secret.clone(),
            configuration: args.webhook_configuration.clone(),
            names,
            presented: presented.clone(),
            writer,
        };
        let keeping = tokio::spawn(keeper.run(ready.clone()));
        let router = crate::webhook::router(Arc::new(crate::webhook::Webhook {
            shared: shared.clone(),
        }));
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let serving = tokio::spawn(async move {
            let mut stopping = stopping;
            let stopped = async move {
                let _ = stopping.wait_for(|s| *s).await;
            };
            if let Err(e) = crate::webhook::serve(addr, router, presented, stopped).await {
                error!(error = %e, %addr, "the webhook server stopped");
            }
        });
        WebhookTasks {
            keeping,
            serving,
            stop,
        }
    });
    info!(namespace = %shared.config.namespace, "kvcache-operator running");
    // Leader election: the webhooks and metrics serve on every replica; the controllers run on
    // the one holding the Lease.
    let election = if args.leader_elect {
        // The Pod's name and a suffix of this process's own: a container restarted in the
        // same Pod is a new candidate, not the holder it replaced (that one's term runs out).
        let identity = format!(
            "{}_{}",
            std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "kvcache-operator".into()),
            &trace_id()[..8]
        );
        let duration = args.leader_election_duration.max(2);
        let lease_name = args.leader_election_lease.clone();
        let ns = shared.config.namespace.clone();
        let client = shared.client.clone();
        let campaign = |identity: String| {
            let (client, lease_name, ns) = (client.clone(), lease_name.clone(), ns.clone());
            async move {
                let manager = kube_lease_manager::LeaseManagerBuilder::new(client, &lease_name)
                    .with_namespace(&ns)
                    .with_identity(&identity)
                    .with_duration(duration)
                    .with_grace((duration / 3).max(1))
                    // One field manager per candidate: acquiring is a server-side apply
                    // without force, so a second candidate's apply on a held Lease conflicts
                    // (409) instead of silently taking it. A field manager shared by the
                    // replicas let both believe they had acquired after a Lease expired (seen
                    // on real nodes: two replicas reconciling after a kill -9).
                    .with_field_manager(format!("kvcache-operator-election-{identity}"))
                    .build()
                    .await?;
                Ok::<_, RunError>(manager.watch().await)
            }
        };
        let (mut leading, mut task) = campaign(identity.clone()).await?;
        info!(%identity, lease = %args.leader_election_lease, "standing by for the operator's Lease");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(RunError::Signal)?;
        // kube-lease-manager's standby retries when the Lease it last saw would expire; a
        // leader that releases the Lease on SIGTERM is noticed here, on a watch of the Lease,
        // and a new campaign takes it at once.
        let released = watcher(
            Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
                shared.client.clone(),
                &shared.config.namespace,
            ),
            watcher::Config::default()
                .fields(&format!("metadata.name={}", args.leader_election_lease)),
        )
        .default_backoff()
        .applied_objects()
        .filter_map(|l| {
            futures::future::ready(l.ok().filter(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    .is_none_or(str::is_empty)
            }))
        });
        futures::pin_mut!(released);
        loop {
            if *leading.borrow_and_update() {
                break;
            }
            tokio::select! {
                changed = leading.changed() => if changed.is_err() {
                    return Err(RunError::LeaseLost(args.leader_election_lease.clone()));
                },
                Some(_) = released.next() => {
                    drop(leading);
                    let _ = task.await;
                    (leading, task) = campaign(identity.clone()).await?;
                }
                _ = term.recv() => {
                    info!("stopping while standing by");
                    drop(leading);
                    let _ = task.await;
                    if let Some(w) = webhook {
                        w.drain().await;
                    }
                    server.abort();
                    return Ok(());
                }
                _ = tokio::signal::ctrl_c() => {
                    drop(leading);
                    let _ = task.await;
                    if let Some(w) = webhook {
                        w.drain().await;
                    }
                    server.abort();
                    return Ok(());
                }
            }
        }
        info!(%identity, "leading: the controllers start");
        let _ = writing.send(true);
        Some((leading, task))
    } else {
        None
    };
    shared.metrics.leader.set(1);
    let controllers = async {
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
            backend::run(shared.clone()).await;
        }
    };
    let mut lost = None;
    match election {
        Some((mut leading, task)) => {
            let still_leading = async {
                while leading.changed().await.is_ok() {
                    if !*leading.borrow_and_update() {
                        break;
                    }
                }
            };
            tokio::select! {
                () = controllers => {}
                () = still_leading => lost = Some(args.leader_election_lease.clone()),
            }
            // Dropping the receiver releases the Lease (at once, so a standby takes over).
            drop(leading);
            if let Ok(Err(e)) = task.await {
                warn!(error = %e, "releasing the operator's Lease");
            }
        }
        None => controllers.await,
    }
    shared.metrics.leader.set(0);
    // The controllers have drained (shutdown_on_signal lets the reconciles in flight finish)
    // and the Lease is released; the webhook answers what it is answering, then metrics stop.
    if let Some(w) = webhook {
        w.drain().await;
    }
    server.abort();
    if let Some(lease) = lost {
        return Err(RunError::LeaseLost(lease));
    }
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_write_is_not_a_spec_change_and_a_ceiling_or_deletion_is() {
        let b: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "team-a", "namespace": "team-a", "generation": 1, "uid": "u"},
            "spec": {"poolRef": {"name": "shared"}, "quota": {"ceiling": "1Gi"}, "domain": {"blockSize": 64, "dtype": "bfloat16"}}
        }))
        .expect("a Binding");
        let mut status_only = b.clone();
        status_only.status = Some(Default::default());
        status_only.metadata.resource_version = Some("2".into());
        assert_eq!(SpecKey::of(&status_only), SpecKey::of(&b));
        let mut edited = b.clone();
        edited.metadata.generation = Some(2);
        assert_ne!(SpecKey::of(&edited), SpecKey::of(&b));
        let mut held = b.clone();
        held.metadata.finalizers = Some(vec!["kvcache.gpustack.ai/release".into()]);
        assert_ne!(SpecKey::of(&held), SpecKey::of(&b));
        let mut deleting = b.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert_ne!(SpecKey::of(&deleting), SpecKey::of(&b));
    }

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
