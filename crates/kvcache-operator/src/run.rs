//! `kvcache-operator run`: start-up and shutdown. It checks the CRDs, fills the caches, serves
//! metrics and health, starts the webhook, stands for election when asked to, runs the
//! controllers and, on SIGTERM or Ctrl-C, drains them, releases the Lease, drains the webhook.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::{Client, CustomResourceExt};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use tokio::task::JoinHandle;
use tracing::{error, info};

use crate::context::{Caches, Config, Context};
use crate::election::Candidate;
use crate::error::Error;
use crate::telemetry::{self, LogFormat, Metrics, Readiness};
use crate::webhook;

/// `kvcache-operator run` options; each has an environment fallback.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The operator's namespace: where store workloads run and the settings ConfigMap
    /// (`gpustack-settings`) lives.
    #[arg(long, env = "KVCACHE_NAMESPACE", default_value = kvcache_render::plan::resolve::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, env = "KVCACHE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// How soon a backend's store is read again while its figures move (after a Pod, Lease or
    /// endpoint change, or a changed reading); the delay doubles while they hold still.
    #[arg(long, env = "KVCACHE_STORE_POLL_FAST", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub store_poll_fast: Duration,
    /// The longest delay between two reads of a stable store.
    #[arg(long, env = "KVCACHE_STORE_POLL_STABLE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub store_poll_stable: Duration,
    /// How often a pool re-reads its master's ledger while nothing changes (grants move with
    /// capacity; a backend status change re-reads at once).
    #[arg(long, env = "KVCACHE_LEDGER_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub ledger_interval: Duration,
    /// How often a ModelDeployment is reconciled while nothing it watches changes.
    #[arg(long, env = "KVCACHE_MODEL_RESYNC", default_value = "5m", value_parser = humantime::parse_duration)]
    pub model_resync: Duration,
    /// How often a ModelDeployment with ready attached engines reads their `/metrics` for
    /// `status.sharedCache`.
    #[arg(long, env = "KVCACHE_ENGINE_METRICS_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub engine_metrics_interval: Duration,
    /// How far back `status.sharedCache`'s token counts and hit ratio reach.
    #[arg(long, env = "KVCACHE_SHARED_CACHE_WINDOW", default_value = "5m", value_parser = humantime::parse_duration)]
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
    /// Reconcile only backends matching this label selector (several operators on one cluster:
    /// tests, a staged rollout). Empty: every backend.
    #[arg(long, env = "KVCACHE_BACKEND_SELECTOR", default_value = "")]
    pub backend_selector: String,
    /// `BACKEND=HOST:PORT`: read that backend's store admin surface (`/health`, `/metrics`) at
    /// this address instead of its leader Service. Only for running outside the cluster.
    #[arg(long = "store-address-override", env = "KVCACHE_STORE_ADDRESS_OVERRIDE", value_delimiter = ',', value_parser = parse_override)]
    pub store_address_overrides: Vec<(String, String)>,
    /// Addresses (CIDRs) that may reach the stores' admin port besides the operator's own Pods:
    /// where this operator runs outside a Pod (its node's address). See docs/isolation.md.
    #[arg(long = "store-admin-from", env = "KVCACHE_STORE_ADMIN_FROM", value_delimiter = ',', value_parser = parse_cidr)]
    pub store_admin_from: Vec<String>,
    /// Namespaces whose Pods may reach the masters' admin port: an explicit grant of the store's
    /// admin API (its `/metrics`, and the tenant ledger's reads and writes, on one port). Not
    /// needed for metrics: the operator re-exports each master's series on its own `/metrics`
    /// (`kvcache_operator_store_*`). Name only a namespace trusted with the ledger.
    #[arg(long = "store-metrics-from", env = "KVCACHE_STORE_METRICS_FROM", value_delimiter = ',', value_parser = parse_namespace)]
    pub store_metrics_from: Vec<String>,
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
    /// The Secret (in `--namespace`) holding the webhook's serving pair and CA certificate.
    #[arg(
        long,
        env = "KVCACHE_WEBHOOK_SECRET",
        default_value = kvcache_render::install::WEBHOOK_SECRET
    )]
    pub webhook_secret: String,
    /// The Secret (in `--namespace`) holding the webhook's CA and its key, apart from the
    /// serving pair: only the leading replica reads it.
    #[arg(
        long,
        env = "KVCACHE_WEBHOOK_CA_SECRET",
        default_value = kvcache_render::install::WEBHOOK_CA_SECRET
    )]
    pub webhook_ca_secret: String,
    /// Address blocks (CIDRs) the webhook serves, as the control plane's calls reach it: a
    /// connection from anywhere else is closed at once, so no other Pod can send reviews or
    /// hold the webhook's connections and memory, even where no enforcer applies the
    /// operator's NetworkPolicy. Empty: every source (each within its share). The installation
    /// sets it from the same setting as that policy (docs/isolation.md).
    #[arg(long = "webhook-allowed-source", env = "KVCACHE_WEBHOOK_ALLOWED_SOURCES", value_delimiter = ',', value_parser = parse_net)]
    pub webhook_allowed_sources: Vec<ipnet::IpNet>,
    /// What the operator does with a segment on a managed backend's master that no member Pod
    /// of the backend mounted (docs/isolation.md#unknown-segments): `drain` it onto the
    /// members, so that no new block lands in that process's memory, or only `report` it
    /// (condition, event, metric). Both report.
    #[arg(
        long = "unknown-segments",
        env = "KVCACHE_UNKNOWN_SEGMENTS",
        value_enum,
        default_value = "drain"
    )]
    pub unknown_segments: UnknownSegments,
    /// After a backend's NetworkPolicies change, check that something enforces them: a
    /// short-lived Pod in `--namespace`, which no Binding admits, dials the master's RPC port
    /// (`NetworkIsolated=True/Enforced` when refused, `False/NotEnforced` when it connects;
    /// docs/isolation.md#enforcement-checked). `false` for a cluster that forbids such Pods:
    /// the condition then says `Unverified`.
    #[arg(
        long = "isolation-probe",
        env = "KVCACHE_ISOLATION_PROBE",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub isolation_probe: bool,
    /// The validating and mutating webhook configurations whose `caBundle` the operator keeps.
    #[arg(
        long,
        env = "KVCACHE_WEBHOOK_CONFIGURATION",
        default_value = "kvcache-operator"
    )]
    pub webhook_configuration: String,
}

/// `--unknown-segments`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnknownSegments {
    /// Drain each onto the backend's members (and report it).
    Drain,
    /// Only report it.
    Report,
}

fn parse_override(text: &str) -> Result<(String, String), Error> {
    match text.split_once('=') {
        Some((backend, address))
            if !backend.is_empty() && kvcache_api::admission::is_host_port(address) =>
        {
            Ok((backend.to_owned(), address.to_owned()))
        }
        _ => Err(Error::NotAnOverride(text.to_owned())),
    }
}

/// `ADDRESS/PREFIX`, an IPv4 or IPv6 block as a NetworkPolicy's `ipBlock.cidr` takes it.
fn parse_cidr(text: &str) -> Result<String, Error> {
    let bad = || Error::NotACidr(text.to_owned());
    let (address, prefix) = text.split_once('/').ok_or_else(bad)?;
    let address: std::net::IpAddr = address.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let longest = if address.is_ipv4() { 32 } else { 128 };
    if prefix > longest {
        return Err(bad());
    }
    Ok(text.to_owned())
}

/// `ADDRESS/PREFIX` as [`parse_cidr`] takes it, as a network.
fn parse_net(text: &str) -> Result<ipnet::IpNet, Error> {
    parse_cidr(text)?
        .parse()
        .map_err(|_| Error::NotACidr(text.to_owned()))
}

/// A namespace name (a DNS label).
fn parse_namespace(text: &str) -> Result<String, Error> {
    let label = !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    if label {
        Ok(text.to_owned())
    } else {
        Err(Error::NotANamespace(text.to_owned()))
    }
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> Result<(), Error> {
    telemetry::init_logs(args.log_format);
    let client = Client::try_default().await.map_err(Error::Connect)?;
    require_crds(&client).await?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(Readiness::default());
    let stopping = stopping_flag()?;
    ready
        .webhook
        .store(args.webhook_addr.is_none(), Ordering::Relaxed);
    let server = serve_metrics(args.metrics_addr, metrics.clone(), ready.clone()).await?;
    let (caches, changes) = Caches::fill(&client, &args.namespace).await;
    // The per-Binding and per-deployment series are read from these caches at each scrape.
    let _ = metrics.bindings.set(caches.bindings.clone());
    let _ = metrics.models.set(caches.models.clone());
    let ctx = Arc::new(Context::new(
        client,
        config(&args),
        metrics,
        caches,
        std::env::var("POD_NAME").ok(),
    ));
    ready.controllers.store(true, Ordering::Relaxed);
    // Whether this replica writes: with leader election only while it leads. A standby serves
    // webhooks and metrics and writes nothing (not even the webhook's certificate).
    let (writing, writer) = tokio::sync::watch::channel(!args.leader_elect);
    let hook = args
        .webhook_addr
        .map(|addr| start_webhook(addr, &args, &ctx, &ready, writer));
    info!(namespace = %ctx.config.namespace, "kvcache-operator running");
    let outcome = if args.leader_elect {
        match candidate(&args, &ctx).stand_by(shutdown_signal()?).await {
            Ok(Some(leadership)) => {
                let _ = writing.send(true);
                ctx.metrics.leader.set(1);
                leadership
                    .lead(crate::controllers::run(
                        ctx.clone(),
                        changes,
                        ended(&ready, &stopping),
                    ))
                    .await
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        }
    } else {
        ctx.metrics.leader.set(1);
        crate::controllers::run(ctx.clone(), changes, ended(&ready, &stopping)).await;
        Ok(())
    };
    ctx.metrics.leader.set(0);
    // The controllers have drained (shutdown_on_signal lets the reconciles in flight finish)
    // and the Lease is released; the webhook answers what it is answering, then metrics stop.
    if let Some(w) = hook {
        w.drain().await;
    }
    server.abort();
    if outcome.is_ok() {
        info!("stopped");
    }
    outcome
}

/// What a controller loop that ended calls: one that ends unasked fails the liveness probe
/// from then on; one that ends after SIGTERM (`stopping`) is the shutdown, logged as such.
fn ended(
    ready: &Arc<Readiness>,
    stopping: &Arc<std::sync::atomic::AtomicBool>,
) -> impl Fn(&'static str) + Send + Sync + Clone + 'static {
    let (ready, stopping) = (ready.clone(), stopping.clone());
    move |what| {
        if stopping.load(Ordering::Relaxed) {
            info!(loop_ = what, "a controller loop stopped");
        } else {
            error!(loop_ = what, "a controller loop ended");
            ready.ended(what);
        }
    }
}

/// A flag set on the first SIGTERM or Ctrl-C (the controllers stop on it themselves).
fn stopping_flag() -> Result<Arc<std::sync::atomic::AtomicBool>, Error> {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let signal = shutdown_signal()?;
    let set = flag.clone();
    tokio::spawn(async move {
        signal.await;
        set.store(true, Ordering::Relaxed);
    });
    Ok(flag)
}

/// Refuses to start without the CRDs, saying how to install them.
async fn require_crds(client: &Client) -> Result<(), Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        KVCacheBackend::crd(),
        KVCachePool::crd(),
        KVCachePoolBinding::crd(),
    ] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let found = crds.get_opt(&name).await.map_err(crate::error::kube(
            "get",
            format!("CustomResourceDefinition {name}"),
        ))?;
        if found.is_none() {
            return Err(Error::CrdMissing { crd: name });
        }
    }
    Ok(())
}

/// Binds the metrics and health port (an address in use fails the start) and serves it.
async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
) -> Result<JoinHandle<()>, Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve { addr, source })?;
    Ok(tokio::spawn(async move {
        if let Err(e) =
            telemetry::serve(listener, metrics, ready, crate::serve::Bounds::METRICS).await
        {
            error!(error = %e, "the metrics and health server stopped");
        }
    }))
}

fn config(args: &RunArgs) -> Config {
    Config {
        namespace: args.namespace.clone(),
        overrides: args
            .store_address_overrides
            .iter()
            .cloned()
            .collect::<BTreeMap<_, _>>(),
        poll_fast: args.store_poll_fast,
        poll_stable: args.store_poll_stable.max(args.store_poll_fast),
        backend_selector: args.backend_selector.clone(),
        ledger_interval: args.ledger_interval,
        model_resync: args.model_resync,
        engine_metrics_interval: args.engine_metrics_interval,
        shared_cache_window: args.shared_cache_window,
        access: kvcache_render::objects::backend::StoreAccess {
            admin_from: args.store_admin_from.clone(),
            metrics_from: args.store_metrics_from.clone(),
        },
        drain_unknown: args.unknown_segments == UnknownSegments::Drain,
        isolation_probe: args.isolation_probe,
    }
}

fn candidate(args: &RunArgs, ctx: &Context) -> Candidate {
    Candidate {
        client: ctx.client.clone(),
        namespace: ctx.config.namespace.clone(),
        lease: args.leader_election_lease.clone(),
        duration: args.leader_election_duration.max(2),
        identity: format!(
            "{}_{}",
            std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "kvcache-operator".into()),
            &crate::controllers::trace_id()[..8]
        ),
    }
}

/// Resolves on the first SIGTERM or Ctrl-C.
fn shutdown_signal() -> Result<impl Future<Output = ()>, Error> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
}

/// The webhook's tasks: the certificate keeper and the server, which stops on `stop`.
struct WebhookTasks {
    keeping: JoinHandle<()>,
    serving: JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl WebhookTasks {
    /// Stops accepting connections and waits for the requests in flight (at most
    /// [`webhook::tls::DRAIN`]).
    async fn drain(self) {
        self.keeping.abort();
        let _ = self.stop.send(true);
        let _ = self.serving.await;
    }
}

/// Starts the certificate keeper (it writes only while `writer` says this replica writes) and
/// the webhook's server; both serve on every replica.
fn start_webhook(
    addr: SocketAddr,
    args: &RunArgs,
    ctx: &Arc<Context>,
    ready: &Arc<Readiness>,
    writer: tokio::sync::watch::Receiver<bool>,
) -> WebhookTasks {
    let presented = Arc::new(webhook::certs::Presented::default());
    let (service, ns) = (&args.webhook_service, &ctx.config.namespace);
    let mut names = vec![
        format!("{service}.{ns}.svc"),
        format!("{service}.{ns}.svc.cluster.local"),
    ];
    names.extend(args.webhook_names.iter().cloned());
    let keeper = webhook::certs::Keeper {
        client: ctx.client.clone(),
        namespace: ns.clone(),
        secret: args.webhook_secret.clone(),
        ca_secret: args.webhook_ca_secret.clone(),
        configuration: args.webhook_configuration.clone(),
        names,
        presented: presented.clone(),
        writer,
    };
    let keeping = tokio::spawn(keeper.run(ready.clone()));
    let router = webhook::router(Arc::new(webhook::Webhook::new(ctx.clone())));
    let (stop, mut stopping) = tokio::sync::watch::channel(false);
    let counts: Arc<dyn crate::serve::Counts> = ctx.metrics.clone();
    let ready = ready.clone();
    let ledger = crate::serve::Ledger::serving(
        crate::serve::Bounds::WEBHOOK,
        args.webhook_allowed_sources.clone(),
    );
    let serving = tokio::spawn(async move {
        let asked = stopping.clone();
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        let serving = webhook::tls::serve(addr, router, presented, ledger, counts, stopped);
        supervise_listener(addr, serving, asked, &ready).await;
    });
    WebhookTasks {
        keeping,
        serving,
        stop,
    }
}

/// Runs the webhook's server to its end; one that ends unasked (the listener failed, or never
/// bound) fails both probes (`telemetry::health`, `telemetry::readiness`).
async fn supervise_listener(
    addr: SocketAddr,
    serving: impl Future<Output = std::io::Result<()>>,
    asked: tokio::sync::watch::Receiver<bool>,
    ready: &Readiness,
) {
    let outcome = serving.await;
    if !*asked.borrow() {
        match outcome {
            Err(e) => error!(error = %e, %addr, "the webhook listener ended"),
            Ok(()) => error!(%addr, "the webhook listener ended"),
        }
        ready.ended(telemetry::WEBHOOK_LISTENER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_webhook_listener_that_ends_fails_the_probes_and_one_asked_to_stop_does_not() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = taken.local_addr().expect("its address");
        let serve = |stop: tokio::sync::watch::Receiver<bool>| {
            let mut stop = stop;
            webhook::tls::serve(
                addr,
                axum::Router::new(),
                Arc::new(webhook::certs::Presented::default()),
                crate::serve::Ledger::new(crate::serve::Bounds::WEBHOOK),
                Arc::new(crate::telemetry::Metrics::default()),
                async move {
                    let _ = stop.wait_for(|s| *s).await;
                },
            )
        };
        // The real server on a port already taken: its listener ends at once, unasked.
        let ready = Readiness::default();
        let (_tx, rx) = tokio::sync::watch::channel(false);
        supervise_listener(addr, serve(rx.clone()), rx, &ready).await;
        let ended: Vec<&str> = ready
            .ended
            .lock()
            .expect("unpoisoned")
            .iter()
            .copied()
            .collect();
        assert_eq!(
            telemetry::health(0, 0, &ended),
            Err("the webhook listener ended: restart the replica".into())
        );
        assert!(telemetry::readiness(true, true, &ended).is_err());
        // Asked to stop (SIGTERM): the probes are not failed for it.
        drop(taken);
        let ready = Readiness::default();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let running = supervise_listener(addr, serve(rx.clone()), rx, &ready);
        let stopping = async {
            let _ = tx.send(true);
        };
        tokio::join!(running, stopping);
        assert!(ready.ended.lock().expect("unpoisoned").is_empty());
    }

    #[test]
    fn overrides_and_durations() {
        assert_eq!(
            parse_override("mooncake-dram=127.0.0.1:9003").ok(),
            Some(("mooncake-dram".into(), "127.0.0.1:9003".into()))
        );
        assert!(parse_override("mooncake-dram").is_err());
        assert!(parse_override("=127.0.0.1:9003").is_err());
    }

    #[test]
    fn the_store_access_flags_take_cidrs_and_namespace_names_only() {
        assert_eq!(
            parse_cidr("10.0.0.5/32").ok().as_deref(),
            Some("10.0.0.5/32")
        );
        assert!(parse_cidr("fd00::/8").is_ok());
        for bad in ["10.0.0.5", "10.0.0.5/33", "x/8", "fd00::/129", ""] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_net("10.0.0.0/24").ok(),
            "10.0.0.0/24".parse::<ipnet::IpNet>().ok()
        );
        assert!(parse_net("10.0.0.1").is_err());
        assert!(parse_namespace("monitoring").is_ok());
        for bad in ["", "Monitoring", "-a", "a_b"] {
            assert!(parse_namespace(bad).is_err(), "{bad}");
        }
        assert!(parse_override("b=localhost").is_err());
        assert_eq!(
            humantime::parse_duration("200ms"),
            Ok(Duration::from_millis(200))
        );
    }
}
