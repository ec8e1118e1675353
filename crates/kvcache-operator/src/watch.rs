//! The watch plumbing the controllers share: reflector caches that drop `managedFields`, a
//! controller over one of them with bounded concurrency, relation watches that pass spec changes
//! only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

/// A kind the operator watches: a static, cloneable, decodable resource.
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

/// A reflector over `api` whose cache drops `managedFields` before storing (most of a
/// server-side-applied object's bytes, and read by nothing here): the store and the event
/// stream that keeps it filled (with back-off), for the caller to drive.
fn stripped_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: fn(&mut K),
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Watched,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, config).modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            strip(o);
        }),
    )
    .default_backoff();
    (reader, stream)
}

/// A reflector store kept up to date by its own task.
pub fn reflect<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: Watched,
{
    let (reader, stream) = stripped_reflector(api, config, |_| {});
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    reader
}

/// The changes of one shared cache, for the controller that reads the cache as its primary
/// watch. Lazy: nothing is kept for a controller that has not subscribed (a standby operator
/// never does), so an unread subscription never holds the cache back.
///
/// Written here instead of kube-runtime's `ReflectHandle` (`Writer::subscribe`), which this
/// replaces for two faults seen in this operator: (1) when a change it was told of names an
/// object deleted from the cache before it was read, its `poll_next` answers `Pending` without
/// arranging a wake-up, so the controller's trigger stream sleeps until an unrelated event
/// wakes the task (CI saw a new ModelDeployment get no status for two minutes after another
/// one was deleted); (2) its bounded broadcast waits for every subscriber, so a subscription
/// held by a replica that is not leading stopped that replica's cache, the one its webhook
/// reads, after 256 changes.
pub struct Subscription<K: Watched> {
    cache: Store<K>,
    reader: Arc<Mutex<Option<UnboundedSender<Arc<K>>>>>,
    /// Other controllers' relation watches of the kind ([`Subscription::relation_changes`]).
    relations: Arc<Mutex<Vec<UnboundedSender<Relation<K>>>>>,
}

/// One event a relation watch is told of, after the cache applied it.
enum Relation<K> {
    Applied(Arc<K>),
    Deleted(Arc<K>),
    Listed(Vec<Arc<K>>),
}

impl<K: Watched> Clone for Subscription<K> {
    fn clone(&self) -> Self {
        Subscription {
            cache: self.cache.clone(),
            reader: self.reader.clone(),
            relations: self.relations.clone(),
        }
    }
}

impl<K: Watched> Subscription<K> {
    fn new(cache: Store<K>) -> Self {
        Subscription {
            cache,
            reader: Arc::new(Mutex::new(None)),
            relations: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// What [`spec_changes`] passes on (with [`Pass::SpecChanges`]), or every change (with
    /// [`Pass::Every`]), read from this shared cache instead of a watch of its own: each object
    /// is handed over only once the cache holds the change, so a controller that reads the cache
    /// in the pass it triggers (the backend's NetworkPolicies follow the Bindings, a
    /// ModelDeployment's roles their InstanceTypes, both read from the World) never sees the
    /// state before it. A watch of its own raced the cache: CI saw an InstanceType created, the
    /// deployment naming it reconciled before the cache held it, and `InstanceTypeNotFound`
    /// kept until the resync. Deletions included.
    pub fn relation_changes(
        &self,
        pass: Pass,
    ) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K> {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        {
            let mut relations = self
                .relations
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let _ = tx.unbounded_send(Relation::Listed(self.cache.state()));
            relations.push(tx);
        }
        let mut seen: HashMap<String, SpecKey> = HashMap::new();
        rx.flat_map(move |relation| {
            let out: Vec<Result<K, watcher::Error>> = match relation {
                Relation::Applied(o) => passes(pass, &mut seen, &o).into_iter().map(Ok).collect(),
                Relation::Listed(all) => all
                    .iter()
                    .filter_map(|o| passes(pass, &mut seen, o))
                    .map(Ok)
                    .collect(),
                Relation::Deleted(o) => {
                    seen.remove(&o.meta().uid.clone().unwrap_or_default());
                    vec![Ok(K::clone(&o))]
                }
            };
            futures::stream::iter(out)
        })
    }

    /// Every object the cache holds now, then each one it applies from here on (a later
    /// subscription replaces this one). An object deleted before it is read is still handed
    /// over (the controller finds it gone from the cache and skips it) and the stream goes on.
    pub fn subscribe(&self) -> UnboundedReceiver<Arc<K>> {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        // Under the lock the dispatch takes: no change falls between the snapshot and the
        // first one forwarded (one may come twice, which a controller's queue merges).
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        for o in self.cache.state() {
            let _ = tx.unbounded_send(o);
        }
        *reader = Some(tx);
        rx
    }

    /// Hands the subscriber what one event, already applied to the cache, changed: an
    /// object applied, or at the end of a (re)list every object (as kube-runtime's shared
    /// streams do). A deletion is not handed over (the kinds that need to see one hold a
    /// finalizer). A subscriber that has gone is dropped.
    fn dispatch(&self, event: &watcher::Event<K>) {
        self.tell_relations(event);
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(tx) = reader.as_ref() else {
            return;
        };
        let changed = match event {
            watcher::Event::Apply(o) => self
                .cache
                .get(&ObjectRef::from_obj(o))
                .into_iter()
                .collect(),
            watcher::Event::InitDone => self.cache.state(),
            _ => Vec::new(),
        };
        if changed.into_iter().any(|o| tx.unbounded_send(o).is_err()) {
            *reader = None;
        }
    }
}

impl<K: Watched> Subscription<K> {
    /// Tells every relation watch what `event` changed; a watch that has gone is dropped.
    fn tell_relations(&self, event: &watcher::Event<K>) {
        let mut relations = self
            .relations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if relations.is_empty() {
            return;
        }
        let relation = || match event {
            watcher::Event::Apply(o) => self
                .cache
                .get(&ObjectRef::from_obj(o))
                .map(Relation::Applied),
            watcher::Event::Delete(o) => Some(Relation::Deleted(Arc::new(o.clone()))),
            watcher::Event::InitDone => Some(Relation::Listed(self.cache.state())),
            _ => None,
        };
        relations.retain(|tx| relation().is_none_or(|r| tx.unbounded_send(r).is_ok()));
    }
}

/// Which changes of a related kind a relation watch passes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Those of [`spec_changes`]: status-only writes pass by.
    SpecChanges,
    /// Every change, status included (a ModelDeployment shows its Binding's usage).
    Every,
}

/// Whether a relation watch of `pass` hands `o` over (recording its [`SpecKey`]).
fn passes<K: Watched>(pass: Pass, seen: &mut HashMap<String, SpecKey>, o: &Arc<K>) -> Option<K> {
    match pass {
        Pass::SpecChanges => changed(seen, o),
        Pass::Every => Some(K::clone(o)),
    }
}

/// Whether `o`'s [`SpecKey`] differs from the one last seen for its uid (recording it).
fn changed<K: Watched>(seen: &mut HashMap<String, SpecKey>, o: &Arc<K>) -> Option<K> {
    let key = SpecKey::of(&**o);
    let uid = o.meta().uid.clone().unwrap_or_default();
    (seen.insert(uid, key.clone()) != Some(key)).then(|| K::clone(o))
}

/// A reflector store kept up to date by its own task, whose changes one controller reads as
/// its primary watch through [`Subscription::subscribe`]: one cache of the kind for the
/// controller, the mappers and the webhook.
pub fn reflect_shared<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Subscription<K>)
where
    K: Watched,
{
    reflect_shared_stripped(api, config, |_| {})
}

/// [`reflect_shared`], each object also stripped by `strip` before the cache stores it (a
/// Node's status, with its image list, is read by nothing here).
pub fn reflect_shared_stripped<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: fn(&mut K),
) -> (Store<K>, Subscription<K>)
where
    K: Watched,
{
    let (reader, stream) = stripped_reflector(api, config, strip);
    let changes = Subscription::new(reader.clone());
    tokio::spawn(drive(stream, changes.clone()));
    (reader, changes)
}

/// Drives a reflector's events (each applied to the cache before it comes out) and hands
/// each to the subscriber.
async fn drive<K, S>(stream: S, changes: Subscription<K>)
where
    K: Watched,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    stream
        .for_each(|event| {
            if let Ok(event) = &event {
                changes.dispatch(event);
            }
            futures::future::ready(())
        })
        .await;
}

/// How many reconciles of one controller run at once. Unbounded, 2,000 ModelDeployments
/// reconciled together overloaded the API server of the scale benchmark (504 Gateway Timeout).
pub const CONCURRENCY: u16 = 16;

/// A controller whose primary watch goes through a [`stripped_reflector`] of our own, with
/// bounded concurrency.
pub fn controller<K>(api: Api<K>, config: watcher::Config) -> kube::runtime::Controller<K>
where
    K: Watched,
{
    let (reader, stream) = stripped_reflector(api, config, |_| {});
    kube::runtime::Controller::for_stream(stream.applied_objects(), reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
}

/// A controller whose primary watch is a subscription to a shared cache ([`reflect_shared`]),
/// with bounded concurrency.
pub fn shared_controller<K>(
    changes: &Subscription<K>,
    cache: Store<K>,
) -> kube::runtime::Controller<K>
where
    K: Watched,
{
    kube::runtime::Controller::for_shared_stream(changes.subscribe(), cache)
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
}

/// What a relation watch passes on: an object whose desired state changed (its generation),
/// whose finalizers changed, or that was deleted. Status-only writes pass by, so that a status
/// one controller writes (the pool pass writes every Binding's) never requeues the objects that
/// only depend on the spec. The first sight of each object passes.
pub fn spec_changes<K>(
    api: Api<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Watched,
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use kvcache_api::KVCachePoolBinding;

    fn config_map(name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team-a".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The names of the next `n` objects a subscription hands over, each within 5 s (fails
    /// naming what came if fewer).
    async fn next_names(
        rx: &mut UnboundedReceiver<Arc<k8s_openapi::api::core::v1::ConfigMap>>,
        n: usize,
    ) -> Vec<String> {
        let mut names = Vec::new();
        while names.len() < n {
            match tokio::time::timeout(std::time::Duration::from_secs(5), rx.next()).await {
                Ok(Some(o)) => names.push(o.metadata.name.clone().unwrap_or_default()),
                other => panic!("waited 5s for {n} changes, got {names:?} then {other:?}"),
            }
        }
        names
    }

    /// The watch events a test sends.
    type Events = futures::channel::mpsc::UnboundedSender<
        Result<watcher::Event<k8s_openapi::api::core::v1::ConfigMap>, watcher::Error>,
    >;

    /// A shared cache of ConfigMaps and its changes, driven by what the test sends on the
    /// returned sender; the driver ends once the sender is dropped.
    fn driven_cache() -> (
        Store<k8s_openapi::api::core::v1::ConfigMap>,
        Subscription<k8s_openapi::api::core::v1::ConfigMap>,
        Events,
        tokio::task::JoinHandle<()>,
    ) {
        let (cache, writer) = reflector::store();
        let changes = Subscription::new(cache.clone());
        let (tx, events) = futures::channel::mpsc::unbounded();
        let driven = tokio::spawn(drive(reflector::reflector(writer, events), changes.clone()));
        (cache, changes, tx, driven)
    }

    /// Waits (5 s at most) until the names the cache holds, sorted, satisfy `done`.
    async fn wait_until(
        cache: &Store<k8s_openapi::api::core::v1::ConfigMap>,
        done: impl Fn(&[String]) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let mut names: Vec<String> = cache
                .state()
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .collect();
            names.sort();
            if done(&names) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "waited 5s for the cache, which holds {} objects",
                names.len()
            );
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn an_object_deleted_before_its_change_is_read_does_not_stall_the_next_one() {
        use kube::runtime::watcher::Event;
        let (cache, changes, tx, driven) = driven_cache();
        let mut rx = changes.subscribe();
        // What the CI run saw: a ModelDeployment changed, then deleted before the controller
        // read the change, then a new one created.
        for e in [
            Event::Apply(config_map("qwen-chat")),
            Event::Delete(config_map("qwen-chat")),
            Event::Apply(config_map("qwen-by-pool")),
        ] {
            tx.unbounded_send(Ok(e)).expect("the driver reads");
        }
        wait_until(&cache, |names| names == ["qwen-by-pool"]).await;
        // Both changes are there to be read at once, without another wake-up.
        let ready: Vec<Option<String>> = (0..2)
            .map(|_| {
                rx.next()
                    .now_or_never()
                    .flatten()
                    .and_then(|o| o.metadata.name.clone())
            })
            .collect();
        assert_eq!(
            ready,
            [
                Some("qwen-chat".to_owned()),
                Some("qwen-by-pool".to_owned())
            ]
        );
        // Read while nothing is pending, then woken by the next change.
        let later =
            tokio::spawn(async move { rx.next().await.and_then(|o| o.metadata.name.clone()) });
        tokio::task::yield_now().await;
        tx.unbounded_send(Ok(Event::Apply(config_map("qwen-coder"))))
            .expect("the driver reads");
        let woken = tokio::time::timeout(std::time::Duration::from_secs(5), later)
            .await
            .unwrap_or_else(|_| panic!("waited 5s for the reader to be woken by qwen-coder"));
        assert_eq!(woken.expect("the reader").as_deref(), Some("qwen-coder"));
        drop(tx);
        driven.await.expect("the driver ends with its events");
    }

    #[tokio::test]
    async fn a_late_subscriber_gets_what_the_cache_holds_and_an_absent_one_holds_nothing_back() {
        use kube::runtime::watcher::Event;
        let (cache, changes, tx, driven) = driven_cache();
        // No subscriber (a standby): far more changes than any buffer, all applied.
        for i in 0..1000 {
            tx.unbounded_send(Ok(Event::Apply(config_map(&format!("cm-{i}")))))
                .expect("the driver reads");
        }
        tx.unbounded_send(Ok(Event::Delete(config_map("cm-0"))))
            .expect("the driver reads");
        wait_until(&cache, |names| names.len() == 999).await;
        // Elected: the controller starts from everything the cache holds, then the changes.
        let mut rx = changes.subscribe();
        assert_eq!(next_names(&mut rx, 999).await.len(), 999);
        tx.unbounded_send(Ok(Event::Apply(config_map("cm-0"))))
            .expect("the driver reads");
        assert_eq!(next_names(&mut rx, 1).await, ["cm-0"]);
        // A subscriber that went away is dropped; the cache goes on.
        drop(rx);
        tx.unbounded_send(Ok(Event::Apply(config_map("cm-1000"))))
            .expect("the driver reads");
        drop(tx);
        driven.await.expect("the driver ends with its events");
        assert_eq!(cache.state().len(), 1001);
        assert!(changes.reader.lock().expect("unpoisoned").is_none());
    }

    /// The next object a relation watch hands over (within 5 s), and whether the cache held
    /// its change when it came.
    async fn next_relation(
        relations: &mut (
                 impl futures::Stream<
            Item = Result<k8s_openapi::api::core::v1::ConfigMap, watcher::Error>,
        > + Unpin
             ),
        cache: &Store<k8s_openapi::api::core::v1::ConfigMap>,
    ) -> (String, bool) {
        let o = tokio::time::timeout(std::time::Duration::from_secs(5), relations.next())
            .await
            .expect("a change within 5 s")
            .expect("the stream goes on")
            .expect("no watch error");
        let held = cache.get(&ObjectRef::from_obj(&o)).is_some();
        (o.metadata.name.clone().unwrap_or_default(), held)
    }

    #[tokio::test]
    async fn a_relation_watch_hears_of_a_change_only_once_the_cache_holds_it_deletions_included() {
        use kube::runtime::watcher::Event;
        let (cache, changes, tx, driven) = driven_cache();
        let mut first = config_map("cm-a");
        first.metadata.uid = Some("a".into());
        first.metadata.generation = Some(1);
        tx.unbounded_send(Ok(Event::Apply(first.clone())))
            .expect("the driver reads");
        wait_until(&cache, |names| names == ["cm-a"]).await;
        let relations = changes.relation_changes(Pass::SpecChanges);
        futures::pin_mut!(relations);
        // What the cache held when the watch began.
        assert_eq!(
            next_relation(&mut relations, &cache).await,
            ("cm-a".to_owned(), true)
        );
        // A write that changes nothing of the spec (a status write) passes by; a new object
        // comes, already in the cache.
        let mut b = config_map("cm-b");
        b.metadata.uid = Some("b".into());
        tx.unbounded_send(Ok(Event::Apply(first.clone())))
            .expect("the driver reads");
        tx.unbounded_send(Ok(Event::Apply(b)))
            .expect("the driver reads");
        assert_eq!(
            next_relation(&mut relations, &cache).await,
            ("cm-b".to_owned(), true)
        );
        // A deletion comes once the cache has let it go.
        tx.unbounded_send(Ok(Event::Delete(first)))
            .expect("the driver reads");
        assert_eq!(
            next_relation(&mut relations, &cache).await,
            ("cm-a".to_owned(), false)
        );
        drop(tx);
        driven.await.expect("the driver ends with its events");
    }

    #[tokio::test]
    async fn a_relation_watch_of_every_change_hears_a_status_write_once_the_cache_holds_it() {
        use kube::runtime::watcher::Event;
        let (cache, changes, tx, driven) = driven_cache();
        let relations = changes.relation_changes(Pass::Every);
        futures::pin_mut!(relations);
        let mut first = config_map("cm-a");
        first.metadata.uid = Some("a".into());
        first.metadata.generation = Some(1);
        tx.unbounded_send(Ok(Event::Apply(first.clone())))
            .expect("the driver reads");
        assert_eq!(
            next_relation(&mut relations, &cache).await,
            ("cm-a".to_owned(), true)
        );
        // The same generation again (a status write): heard, and the cache already holds it.
        first.metadata.resource_version = Some("2".into());
        tx.unbounded_send(Ok(Event::Apply(first.clone())))
            .expect("the driver reads");
        let (name, held) = next_relation(&mut relations, &cache).await;
        assert_eq!((name.as_str(), held), ("cm-a", true));
        let held_version = cache
            .get(&ObjectRef::from_obj(&first))
            .and_then(|o| o.metadata.resource_version.clone());
        assert_eq!(held_version.as_deref(), Some("2"));
        drop(tx);
        driven.await.expect("the driver ends with its events");
    }

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
}
