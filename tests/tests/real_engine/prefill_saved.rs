//! The figures a team reads, held to the engines' own counters read directly. Two replicas of
//! the prefill-heavy bench model (`engine::BENCH_MODEL`, whose prefill costs what a load
//! saves): replica A computes a short and a long prompt, replica B takes the long one from the
//! store computing almost nothing (the case whose own price was 4x too high), then many; the
//! deployment's `prefillSecondsSaved` must agree within 30 % with what A's own prefills price
//! B's loaded tokens at, less B's own load time. Every other figure of `status.sharedCache`
//! (and the Binding's, which must also be the sum of its deployments') must equal the growth
//! of the engines' counters over the window, with A's Pod gone from it, and after B's engine
//! restarted.
//!
//! Each burst of requests starts once the previous one has left the window (the status shows
//! an empty window), so that the operator's baseline is a quiet reading and the window's growth
//! is what the test read from the engines before and after the burst.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kvcache_api::model::SharedCacheStatus;
use kvcache_api::{KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::walkthrough::{self, role_pods};
use kvcache_e2e::{Error, engine};
use kvcache_render::observe::shared_cache::{self, EngineCounters, StoreOperations};

use crate::{
    BACKEND, CHAT, NAMESPACE, TEAM_A, WAIT, cluster, operator, ready_engines, turn, undeploy,
};

/// The deployment of the bench model.
const PRICED: &str = "priced";
/// Its context, room for the long prompt (the bench model's 4,096 positions).
const CONTEXT: usize = 4096;
/// The sizes of replica A's own prefills, read one at a time: its own price of a token.
const OWN_SIZES: [usize; 5] = [256, 1024, 512, 2048, 768];
/// The prompt B takes from the store first, and the prompts of the many hits.
const LONG: usize = 2048;
const MANY: usize = 1024;
/// How many hits "many" is.
const HITS: u32 = 4;
/// How long a burst's figures can be waited for: past the window they have left it.
const WITHIN_WINDOW: std::time::Duration = std::time::Duration::from_secs(120);
/// How close the operator's seconds saved must come to A's own price of the same tokens.
const AGREEMENT: f64 = 0.30;

/// The bench model's deployment in team-a, `replicas` Ready engine Pods sorted by name.
async fn deploy(client: &Client, replicas: i32) -> Result<Vec<Pod>, Error> {
    let mut md =
        engine::model_deployment(TEAM_A, PRICED, engine::BENCH_MODEL, Some(TEAM_A), replicas);
    let mut args = engine::engine_args();
    if let Some(i) = args.iter().position(|a| a == "--max-model-len") {
        args[i + 1] = CONTEXT.to_string();
    }
    md["spec"]["roles"][0]["extraArgs"] = args.into();
    Api::<ModelDeployment>::namespaced(client.clone(), TEAM_A)
        .patch(
            PRICED,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&md),
        )
        .await?;
    ready_engines(client, TEAM_A, PRICED, replicas).await
}

/// What one request of `prompt` to the engine in `pod` added to its counters, once they count
/// its prefill (vLLM observes it as the request finishes, beside the answer).
async fn ask(client: &Client, pod: &Pod, prompt: &[u32]) -> Result<EngineCounters, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
    let before = engine::counters(client, TEAM_A, name_of(pod)).await?;
    engine::complete(&api, name_of(pod), engine::BENCH_MODEL, prompt, 4).await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let after = engine::counters(client, TEAM_A, name_of(pod)).await?;
        if after.prefills.requests > before.prefills.requests {
            return Ok(after.since(&before));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Wait {
                what: format!("{}'s counters holding the request's prefill", name_of(pod)),
                reason: format!("before {before:?}, after {after:?}"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Asks `writer` for `prompt` and waits until the master holds more keys than before.
async fn write_through(
    client: &Client,
    writer: &Pod,
    prompt: &[u32],
) -> Result<EngineCounters, Error> {
    let keys = engine::master_keys(client, NAMESPACE, BACKEND).await?;
    let added = ask(client, writer, prompt).await?;
    engine::wait_keys_above(
        client,
        NAMESPACE,
        BACKEND,
        keys,
        &format!("the blocks {} wrote", name_of(writer)),
    )
    .await?;
    Ok(added)
}

/// Every engine Pod's counters, by name.
async fn read_all(
    client: &Client,
    engines: &[&Pod],
) -> Result<BTreeMap<String, EngineCounters>, Error> {
    let mut out = BTreeMap::new();
    for p in engines {
        let c = engine::counters(client, TEAM_A, name_of(p)).await?;
        out.insert(name_of(p).to_owned(), c);
    }
    Ok(out)
}

/// The figures `status.sharedCache` must show for a window holding the engines' growth from
/// `before` to `after` (a Pod absent `before` counts from zero), read from the engines
/// themselves: every count summed, the ratio and the median of the summed histogram, the
/// tokens from the store since each started. The price's fields are left out.
fn expected(
    before: &BTreeMap<String, EngineCounters>,
    after: &BTreeMap<String, EngineCounters>,
) -> SharedCacheStatus {
    let mut grown = EngineCounters::default();
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    let mut since_start = 0;
    for (pod, now) in after {
        let g = now.since(&before.get(pod).cloned().unwrap_or_default());
        grown.queried_tokens += g.queried_tokens;
        grown.hit_tokens += g.hit_tokens;
        grown.tokens_from_store += g.tokens_from_store;
        let ops = &mut grown.operations;
        ops.loads += g.operations.loads;
        ops.failed_loads += g.operations.failed_loads;
        ops.saves += g.operations.saves;
        ops.failed_saves += g.operations.failed_saves;
        ops.load_micros += g.operations.load_micros;
        for (le, n) in &g.operations.load_time {
            *buckets.entry(*le).or_default() += n;
        }
        since_start += now.tokens_from_store;
    }
    let StoreOperations {
        loads,
        failed_loads,
        saves,
        failed_saves,
        load_micros,
        ..
    } = grown.operations;
    let histogram: Vec<(u64, u64)> = buckets.into_iter().collect();
    SharedCacheStatus {
        window: match crate::SHARED_CACHE_WINDOW.as_secs() {
            s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
            s => format!("{s}s"),
        },
        queried_tokens: grown.queried_tokens,
        hit_tokens: grown.hit_tokens,
        hit_ratio: shared_cache::ratio(grown.hit_tokens, grown.queried_tokens),
        tokens_from_store: since_start,
        engines_read: u32::try_from(after.len()).unwrap_or(u32::MAX),
        loads,
        failed_loads,
        saves,
        failed_saves,
        load_time_p50: shared_cache::median_micros(&histogram)
            .map(|us| format!("{:.3}s", us as f64 / 1e6)),
        load_seconds: (loads > 0).then(|| format!("{:.3}", load_micros as f64 / 1e6)),
        ..Default::default()
    }
}

/// A status's figures without the price's fields (`prefillSecondsSaved`, its error, the price).
fn counts(s: &SharedCacheStatus) -> SharedCacheStatus {
    SharedCacheStatus {
        prefill_seconds_saved: None,
        prefill_seconds_saved_error: None,
        prefill_ms_per_token: None,
        ..s.clone()
    }
}

fn figures(m: &ModelDeployment) -> Option<&SharedCacheStatus> {
    m.status.as_ref()?.shared_cache.as_ref()
}

/// Waits until the deployment's window is empty (the last burst left it): no lookups, loads or
/// saves, with `engines` engines read.
async fn wait_empty_window(models: &Api<ModelDeployment>, engines: u32) -> Result<(), Error> {
    wait_object(
        models,
        PRICED,
        &format!("an empty window read from {engines} engines"),
        WAIT,
        |m| {
            figures(m).is_some_and(|c| {
                c.engines_read == engines && c.queried_tokens == 0 && c.loads == 0 && c.saves == 0
            })
        },
    )
    .await
    .map(drop)
}

/// Waits until the deployment's status shows `want` (the price's fields aside) and returns it.
async fn wait_figures(
    models: &Api<ModelDeployment>,
    want: &SharedCacheStatus,
    what: &str,
) -> Result<SharedCacheStatus, Error> {
    let m = wait_object(models, PRICED, what, WITHIN_WINDOW, |m| {
        figures(m).is_some_and(|c| counts(c) == *want && c.prefill_seconds_saved.is_some())
    })
    .await?;
    Ok(figures(&m).cloned().unwrap_or_default())
}

/// Waits until the Binding's view is the sum of its deployments' and shows `want` (but for the
/// load median: medians do not add).
async fn wait_binding(
    client: &Client,
    want: &SharedCacheStatus,
) -> Result<SharedCacheStatus, Error> {
    let want = SharedCacheStatus {
        load_time_p50: None,
        ..want.clone()
    };
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), TEAM_A);
    let models: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM_A);
    let deadline = tokio::time::Instant::now() + WITHIN_WINDOW;
    loop {
        let view = bindings
            .get(TEAM_A)
            .await?
            .status
            .and_then(|s| s.shared_cache);
        let users: Vec<ModelDeployment> = models
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|m| {
                m.spec
                    .kv_cache
                    .as_ref()
                    .is_some_and(|k| k.pool_ref.name == TEAM_A)
            })
            .collect();
        let each: Vec<&SharedCacheStatus> = users.iter().filter_map(figures).collect();
        let sum = shared_cache::sum(&each);
        if let Some(v) = &view
            && view == sum
            && counts(v) == want
        {
            return Ok(v.clone());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Wait {
                what: format!("team-a's Binding showing the sum of its deployments, {want:?}"),
                reason: format!("last: the Binding {view:?}, its deployments summed {sum:?}"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The seconds a status says were saved.
fn saved(s: &SharedCacheStatus) -> f64 {
    s.prefill_seconds_saved
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Checks the operator's seconds saved against A's own price of the window's loaded tokens,
/// less the loads' own time, and prints both (and what B's own price, the old figure, said).
fn check_saved(
    what: &str,
    status: &SharedCacheStatus,
    own_price_micros: f64,
    reader: &EngineCounters,
    window: (u64, u64),
) {
    let (loaded, load_micros) = window;
    let own = (own_price_micros * loaded as f64 - load_micros as f64) / 1e6;
    let figure = saved(status);
    // What the reader's own prefill time over its own computed tokens claimed before.
    let readers_own = reader.prefills.micros as f64 / reader.prefills.computed_tokens.max(1) as f64;
    println!(
        "{what}: the operator says {figure:.2} s saved (± {}; {} ms a token), replica A's own prefills price the {loaded} tokens loaded at {own:.2} s net of the loads' {:.3} s ({:.3} ms a token): {:+.0} %; the reader's own price claimed {:.2} s",
        status.prefill_seconds_saved_error.as_deref().unwrap_or("-"),
        status.prefill_ms_per_token.as_deref().unwrap_or("-"),
        load_micros as f64 / 1e6,
        own_price_micros / 1e3,
        (figure - own) / own * 100.0,
        readers_own * loaded as f64 / 1e6
    );
    assert!(
        engine::agrees(figure, own, AGREEMENT),
        "{what}: the operator's {figure} s saved is more than {:.0} % from replica A's own {own:.2} s ({status:?})",
        AGREEMENT * 100.0
    );
}

/// The tokens loaded and the loads' time over the window, from the engines' own counters.
fn loaded(
    before: &BTreeMap<String, EngineCounters>,
    after: &BTreeMap<String, EngineCounters>,
) -> (u64, u64) {
    after.iter().fold((0, 0), |(t, us), (pod, now)| {
        let g = now.since(&before.get(pod).cloned().unwrap_or_default());
        (t + g.tokens_from_store, us + g.operations.load_micros)
    })
}

#[test]
fn the_seconds_saved_and_every_figure_agree_with_the_engines_own_counters() {
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        // Two engines of the bench model at most beside the store: team-a's pair goes first.
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), TEAM_A);
        if models.get_opt(CHAT).await?.is_some() {
            undeploy(&client, TEAM_A, CHAT).await?;
        }
        let replicas = deploy(&client, 2).await?;
        let (a, b) = (replicas[0].clone(), replicas[1].clone());
        let api: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);

        // 0. A's own prefills, of several sizes, each read by the operator before the next
        // (a reading apiece): what A's own measure of a token's price comes from.
        let mut own = Vec::new();
        for (i, size) in OWN_SIZES.iter().enumerate() {
            let version = models.get(PRICED).await?.resource_version();
            let added = ask(&client, &a, &engine::prompt(930 + i as u32, *size)).await?;
            println!(
                "A computed {} tokens in {:.3} s",
                added.prefills.computed_tokens,
                added.prefills.micros as f64 / 1e6
            );
            own.push(added.prefills);
            wait_object(
                &models,
                PRICED,
                "the operator's next read of A",
                WAIT,
                |m| m.resource_version() != version,
            )
            .await?;
        }

        // 1. A computes a long prompt; B takes it from the store and computes almost nothing.
        wait_empty_window(&models, 2).await?;
        let before = read_all(&client, &[&a, &b]).await?;
        let long_prompt = engine::prompt(902, LONG);
        let long = write_through(&client, &a, &long_prompt).await?;
        own.push(long.prefills);
        let hit = ask(&client, &b, &long_prompt).await?;
        let after = read_all(&client, &[&a, &b]).await?;
        println!(
            "A computed {} tokens in {:.3} s; B loaded {} and computed {} in {:.3} s",
            long.prefills.computed_tokens,
            long.prefills.micros as f64 / 1e6,
            hit.tokens_from_store,
            hit.prefills.computed_tokens,
            hit.prefills.micros as f64 / 1e6
        );
        assert!(
            hit.tokens_from_store > 0 && hit.prefills.computed_tokens <= 32,
            "B took the long prompt from the store, computing the last block at most: {hit:?}"
        );
        let own_price = engine::own_price_micros(&own).ok_or_else(|| Error::Wait {
            what: "replica A's prefills of several sizes".into(),
            reason: format!("{own:?}"),
        })?;
        let want = expected(&before, &after);
        let status = wait_figures(&models, &want, "the window holding B's hit").await?;
        let reader = &after[name_of(&b)];
        check_saved(
            "one hit by an engine that computed almost nothing",
            &status,
            own_price,
            reader,
            loaded(&before, &after),
        );
        wait_binding(&client, &want).await?;
        // Priced: the operator exports the Binding's seconds saved (absent before a price).
        operator()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .wait_metrics("every priced series exported", WAIT, |t| {
                kvcache_render::install::monitoring::PRICED_SERIES
                    .iter()
                    .all(|name| {
                        t.lines().any(|l| {
                            !l.starts_with('#') && l.split(['{', ' ']).next() == Some(*name)
                        })
                    })
            })?;

        // 2. Many: A writes more prompts, B takes each from the store. Then A's Pod goes: its
        // saves leave the window with it, B's loads stay.
        wait_empty_window(&models, 2).await?;
        let before = read_all(&client, &[&a, &b]).await?;
        let prompts: Vec<Vec<u32>> = (0..HITS).map(|i| engine::prompt(910 + i, MANY)).collect();
        for p in &prompts {
            write_through(&client, &a, p).await?;
        }
        for p in &prompts {
            let added = ask(&client, &b, p).await?;
            assert!(added.tokens_from_store > 0, "B hit {added:?}");
        }
        let after = read_all(&client, &[&a, &b]).await?;
        let want = expected(&before, &after);
        let status = wait_figures(&models, &want, "the window holding the many hits").await?;
        api.delete(name_of(&a), &DeleteParams::default().grace_period(0))
            .await?;
        check_saved(
            &format!("{HITS} hits"),
            &status,
            own_price,
            &after[name_of(&b)],
            loaded(&before, &after),
        );
        let b_only: BTreeMap<String, EngineCounters> = after
            .iter()
            .filter(|(pod, _)| pod.as_str() == name_of(&b))
            .map(|(p, c)| (p.clone(), c.clone()))
            .collect();
        let want = expected(&before, &b_only);
        assert!(want.loads > 0 && want.saves < expected(&before, &after).saves);
        let status = wait_figures(
            &models,
            &want,
            "A's Pod gone from the window, B's loads in it",
        )
        .await?;
        println!("A's Pod gone: {status:?}");
        wait_binding(&client, &want).await?;

        // 3. B's engine restarted in its Pod (its counters start again); A's replacement writes
        // a prompt and B takes it from the store.
        let replicas = ready_engines(&client, TEAM_A, PRICED, 2).await?;
        let a = replicas
            .iter()
            .find(|p| p.uid() != a.uid() && name_of(p) != name_of(&b))
            .cloned()
            .ok_or_else(|| Error::Wait {
                what: "A's replacement".into(),
                reason: format!("{:?}", replicas.iter().map(name_of).collect::<Vec<_>>()),
            })?;
        let restarts = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum::<i32>())
        };
        let b = api.get(name_of(&b)).await?;
        let count = restarts(&b);
        for pid in pods::host_pids(&b) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let b_name = name_of(&b).to_owned();
        let b = pods::wait_pods(
            &api,
            &role_pods(PRICED, "server"),
            "B's engine restarted in its Pod and Ready again",
            WAIT,
            |p| {
                p.iter()
                    .any(|p| name_of(p) == b_name && restarts(p) > count && pods::is_ready(p))
            },
        )
        .await?
        .into_iter()
        .find(|p| name_of(p) == b_name)
        .expect("B");
        wait_empty_window(&models, 2).await?;
        let before = read_all(&client, &[&a, &b]).await?;
        let p = engine::prompt(920, MANY);
        write_through(&client, &a, &p).await?;
        let added = ask(&client, &b, &p).await?;
        assert!(
            added.tokens_from_store > 0,
            "the restarted engine hit: {added:?}"
        );
        let after = read_all(&client, &[&a, &b]).await?;
        let want = expected(&before, &after);
        let status = wait_figures(&models, &want, "the window after B's restart").await?;
        check_saved(
            "a hit after the reader restarted",
            &status,
            own_price,
            &after[name_of(&b)],
            loaded(&before, &after),
        );
        wait_binding(&client, &want).await?;
        undeploy(&client, TEAM_A, PRICED).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
