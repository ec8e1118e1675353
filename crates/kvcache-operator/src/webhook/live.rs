//! Live reads for admission: the objects a request is judged against, read from the API server
//! where a cache could lag behind the request.

use std::sync::Arc;

use kube::api::DynamicObject;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};

use super::admission::{LiveRead, World};
use crate::error::{Error, Unjudgeable, kube as kube_error};

/// Live reads in flight at once, for every request together. A live read is one to four GETs
/// (Binding, pool, backend, InstanceTypes); every source may send reviews (a forged one names
/// what it likes), so without a bound each review in flight would be an API server read too.
/// 16 at once is at most 64 GETs in flight, a sixth of the API server's default 400 read
/// requests, and far more than the API server's own reviews need: they miss the caches only
/// for an object created a moment before (docs/design.md#live-reads).
pub const READS_AT_ONCE: usize = 16;

/// The bound on live reads in flight ([`READS_AT_ONCE`]): a read past it waits for a turn,
/// within its request's time (`serve::Bounds::request`).
pub struct Turns(tokio::sync::Semaphore);

impl Default for Turns {
    fn default() -> Self {
        Turns(tokio::sync::Semaphore::new(READS_AT_ONCE))
    }
}

impl Turns {
    /// Runs `read` once a turn is free.
    pub async fn run<F: std::future::Future>(&self, read: F) -> F::Output {
        // The semaphore is never closed: a permit always comes, or the request times out.
        let _turn = self.0.acquire().await;
        read.await
    }
}

/// Reads what [`super::admission::live_read`] asked for into `world`.
pub async fn read(client: &kube::Client, what: &LiveRead, world: &mut World) -> Result<(), Error> {
    match what {
        LiveRead::Binding { namespace, name } => {
            world.remove_binding(namespace, name);
            live_binding(client, namespace, name, world).await
        }
        LiveRead::Pool(name) => live_pool(client, name, world).await,
        LiveRead::Backend(name) => live_backend(client, name, world).await,
    }
}

/// What a ModelDeployment is judged against (docs/design.md#live-reads): its Binding, that Binding's pool
/// and backend, and the InstanceTypes its roles name, read live from the API server, so that a
/// Binding created a moment earlier counts. A deployment being deleted is judged against nothing
/// (the rules reading an InstanceType stand down).
pub async fn live_world(client: &kube::Client, object: &DynamicObject) -> Result<World, Error> {
    use kube::api::Api;
    use kvcache_api::ModelDeployment;
    use kvcache_api::model::InstanceType;
    let md: ModelDeployment = serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(Unjudgeable::DecodeJson)?;
    let mut world = World::default();
    if md.metadata.deletion_timestamp.is_some() {
        return Ok(world);
    }
    let read = |what: String| kube_error("read", what);
    let ns = md.metadata.namespace.clone().unwrap_or_default();
    if let Some(kv) = &md.spec.kv_cache {
        live_binding(client, &ns, &kv.pool_ref.name, &mut world).await?;
    }
    let its: Api<InstanceType> = Api::all(client.clone());
    let mut names: Vec<&str> = md
        .spec
        .roles
        .iter()
        .map(|r| r.instance_type.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        if let Some(it) = its
            .get_opt(name)
            .await
            .map_err(read(format!("InstanceType {name}")))?
        {
            world.add_instance_type(Arc::new(it));
        }
    }
    Ok(world)
}

/// Reads a Binding, its pool and that pool's backend live into `world` (those that exist).
pub async fn live_binding(
    client: &kube::Client,
    ns: &str,
    name: &str,
    world: &mut World,
) -> Result<(), Error> {
    use kube::api::Api;
    // A name no object can have names nothing to read: read, it could even reach another
    // object (`other/chat` is the subresource `chat` of the Binding `other`). The caller judges
    // the absent Binding (a Pod naming another namespace's is refused CrossNamespaceBinding).
    if !kvcache_api::admission::is_dns_subdomain(name) {
        return Ok(());
    }
    let read = |what: String| kube_error("read", what);
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), ns);
    let Some(b) = bindings
        .get_opt(name)
        .await
        .map_err(read(format!("KVCachePoolBinding {ns}/{name}")))?
    else {
        return Ok(());
    };
    live_pool(client, &b.spec.pool_ref.name, world).await?;
    world.add_binding(Arc::new(b));
    Ok(())
}

/// Reads a pool and its backend live into `world` (those that exist).
pub async fn live_pool(client: &kube::Client, name: &str, world: &mut World) -> Result<(), Error> {
    use kube::api::Api;
    if !kvcache_api::admission::is_dns_subdomain(name) {
        return Ok(());
    }
    let read = |what: String| kube_error("read", what);
    let pools: Api<KVCachePool> = Api::all(client.clone());
    if let Some(p) = pools
        .get_opt(name)
        .await
        .map_err(read(format!("KVCachePool {name}")))?
    {
        if let Some(backend) = p.spec.backend() {
            live_backend(client, backend, world).await?;
        }
        world.add_pool(Arc::new(p));
    }
    Ok(())
}

/// Reads a backend live into `world` (when it exists).
pub async fn live_backend(
    client: &kube::Client,
    name: &str,
    world: &mut World,
) -> Result<(), Error> {
    use kube::api::Api;
    if !kvcache_api::admission::is_dns_subdomain(name) {
        return Ok(());
    }
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    if let Some(be) = backends
        .get_opt(name)
        .await
        .map_err(kube_error("read", format!("KVCacheBackend {name}")))?
    {
        world.add_backend(Arc::new(be));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn reads_past_the_bound_wait_for_a_turn() {
        let turns = std::sync::Arc::new(Turns::default());
        let (now, most) = (
            std::sync::Arc::new(AtomicUsize::new(0)),
            std::sync::Arc::new(AtomicUsize::new(0)),
        );
        let reads: Vec<_> = (0..READS_AT_ONCE * 3)
            .map(|_| {
                let (turns, now, most) = (turns.clone(), now.clone(), most.clone());
                tokio::spawn(async move {
                    turns
                        .run(async {
                            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                            now.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                })
            })
            .collect();
        for r in reads {
            r.await.expect("a read ends");
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            READS_AT_ONCE,
            "reads in flight reach the bound and never pass it"
        );
    }
}
