//! What every controller and the webhook share, kept beside them as kube-rs's controller-rs keeps
//! its `Context`: the API client, the configuration, the caches of the watched kinds, the event
//! recorder and field manager, the metrics, and the store poller's back-off.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kvcache_api::backend::{BackendPhase, Capacity, EndpointName};
use kvcache_api::model::InstanceType;
use kvcache_api::settings::Chosen;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment, Settings};
use kvcache_render::objects::backend::{ADMIN_PORT, leader_name};
use tracing::{error, warn};

use crate::store::StoreClient;
use crate::telemetry::Metrics;
use crate::watch::{Subscription, reflect, reflect_shared, reflect_shared_stripped};

/// The one field manager of every write.
pub const MANAGER: &str = "kvcache-operator";

/// The configuration every controller reads (from `kvcache-operator run`'s flags).
#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    /// Store admin addresses by backend name (`--store-address-override`).
    pub overrides: BTreeMap<String, String>,
    /// How soon a store whose figures moved is read again.
    pub poll_fast: Duration,
    /// The longest delay between two reads of a stable store.
    pub poll_stable: Duration,
    /// Which backends this operator reconciles (a label selector; empty: all).
    pub backend_selector: String,
    pub ledger_interval: Duration,
    pub model_resync: Duration,
    pub engine_metrics_interval: Duration,
    /// How far back `status.sharedCache` reaches.
    pub shared_cache_window: Duration,
    /// Who besides a backend's Pods and its bound namespaces reaches its store.
    pub access: kvcache_render::objects::backend::StoreAccess,
    /// Whether segments of no member Pod are drained (`--unknown-segments=drain`) or only
    /// reported.
    pub drain_unknown: bool,
    /// Whether a backend's policies are probed after they change (`--isolation-probe`).
    pub isolation_probe: bool,
}

/// The caches of every watched kind, one reflector each, filled before the controllers start.
pub struct Caches {
    /// The settings ConfigMap (`gpustack-settings`) in the operator's namespace.
    pub settings: Store<ConfigMap>,
    pub pools: Store<KVCachePool>,
    pub bindings: Store<KVCachePoolBinding>,
    pub backends: Store<KVCacheBackend>,
    pub instance_types: Store<InstanceType>,
    pub models: Store<ModelDeployment>,
    /// The cluster's Nodes, without their status: a member on a node taken out of service is
    /// drained first (`kvcache_render::members::maintenance`).
    pub nodes: Store<Node>,
}

/// The changes of the shared caches, for the controller of each kind to subscribe to when it
/// starts (one that never runs costs nothing).
pub struct Changes {
    pub backends: Subscription<KVCacheBackend>,
    pub pools: Subscription<KVCachePool>,
    pub bindings: Subscription<KVCachePoolBinding>,
    pub models: Subscription<ModelDeployment>,
    pub instance_types: Subscription<InstanceType>,
    pub nodes: Subscription<Node>,
}

impl Caches {
    /// Starts a reflector per kind and waits until each has listed (a cache that never fills
    /// is logged; the controllers then start on what it holds).
    pub async fn fill(client: &Client, namespace: &str) -> (Caches, Changes) {
        let all = watcher::Config::default;
        let (pools, pool_changes) = reflect_shared(Api::all(client.clone()), all());
        let (bindings, binding_changes) = reflect_shared(Api::all(client.clone()), all());
        let (backends, backend_changes) = reflect_shared(Api::all(client.clone()), all());
        let (models, model_changes) = reflect_shared(Api::all(client.clone()), all());
        let (instance_types, instance_type_changes) =
            reflect_shared(Api::all(client.clone()), all());
        let (nodes, node_changes) =
            reflect_shared_stripped(Api::all(client.clone()), all(), |n: &mut Node| {
                n.status = None;
            });
        let caches = Caches {
            settings: reflect(
                Api::namespaced(client.clone(), namespace),
                all().fields(&format!(
                    "metadata.name={}",
                    kvcache_api::settings::SETTINGS_CONFIG_MAP
                )),
            ),
            pools,
            bindings,
            backends,
            instance_types,
            models,
            nodes,
        };
        for (what, filled) in [
            ("settings", caches.settings.wait_until_ready().await.is_ok()),
            ("pools", caches.pools.wait_until_ready().await.is_ok()),
            ("bindings", caches.bindings.wait_until_ready().await.is_ok()),
            ("backends", caches.backends.wait_until_ready().await.is_ok()),
            (
                "instance types",
                caches.instance_types.wait_until_ready().await.is_ok(),
            ),
            (
                "model deployments",
                caches.models.wait_until_ready().await.is_ok(),
            ),
            ("nodes", caches.nodes.wait_until_ready().await.is_ok()),
        ] {
            if !filled {
                error!(what, "a cache never filled");
            }
        }
        let changes = Changes {
            backends: backend_changes,
            pools: pool_changes,
            bindings: binding_changes,
            models: model_changes,
            instance_types: instance_type_changes,
            nodes: node_changes,
        };
        (caches, changes)
    }
}

/// What the controllers and the webhook share (one per process).
pub struct Context {
    pub client: Client,
    pub config: Config,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The client of the stores' admin surfaces and the engines' metrics.
    pub store: StoreClient,
    pub settings: Store<ConfigMap>,
    pub pools: Store<KVCachePool>,
    pub bindings: Store<KVCachePoolBinding>,
    pub backends: Store<KVCacheBackend>,
    pub instance_types: Store<InstanceType>,
    pub models: Store<ModelDeployment>,
    /// The cluster's Nodes, without their status.
    pub nodes: Store<Node>,
    /// The store poller's back-off, per polled backend or pool.
    polls: Mutex<HashMap<Polled, Poll>>,
    /// Per ModelDeployment (`namespace/name`): its uid and its engines' counter samples
    /// (`status.sharedCache`).
    pub engine_windows: Mutex<EngineWindows>,
    /// The settings last read without a refusal: kept when a later read is refused.
    last_good_settings: Mutex<Option<Settings>>,
    /// What each pool pass concluded of its Bindings, for the Binding controller (their
    /// status's one writer): by Binding `namespace/name`.
    binding_conclusions: Mutex<HashMap<String, kvcache_quota::status::BindingVerdict>>,
    /// Wakes the Binding controller for a Binding whose conclusion moved.
    binding_wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<KVCachePoolBinding>>,
    /// The receiving end, taken once by the Binding controller.
    binding_woken:
        Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<KVCachePoolBinding>>>>,
}

/// The shared-cache windows of the ModelDeployments, by `namespace/name`, with the uid they
/// were recorded for.
pub type EngineWindows = HashMap<String, (String, kvcache_render::observe::shared_cache::Window)>;

/// What the store poller reads on a schedule of its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Polled {
    /// A backend's store (health, capacity, members), by backend name.
    Backend(String),
    /// A pool's ledger on its backend's master, by pool name.
    Pool(String),
}

/// The figures a poll compares with the previous reading: while they move, it reads again soon.
#[derive(Clone, Debug, PartialEq)]
pub enum Figures {
    Backend {
        capacity: Option<Capacity>,
        phase: BackendPhase,
        members: usize,
    },
    Pool {
        capacity: Option<u64>,
        /// Each tenant's grant (not its usage, which moves with every write).
        grants: Vec<(String, u64)>,
    },
}

/// One poll's state: the figures last seen and the delay chosen after them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Poll {
    figures: Option<Figures>,
    delay: Duration,
}

impl Poll {
    /// The next state after reading `figures`: `fast` when they moved, else twice the last
    /// delay, between `fast` and `stable`.
    pub fn after(&self, figures: Figures, fast: Duration, stable: Duration) -> Poll {
        let delay = if self.figures.as_ref() != Some(&figures) {
            fast
        } else {
            (self.delay * 2).clamp(fast, stable.max(fast))
        };
        Poll {
            figures: Some(figures),
            delay,
        }
    }
}

/// Locks a mutex whose holder may have panicked (the data is a cache: still usable).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Context {
    /// The five kinds as the shared caches hold them now, to follow Binding -> pool -> backend.
    pub fn world(&self) -> kvcache_render::world::World {
        kvcache_render::world::World::new(
            self.backends.state(),
            self.pools.state(),
            self.bindings.state(),
            self.models.state(),
            self.instance_types.state(),
        )
    }

    pub fn new(
        client: Client,
        config: Config,
        metrics: Arc<Metrics>,
        caches: Caches,
        instance: Option<String>,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.into(),
                instance,
            },
        );
        let (wake, woken) = tokio::sync::mpsc::unbounded_channel();
        Context {
            client,
            config,
            recorder,
            metrics,
            store: StoreClient::default(),
            settings: caches.settings,
            pools: caches.pools,
            bindings: caches.bindings,
            backends: caches.backends,
            instance_types: caches.instance_types,
            models: caches.models,
            nodes: caches.nodes,
            polls: Mutex::new(HashMap::new()),
            engine_windows: Mutex::new(HashMap::new()),
            last_good_settings: Mutex::new(None),
            binding_conclusions: Mutex::new(HashMap::new()),
            binding_wake: wake,
            binding_woken: Mutex::new(Some(woken)),
        }
    }

    /// Hands the Binding controller what a pool pass concluded of `binding` (`namespace/name`),
    /// waking it when that moved.
    pub fn conclude_binding(
        &self,
        binding: &KVCachePoolBinding,
        verdict: kvcache_quota::status::BindingVerdict,
    ) {
        let id = kvcache_render::world::binding_id(binding);
        let moved = lock(&self.binding_conclusions).insert(id, verdict.clone()) != Some(verdict);
        if moved {
            // The receiver lives as long as the Binding controller; none: nothing to wake.
            let _ = self.binding_wake.send(ObjectRef::from_obj(binding));
        }
    }

    /// What the pool's last pass concluded of `binding` (`namespace/name`).
    pub fn binding_conclusion(
        &self,
        binding: &str,
    ) -> Option<kvcache_quota::status::BindingVerdict> {
        lock(&self.binding_conclusions).get(binding).cloned()
    }

    /// Forgets a released Binding's conclusion.
    pub fn forget_binding(&self, binding: &str) {
        lock(&self.binding_conclusions).remove(binding);
    }

    /// The stream of Bindings a pool pass woke (once: the Binding controller takes it).
    pub fn binding_wakes(
        &self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<KVCachePoolBinding>>> {
        lock(&self.binding_woken).take()
    }

    /// The cluster's settings as the cache holds them, with the last good ones kept when a
    /// value is refused (`kvcache_api::settings::choose`): never a silent return to the defaults.
    pub fn settings(&self) -> Chosen {
        let read = self.settings.state().first().map(|cm| {
            let data = cm.data.clone().unwrap_or_default();
            Settings::from_data(kvcache_api::settings::SETTINGS_CONFIG_MAP, &data)
        });
        let mut last_good = lock(&self.last_good_settings);
        let chosen = kvcache_api::settings::choose(read, last_good.as_ref());
        match &chosen.refused {
            None => last_good.clone_from(&chosen.settings),
            Some(e) => warn!(
                error = %e,
                kept = chosen.settings.is_some(),
                "the settings ConfigMap is unreadable; the last good settings are kept where there are any"
            ),
        }
        chosen
    }

    /// The settings for admission, which answers even when none were read: the last good ones,
    /// else the defaults; with a warning for the user's `kubectl` when the read was refused.
    pub fn settings_for_admission(&self) -> (Settings, Option<String>) {
        let chosen = self.settings();
        let warning = chosen.refused.as_ref().map(|e| {
            let used = if chosen.settings.is_some() {
                "the last good settings were used"
            } else {
                "the defaults were used: no settings were read since the operator started"
            };
            format!("{e}; {used}")
        });
        (chosen.settings.unwrap_or_default(), warning)
    }

    /// Where the operator reads a backend's store: the override, the external `Admin` address,
    /// or the leader Service's admin port.
    pub fn admin_address(&self, b: &KVCacheBackend) -> Option<String> {
        let name = b.name_any();
        if let Some(a) = self.config.overrides.get(&name) {
            return Some(a.clone());
        }
        if let Some(x) = &b.spec.connection.external {
            return x.address(EndpointName::Admin).map(str::to_owned);
        }
        b.spec.connection.managed.as_ref().map(|_| {
            format!(
                "{}.{}.svc:{ADMIN_PORT}",
                leader_name(&name),
                self.config.namespace
            )
        })
    }

    /// How long until `polled` is read again, after a reading with `figures`: soon while they
    /// move, backing off to `stable` (the store poll's for a backend, the ledger interval for a
    /// pool) while they hold still.
    pub fn next_poll(&self, polled: Polled, figures: Figures, stable: Duration) -> Duration {
        let mut polls = lock(&self.polls);
        let poll = polls.entry(polled).or_default();
        *poll = poll.after(figures, self.config.poll_fast, stable);
        poll.delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_reads_soon_while_figures_move_and_backs_off_while_they_hold() {
        let (fast, stable) = (Duration::from_millis(200), Duration::from_secs(15));
        let figures = |members| Figures::Backend {
            capacity: None,
            phase: BackendPhase::Ready,
            members,
        };
        let first = Poll::default().after(figures(2), fast, stable);
        assert_eq!(first.delay, fast);
        let second = first.after(figures(2), fast, stable);
        assert_eq!(second.delay, fast * 2);
        let mut p = second;
        for _ in 0..10 {
            p = p.after(figures(2), fast, stable);
        }
        assert_eq!(p.delay, stable);
        assert_eq!(p.after(figures(3), fast, stable).delay, fast);
    }
}
