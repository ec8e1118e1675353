//! The watch plumbing the controllers share: reflector caches that drop `managedFields`, a
//! controller over one of them with bounded concurrency, relation watches that pass spec changes
//! only.

use std::collections::HashMap;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ReflectHandle, Store};
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
        watcher(api, config).modify(|o: &mut K| o.meta_mut().managed_fields = None),
    )
    .default_backoff();
    (reader, stream)
}

/// A reflector store kept up to date by its own task.
pub fn reflect<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: Watched,
{
    let (reader, stream) = stripped_reflector(api, config);
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    reader
}

/// How many changes a shared cache holds for a subscriber that has not read them yet; past it
/// the cache waits for the subscriber (a controller reads them into its queue at once).
const SHARED_BUFFER: usize = 256;

/// A reflector store kept up to date by its own task, whose changes `subscribe` controller
/// reads as its primary watch (kube-runtime's shared streams): one cache of the kind for the
/// controller, the mappers and the webhook. Without a subscriber it is a plain cache (an
/// unread subscription would hold the cache back).
pub fn reflect_shared<K>(
    api: Api<K>,
    config: watcher::Config,
    subscribe: bool,
) -> (Store<K>, Option<ReflectHandle<K>>)
where
    K: Watched,
{
    if !subscribe {
        return (reflect(api, config), None);
    }
    let (reader, writer) = reflector::store_shared(SHARED_BUFFER);
    let handle = writer.subscribe();
    let stream = watcher(api, config)
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .default_backoff()
        .reflect_shared(writer);
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    (reader, handle)
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
    let (reader, stream) = stripped_reflector(api, config);
    kube::runtime::Controller::for_stream(stream.applied_objects(), reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
}

/// A controller whose primary watch is a subscription to a shared cache ([`reflect_shared`]),
/// with bounded concurrency.
pub fn shared_controller<K>(
    changes: ReflectHandle<K>,
    cache: Store<K>,
) -> kube::runtime::Controller<K>
where
    K: Watched,
{
    kube::runtime::Controller::for_shared_stream(changes, cache)
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
    use kvcache_api::KVCachePoolBinding;

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
