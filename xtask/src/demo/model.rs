//! Step 3: the model on two real vLLM replicas sharing blocks through the store, timed, and the
//! operator's figure of what the cache saved checked against the engines' own.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use kvcache_api::model::conditions::CACHE_ATTACHED;
use kvcache_render::observe::shared_cache::EngineCounters;

use super::engine::{ask, counters, engine_pods, own_counters, time_to_first_token};
use super::kubectl::{Demo, NS, file};
use super::leader::key_count;

/// The shared prompt the demo times, in tokens (125 blocks of 32): long enough that computing
/// it costs several times what loading its 62.5 MiB of blocks does, with the model computing
/// in bfloat16 (about 3.6x faster than float32 on this project's CPU).
const TIMED_PROMPT: usize = 4000;

/// The model on two real vLLM replicas: A writes a prompt's blocks, B finds them in the store,
/// `CacheAttached` and the hit ratio show it.
pub(super) fn the_model(d: &mut Demo, files: &Path) -> anyhow::Result<()> {
    d.show(&[
        "apply",
        "-f",
        &file(files, "04-instancetype.yaml"),
        "-f",
        &file(files, "05-modeldeployment.yaml"),
    ])?;
    d.wait(
        "the deployment Ready (both vLLM Pods Ready; the first start unpacks the image)",
        &[
            "-n",
            "team-a",
            "get",
            "md",
            "qwen-chat",
            "-o",
            "jsonpath={.status.phase}",
        ],
        Duration::from_secs(600),
        |s| s == "Ready",
    )?;
    d.show(&["-n", "team-a", "get", "pods", "-o", "wide"])?;
    let pods = engine_pods(d)?;
    let [a, b] = pods.as_slice() else {
        bail!("qwen-chat runs {} engine Pods, not 2: {pods:?}", pods.len());
    };
    println!("replica A ({a}) computes the prompt and writes its KV blocks to the store:");
    let a_fresh = own_counters(d, a)?;
    ask(d, a, 1)?;
    let a_short = own_counters(d, a)?;
    d.wait_condition(
        "team-a",
        "md/qwen-chat",
        CACHE_ATTACHED,
        "the store charged the domain for replica A's blocks",
        Duration::from_secs(120),
    )?;
    println!("replica B ({b}) gets the same prompt and finds replica A's blocks in the store:");
    ask(d, b, 1)?;
    let c = counters(d, b)?;
    println!(
        "replica B took {} of its {} prompt tokens from the store",
        c.tokens_from_store, c.queried_tokens
    );
    anyhow::ensure!(
        c.hit_tokens > 0,
        "replica B found nothing in the store: {c:?}"
    );
    the_win(d, a, b)?;
    // Replica A's own prefills (the 200-token prompt, then the timed one) and replica B's own
    // loads: what the operator's figure is checked against.
    let a_long = own_counters(d, a)?;
    let b_own = own_counters(d, b)?;
    the_operators_view(d)?;
    let saved = the_tenants_view(d, b_own.tokens_from_store)?;
    checked_against_replica_a(saved, [&a_fresh, &a_short, &a_long], &b_own)
}

/// The operator's view after the timed prompt: its Lease held, the seeds' own check on the
/// deployment, and the deployment's shared-cache figures once it read the engines.
fn the_operators_view(d: &Demo) -> anyhow::Result<()> {
    // The operator keeps its Lease while the engines prefill on every core (at its old 50m
    // request its leader lost it here).
    d.show(&[
        "-n",
        NS,
        "get",
        "lease",
        "kvcache-operator",
        "-o",
        "jsonpath={.spec.holderIdentity} transitions={.spec.leaseTransitions}",
    ])?;
    println!();
    println!("the seeds' own check:");
    d.show(&[
        "-n",
        "team-a",
        "get",
        "md",
        "qwen-chat",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"CacheAttached\")]}",
    ])?;
    println!();
    d.wait(
        "the deployment's shared-cache hit ratio (the operator reads the engines every 15 s)",
        &[
            "-n",
            "team-a",
            "get",
            "md",
            "qwen-chat",
            "-o",
            "jsonpath={.status.sharedCache.hitTokens}",
        ],
        Duration::from_secs(120),
        |s| s.parse::<u64>().is_ok_and(|n| n > 0),
    )?;
    d.show(&["-n", "team-a", "get", "md"])?;
    d.show(&[
        "-n",
        "team-a",
        "get",
        "md",
        "qwen-chat",
        "-o",
        "jsonpath={.status.sharedCache}",
    ])?;
    println!();
    Ok(())
}

/// The tenant's view: the Binding sums the namespace's deployments that use it, once the
/// operator read replica B after its last load (`loaded`: the tokens replica B took from the
/// store). Returns the seconds saved it showed.
fn the_tenants_view(d: &Demo, loaded: u64) -> anyhow::Result<f64> {
    d.wait(
        "team-a's Binding summing its deployments, with the prefill time the cache saved",
        &[
            "-n",
            "team-a",
            "get",
            "kvcachepoolbinding",
            "team-a",
            "-o",
            "jsonpath={.status.sharedCache.prefillSecondsSaved} {.status.sharedCache.tokensFromStore}",
        ],
        Duration::from_secs(120),
        |s| {
            let mut words = s.split_whitespace();
            words.next().is_some_and(|v| v.parse::<f64>().is_ok())
                && words
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|n| n >= loaded)
        },
    )?;
    d.show(&["-n", "team-a", "get", "kvcachepoolbinding"])?;
    let shown = d.show(&[
        "-n",
        "team-a",
        "get",
        "kvcachepoolbinding",
        "team-a",
        "-o",
        "jsonpath={.status.sharedCache}",
    ])?;
    println!();
    // What the reader was just shown, not a second read that could differ from it.
    let view: kvcache_api::model::SharedCacheStatus =
        serde_json::from_str(&shown).context("team-a's Binding's status.sharedCache")?;
    let saved: f64 = view
        .prefill_seconds_saved
        .as_deref()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no seconds saved in {view:?}"))?;
    println!(
        "the cache saved team-a {saved:.2} s{} of prefill in the last {} (hit ratio {}, {} tokens from the store)",
        view.prefill_seconds_saved_error
            .as_deref()
            .map(|e| format!(" (± {e} s)"))
            .unwrap_or_default(),
        view.window,
        view.hit_ratio.as_deref().unwrap_or("-"),
        view.tokens_from_store
    );
    Ok(saved)
}

/// The operator's seconds `saved` against replica A's own price of the tokens replica B loaded:
/// its prefills before (`a[0]`), after the 200-token prompt (`a[1]`) and after the timed one
/// (`a[2]`), less the loads replica B's counters `b` took.
fn checked_against_replica_a(
    saved: f64,
    a: [&EngineCounters; 3],
    b: &EngineCounters,
) -> anyhow::Result<()> {
    let [a_fresh, a_short, a_long] = a;
    let loaded = b.tokens_from_store;
    let short = a_short.prefills.since(&a_fresh.prefills);
    let long = a_long.prefills.since(&a_short.prefills);
    let price = kvcache_e2e::engine::own_price_micros(&[short, long]).with_context(|| {
        format!("replica A's two prefills computed as many tokens: {short:?}, {long:?}")
    })?;
    let gross = price * loaded as f64 / 1e6;
    let load = b.operations.load_micros as f64 / 1e6;
    let own = gross - load;
    println!(
        "replica A's own prefills ({} tokens in {:.2} s, then {} in {:.2} s: {:.3} ms a token beyond a step's cost) price those {loaded} tokens at {gross:.2} s; less the {load:.2} s replica B's loads took: {own:.2} s, {:+.0} % from the operator's {saved:.2} s",
        short.computed_tokens,
        short.micros as f64 / 1e6,
        long.computed_tokens,
        long.micros as f64 / 1e6,
        price / 1e3,
        (saved - own) / own * 100.0
    );
    anyhow::ensure!(
        kvcache_e2e::engine::agrees(saved, own, PRICE_AGREEMENT),
        "the operator's {saved} s saved is more than {:.0} % from replica A's own {own:.2} s",
        PRICE_AGREEMENT * 100.0
    );
    Ok(())
}

/// The win a user came for: replica A computes a long prompt, replica B takes it from the
/// store; both timed to the first token, B's hit checked against its own counters.
fn the_win(d: &Demo, a: &str, b: &str) -> anyhow::Result<()> {
    let seed = 7;
    let keys = key_count(d)?;
    println!("replica A computes a {TIMED_PROMPT}-token prompt:");
    let computed = time_to_first_token(d, a, seed, TIMED_PROMPT)?;
    let blocks = (TIMED_PROMPT / kvcache_e2e::engine::BLOCK_SIZE as usize) as f64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while key_count(d)? < keys + blocks {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the master never held replica A's {blocks} blocks of the timed prompt (it holds {})",
            key_count(d)?
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let before = counters(d, b)?;
    println!("replica B gets the same prompt from the store:");
    let loaded = time_to_first_token(d, b, seed, TIMED_PROMPT)?;
    let after = counters(d, b)?;
    let from_store = after.tokens_from_store - before.tokens_from_store;
    println!(
        "time to first token: replica A computing {TIMED_PROMPT} tokens {:.0} ms, replica B with {from_store} of them from the store {:.0} ms: {:.1}x sooner",
        computed * 1e3,
        loaded * 1e3,
        computed / loaded
    );
    anyhow::ensure!(
        from_store > 0,
        "replica B took nothing of the timed prompt from the store: {before:?} then {after:?}"
    );
    Ok(())
}

/// How close the operator's seconds saved must come to replica A's own price of the same
/// tokens (docs/shared-cache-hits.md#its-error).
const PRICE_AGREEMENT: f64 = 0.30;
