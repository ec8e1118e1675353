use kvcache_api::model::conditions::PREFILL_PRICED;
use kvcache_api::model::{EngineName, SharedCacheStatus};

use super::figures::seconds_text;
use super::price::{PrefillFit, saved};
use super::window::{PRICE_HISTORY_MS, PRICE_PERIOD_MS};
use super::*;
use crate::observe::read::RoleObservation;
use crate::observe::store::{BadAnswer, ReadError};
use crate::world::Resolution;

const SCRAPE: &str = r#"# HELP vllm:external_prefix_cache_queries External prefix cache queries (tokens).
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="/models/tiny-llama"} 400.0
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="/models/tiny-llama"} 192.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="/models/tiny-llama",source="local_compute"} 208.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="/models/tiny-llama",source="external_kv_transfer"} 192.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="a \"quoted\" , name}",source="local_cache_hit"} 7.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf"} 2.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="/models/tiny-llama"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/models/tiny-llama"} 0.4125
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="/models/tiny-llama"} 2.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="/models/tiny-llama"} 208.0
vllm:request_prefill_kv_computed_tokens_created{engine="0",model_name="/models/tiny-llama"} 1.7e9
"#;

fn counters(q: u64, h: u64, s: u64) -> EngineCounters {
    EngineCounters {
        queried_tokens: q,
        hit_tokens: h,
        tokens_from_store: s,
        operations: StoreOperations::default(),
        prefills: Prefills::default(),
    }
}

/// Counters with `loads` loads of which `failed` failed, each taking 0.1 s.
fn loading(loads: u64, failed: u64) -> EngineCounters {
    EngineCounters {
        operations: StoreOperations {
            loads,
            failed_loads: failed,
            load_time: vec![(50_000, 0), (100_000, loads), (u64::MAX, loads)],
            ..Default::default()
        },
        ..counters(loads * 10, loads * 10, 0)
    }
}

const OPERATIONS: &str = r#"vllm:external_prefix_cache_queries_total{engine="0"} 10
vllm:external_prefix_cache_hits_total{engine="0"} 10
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="ok"} 7.0
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="error"} 3.0
vllm:mooncake_store_operation_total{engine="0",operation="load_get",status="partial_failure"} 2.0
vllm:mooncake_store_operation_total{engine="0",operation="save_put",status="ok"} 4.0
vllm:mooncake_store_operation_total{engine="0",operation="save_put",status="partial_failure"} 1.0
vllm:mooncake_store_operation_total{engine="0",operation="exists",status="error"} 9.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="load_get",le="0.05"} 2.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="load_get",le="0.1"} 10.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="load_get",le="+Inf"} 10.0
vllm:mooncake_store_operation_time_seconds_bucket{engine="0",operation="save_put",le="0.05"} 4.0
vllm:mooncake_store_operation_time_seconds_sum{engine="0",operation="load_get",status="ok"} 0.5
vllm:mooncake_store_operation_time_seconds_sum{engine="0",operation="load_get",status="error"} 0.25
vllm:mooncake_store_operation_time_seconds_sum{engine="0",operation="save_put",status="ok"} 9.0
"#;

#[test]
fn the_connectors_loads_saves_and_load_times_are_read_by_operation_and_status() {
    let c = parse_engine_metrics(EngineName::Vllm, "u", OPERATIONS).expect("readable");
    assert_eq!(
        c.operations,
        StoreOperations {
            loads: 12,
            failed_loads: 5,
            saves: 5,
            failed_saves: 1,
            load_time: vec![(50_000, 2), (100_000, 10), (u64::MAX, 10)],
            load_micros: 750_000,
        }
    );
    // The median of 10 loads, 2 under 50 ms and 8 between 50 and 100 ms: 5 is the third of
    // the 8 of the second bucket.
    assert_eq!(median_micros(&c.operations.load_time), Some(68_750));
    assert_eq!(median_micros(&[]), None);
    assert_eq!(median_micros(&[(u64::MAX, 0)]), None);
    assert_eq!(median_micros(&[(1_000, 0), (u64::MAX, 4)]), Some(1_000));
}

#[test]
fn failed_loads_in_the_window_turn_the_deployment_unhealthy_naming_the_pod() {
    let mut w = Window::default();
    w.record(
        0,
        60_000,
        &[
            reading("a", Ok(loading(100, 0))),
            reading("b", Ok(loading(100, 0))),
        ],
    );
    // 70 s on: within the window a loaded 20 more, all fine; b 20 more, 10 failed.
    let now = [
        reading("a", Ok(loading(120, 0))),
        reading("b", Ok(loading(120, 10))),
    ];
    w.record(70_000, 60_000, &now);
    let s = w.summary(70_000, 60_000, "1m");
    assert_eq!((s.loads, s.failed_loads), (40, 10));
    assert_eq!(s.load_time_p50.as_deref(), Some("0.075s"));
    let c = w.health(70_000, 60_000, &now);
    assert_eq!(
        (c.status, c.reason),
        (kvcache_api::condition::Status::False, "LoadsFallingBack")
    );
    assert!(
        c.message.contains("10 of 40 loads failed") && c.message.contains("b 10 of 20"),
        "{}",
        c.message
    );
    assert!(!c.message.contains("a "), "{}", c.message);
    // Within the share: healthy.
    let mut w = Window::default();
    w.record(0, 60_000, &[reading("a", Ok(loading(100, 5)))]);
    let c = w.health(0, 60_000, &[reading("a", Ok(loading(100, 5)))]);
    assert_eq!(c.reason, "LoadsSucceed");
    // No loads: nothing failing.
    assert_eq!(Window::default().health(0, 60_000, &[]).reason, "NoLoads");
}

/// An engine's counters after `prefills` (requests, computed tokens, ms), having loaded
/// `loaded` tokens in `load_ms`.
fn engine(prefills: (u64, u64, u64), loaded: u64, load_ms: u64) -> EngineCounters {
    EngineCounters {
        tokens_from_store: loaded,
        operations: StoreOperations {
            loads: u64::from(loaded > 0),
            load_micros: load_ms * 1000,
            ..Default::default()
        },
        prefills: Prefills {
            requests: prefills.0,
            computed_tokens: prefills.1,
            micros: prefills.2 * 1000,
        },
        ..counters(prefills.1 + loaded, loaded, loaded)
    }
}

/// A fit of readings (requests, computed tokens, µs).
fn fit(readings: &[(u64, u64, u64)]) -> PrefillFit {
    let mut f = PrefillFit::default();
    for &(requests, computed_tokens, micros) in readings {
        f.add(&Prefills {
            requests,
            computed_tokens,
            micros,
        });
    }
    f
}

#[test]
fn a_hit_by_an_engine_that_computed_almost_nothing_is_priced_by_the_deployments_prefills() {
    // The demo's case: a prefill step costs 180 ms whatever its tokens, a token 2.2 ms.
    // Replica A computes 200 tokens (0.62 s), then 4,000 (8.98 s); replica B computes 8
    // and 32 (0.1976 s and 0.2504 s: mostly the step's cost, 5.6 ms a token on its own)
    // and loads 192 and 3,968 tokens in 0.1 s and 0.45 s.
    let mut w = Window::default();
    let zero = engine((0, 0, 0), 0, 0);
    w.record(
        0,
        300_000,
        &[reading("a", Ok(zero.clone())), reading("b", Ok(zero))],
    );
    w.record(
        15_000,
        300_000,
        &[
            reading("a", Ok(engine((1, 200, 620), 0, 0))),
            reading("b", Ok(engine((1, 8, 197), 192, 100))),
        ],
    );
    // 197.6 ms rounds to 197: B's second reading adds 250.4 + 0.6 ms.
    w.record(
        30_000,
        300_000,
        &[
            reading("a", Ok(engine((2, 4200, 9600), 0, 0))),
            reading("b", Ok(engine((2, 40, 448), 4160, 550))),
        ],
    );
    let s = w.summary(30_000, 300_000, "5m");
    // 4,160 tokens at 2.2 ms, less the loads' 0.55 s; B's own price would claim 23.3 s.
    assert_eq!(s.prefill_seconds_saved.as_deref(), Some("8.60"), "{s:?}");
    assert_eq!(s.prefill_ms_per_token.as_deref(), Some("2.2000"), "{s:?}");
    assert_eq!(s.load_seconds.as_deref(), Some("0.550"));
    let error: f64 = s
        .prefill_seconds_saved_error
        .as_deref()
        .and_then(|e| e.parse().ok())
        .expect("an error bar from four readings");
    assert!(
        error < 0.01,
        "the readings lie on a line (to the ms): {s:?}"
    );
    let p = w.price().expect("priced");
    assert!((p.per_prefill_micros - 180_000.0).abs() < 1_000.0, "{p:?}");
    assert_eq!((p.computed_tokens, p.prefills, p.readings), (4240, 4, 4));
    let c = price_condition(&w.price());
    assert_eq!((c.type_, c.reason), (PREFILL_PRICED, "Priced"));
    assert!(
            c.message.starts_with("a computed prompt token costs 2.2000 ms (± 0.0")
                && c.message.contains(
                    "of prefill and a prefill 180 ms besides, fitted to 4240 tokens computed in 4 prefills (4 readings of the engines)"
                ),
            "{}",
            c.message
        );
}

#[test]
fn a_readers_slow_steps_after_its_loads_are_its_own_fixed_cost_not_a_cheaper_token() {
    // Measured on the bench model (real_engine::prefill_saved): the writer's prefills lie
    // on 60 ms + 0.686 ms a token; the reader's steps after its loads compute 32 tokens in
    // about 0.69 s. Fitted with one fixed cost for both, the reader's steps would pull the
    // price down by a third; each engine's own fixed cost leaves it the writer's.
    let mut w = Window::default();
    let (mut a, mut b) = ((0, 0, 0), (0, 0, 0));
    for (i, (size, ms, reader_ms)) in [(256, 236, 688), (1024, 762, 690), (2048, 1465, 700)]
        .into_iter()
        .enumerate()
    {
        a = (a.0 + 1, a.1 + size, a.2 + ms);
        b = (b.0 + 1, b.1 + 32, b.2 + reader_ms);
        let t = 15_000 * (i as u64 + 1);
        w.record(
            t,
            60_000,
            &[
                reading("a", Ok(engine(a, 0, 0))),
                reading("b", Ok(engine(b, 992 * (i as u64 + 1), 50))),
            ],
        );
    }
    let p = w.price().expect("priced");
    assert!((p.per_token_micros - 686.0).abs() < 2.0, "{p:?}");
    assert_eq!((p.readings, p.prefills), (6, 6));
    let one_engine = fit(&[
        (1, 256, 236_000),
        (1, 1024, 762_000),
        (1, 2048, 1_465_000),
        (1, 32, 688_000),
        (1, 32, 690_000),
        (1, 32, 700_000),
    ]);
    let pooled = one_engine.price().expect("priced");
    assert!(pooled.per_token_micros < 500.0, "{pooled:?}");
}

#[test]
fn a_price_needs_the_minimum_of_computed_tokens_in_prefills_of_different_sizes() {
    // 100 ms a prefill and 2 ms a token. One token short of the minimum: no price.
    let short = fit(&[(1, 47, 194_000), (1, 1000, 2_100_000), (1, 1000, 2_100_000)]);
    assert_eq!(
        short.price(),
        Err(Unpriced::TooFewTokens { computed: 2047 })
    );
    let at = fit(&[(1, 48, 196_000), (1, 1000, 2_100_000), (1, 1000, 2_100_000)]);
    let p = at.price().expect("priced at the minimum");
    assert!((p.per_token_micros - 2000.0).abs() < 1e-6, "{p:?}");
    assert!((p.per_prefill_micros - 100_000.0).abs() < 1e-3, "{p:?}");
    // One reading of an engine fixes only its fixed cost; two fix a line, and say nothing
    // of its error.
    let one = fit(&[(2, 2048, 2_000_000)]);
    assert_eq!(
        one.price(),
        Err(Unpriced::TooFewReadings {
            readings: 1,
            engines: 1
        })
    );
    let two = fit(&[(1, 48, 196_000), (1, 2000, 4_100_000)]);
    let p = two.price().expect("priced by two readings");
    assert!((p.per_token_micros - 2000.0).abs() < 1e-6, "{p:?}");
    assert_eq!(p.per_token_error_micros, None);
    // Every prefill as large: the fixed cost and the price cannot be told apart.
    let alike = fit(&[
        (1, 1024, 1_000_000),
        (1, 1024, 1_100_000),
        (2, 2048, 2_000_000),
    ]);
    assert_eq!(alike.price(), Err(Unpriced::PrefillsAlike { spread: 0.0 }));
    // Longer prefills took less time: nothing to price.
    let flat = fit(&[(1, 100, 500_000), (1, 3000, 400_000), (1, 1500, 450_000)]);
    assert_eq!(flat.price(), Err(Unpriced::NotGrowing));
    // 250 µs ± 1,010 µs: too noisy to show.
    let noisy = fit(&[
        (1, 1000, 1_000_000),
        (1, 2000, 3_000_000),
        (1, 3000, 1_500_000),
    ]);
    assert!(
        matches!(noisy.price(), Err(Unpriced::Unsettled { per_token_micros, error_micros })
                if (per_token_micros - 250.0).abs() < 1e-6 && (error_micros - 1010.0).abs() < 1.0),
        "{:?}",
        noisy.price()
    );
    // What the status shows before the minimum: no figure while tokens were loaded, the
    // loads' time alone while none were, and the condition says why.
    let mut w = Window::default();
    w.record(
        0,
        60_000,
        &[reading("b", Ok(engine((1, 8, 200), 192, 100)))],
    );
    let s = w.summary(0, 60_000, "1m");
    assert_eq!(
        (s.prefill_seconds_saved, s.prefill_ms_per_token),
        (None, None)
    );
    assert_eq!(s.load_seconds.as_deref(), Some("0.100"));
    let c = price_condition(&w.price());
    assert_eq!(
        (c.status, c.reason, c.message.as_str()),
        (
            kvcache_api::condition::Status::Unknown,
            "TooFewTokensComputed",
            "the engines computed 8 prompt tokens within the last hour and a price needs 2048: status.sharedCache.prefillSecondsSaved stays absent while tokens are loaded from the store"
        )
    );
    let mut w = Window::default();
    w.record(0, 60_000, &[reading("a", Ok(engine((1, 200, 400), 0, 0)))]);
    let s = w.summary(0, 60_000, "1m");
    assert_eq!(
        (s.prefill_seconds_saved.as_deref(), s.load_seconds),
        (Some("0.00"), None),
        "nothing loaded: nothing saved, whatever the price"
    );
    assert_eq!(price_condition(&alike.price()).reason, "PrefillsAlike");
    assert_eq!(price_condition(&flat.price()).reason, "PrefillsNotGrowing");
    assert_eq!(price_condition(&one.price()).reason, "TooFewReadings");
    assert!(
        price_condition(&two.price())
            .message
            .contains("(no error bar until a second reading beyond each engine's first)")
    );
    let c = price_condition(&noisy.price());
    assert_eq!(
            (
                c.reason,
                c.message.starts_with(
                    "the engines' prefills put a computed token at 0.2500 ms ± 1.0104 ms, more than 50 % uncertain"
                )
            ),
            ("PriceUnsettled", true),
            "{}",
            c.message
        );
}

#[test]
fn the_price_and_its_error_bar_are_the_weighted_least_squares_fit() {
    // t = 66.7 ms + 1 ms a token, residuals +33.3, -66.7, +33.3 ms: the standard error of
    // the slope is sqrt(6.667e9 / 1 / 2e6) = 57.7 µs.
    let p = fit(&[
        (1, 1000, 1_100_000),
        (1, 2000, 2_000_000),
        (1, 3000, 3_100_000),
    ])
    .price()
    .expect("priced");
    assert!((p.per_token_micros - 1000.0).abs() < 1e-6, "{p:?}");
    assert!((p.per_prefill_micros - 66_666.667).abs() < 1e-2, "{p:?}");
    assert!(
        (p.per_token_error_micros.unwrap_or_default() - 57.735).abs() < 1e-3,
        "{p:?}"
    );
    // A reading of several requests weighs as that many readings of one: the same line.
    let apart = fit(&[
        (1, 1000, 1_100_000),
        (1, 1000, 1_100_000),
        (1, 2000, 2_000_000),
        (1, 3000, 3_100_000),
    ]);
    let together = fit(&[
        (2, 2000, 2_200_000),
        (1, 2000, 2_000_000),
        (1, 3000, 3_100_000),
    ]);
    let (apart, together) = (
        apart.price().expect("priced"),
        together.price().expect("priced"),
    );
    assert!(
        (apart.per_token_micros - together.per_token_micros).abs() < 1e-9
            && (apart.per_prefill_micros - together.per_prefill_micros).abs() < 1e-6,
        "{apart:?} {together:?}"
    );
    // A negative fixed cost is noise: shown as none; the price is the line's slope.
    let p = fit(&[
        (1, 1000, 900_000),
        (1, 2000, 2_000_000),
        (1, 3000, 3_100_000),
    ])
    .price()
    .expect("priced");
    assert_eq!(p.per_prefill_micros, 0.0);
    assert!((p.per_token_micros - 1100.0).abs() < 1e-9, "{p:?}");
    // The seconds saved carry the price's error times the tokens loaded.
    let (s, e) = saved(
        1000,
        200_000,
        Some(
            &fit(&[
                (1, 1000, 1_100_000),
                (1, 2000, 2_000_000),
                (1, 3000, 3_100_000),
            ])
            .price()
            .expect("priced"),
        ),
    )
    .expect("saved");
    assert!((s - 800_000.0).abs() < 1e-3 && (e.unwrap_or_default() - 57_735.0).abs() < 1.0);
}

#[test]
fn the_price_keeps_a_gone_pods_prefills_counts_a_restart_from_zero_and_forgets_after_an_hour() {
    let mut w = Window::default();
    w.record(
        0,
        60_000,
        &[reading("a", Ok(engine((1, 2000, 2_100), 0, 0)))],
    );
    // a missed one pass (not ready) and is read again: its prefills are not counted twice.
    w.record(15_000, 60_000, &[]);
    w.record(
        30_000,
        60_000,
        &[reading("a", Ok(engine((2, 2100, 2_300), 0, 0)))],
    );
    assert_eq!(
        w.price().map(|p| (p.computed_tokens, p.readings)),
        Ok((2100, 2))
    );
    // a's engine restarted: what it did since counts from zero, nothing goes negative.
    w.record(
        45_000,
        60_000,
        &[reading("a", Ok(engine((1, 500, 600), 0, 0)))],
    );
    let p = w.price().expect("priced");
    assert_eq!((p.computed_tokens, p.prefills, p.readings), (2600, 3, 3));
    // a gone, b new: a's prefills still price b's loads.
    w.record(
        60_000,
        60_000,
        &[reading("b", Ok(engine((1, 8, 120), 192, 50)))],
    );
    let p = w.price().expect("priced");
    assert_eq!((p.computed_tokens, p.prefills), (2608, 4));
    assert!(
        w.summary(60_000, 60_000, "1m")
            .prefill_seconds_saved
            .is_some()
    );
    // An hour on, what was read before it is forgotten.
    w.record(
        60_000 + PRICE_HISTORY_MS + PRICE_PERIOD_MS,
        60_000,
        &[reading("b", Ok(engine((1, 8, 120), 192, 50)))],
    );
    assert_eq!(w.price(), Err(Unpriced::TooFewTokens { computed: 0 }));
}

#[test]
fn a_bindings_sum_adds_the_seconds_and_their_errors_in_quadrature_and_needs_every_figure() {
    let view = |saved: Option<&str>, error: Option<&str>| SharedCacheStatus {
        window: "5m".into(),
        load_seconds: Some("0.250".into()),
        prefill_seconds_saved: saved.map(str::to_owned),
        prefill_seconds_saved_error: error.map(str::to_owned),
        prefill_ms_per_token: Some("1.0000".into()),
        ..Default::default()
    };
    let (a, b) = (
        view(Some("3.00"), Some("0.30")),
        view(Some("-0.50"), Some("0.40")),
    );
    let s = sum(&[&a, &b]).expect("two");
    assert_eq!(
        (
            s.prefill_seconds_saved.as_deref(),
            s.prefill_seconds_saved_error.as_deref(),
            s.load_seconds.as_deref(),
            s.prefill_ms_per_token
        ),
        (Some("2.50"), Some("0.50"), Some("0.500"), None)
    );
    let unpriced = view(None, None);
    let s = sum(&[&a, &unpriced]).expect("two");
    assert_eq!(
        (s.prefill_seconds_saved, s.prefill_seconds_saved_error),
        (None, None),
        "a deployment without the figure would make the sum undercount"
    );
    assert_eq!(seconds_text(-1.0, 2), "0.00");
    assert_eq!(seconds_text(-10_000.0, 2), "-0.01");
}

#[test]
fn an_unreadable_engine_makes_health_unknown_and_is_named() {
    let mut w = Window::default();
    let now = [
        reading("a", Ok(loading(10, 0))),
        reading(
            "b",
            Err(ReadError::Status {
                url: "u".into(),
                status: 500,
            }),
        ),
    ];
    w.record(0, 60_000, &now);
    let c = w.health(0, 60_000, &now);
    assert_eq!(
        (c.status, c.reason),
        (
            kvcache_api::condition::Status::Unknown,
            "EngineMetricsUnreadable"
        )
    );
    assert!(c.message.contains('b'), "{}", c.message);
}

#[test]
fn an_engine_restarted_mid_window_neither_goes_negative_nor_doubles() {
    let mut w = Window::default();
    w.record(0, 60_000, &[reading("a", Ok(loading(50, 5)))]);
    w.record(10_000, 60_000, &[reading("a", Ok(loading(80, 8)))]);
    // The container restarted (same Pod uid): its counters start again from zero.
    w.record(20_000, 60_000, &[reading("a", Ok(loading(4, 1)))]);
    let s = w.summary(20_000, 60_000, "1m");
    assert_eq!(
        (s.loads, s.failed_loads),
        (4, 1),
        "the new run's counts alone"
    );
    assert_eq!((s.queried_tokens, s.hit_tokens), (40, 40));
}

fn reading(pod: &str, c: Result<EngineCounters, ReadError>) -> EngineReading {
    EngineReading {
        pod: pod.into(),
        uid: format!("uid-{pod}"),
        counters: c,
    }
}

#[test]
fn a_vllm_scrape_gives_its_queries_hits_and_tokens_from_the_store() {
    assert_eq!(
        parse_engine_metrics(EngineName::Vllm, "u", SCRAPE),
        Ok(EngineCounters {
            prefills: Prefills {
                requests: 2,
                computed_tokens: 208,
                micros: 412_500,
            },
            ..counters(400, 192, 192)
        })
    );
}

#[test]
fn series_are_summed_over_their_label_sets() {
    let text = "vllm:external_prefix_cache_queries_total{engine=\"0\"} 10\nvllm:external_prefix_cache_queries_total{engine=\"1\"} 5\nvllm:external_prefix_cache_hits_total 3\n";
    assert_eq!(
        parse_engine_metrics(EngineName::Vllm, "u", text),
        Ok(counters(15, 3, 0))
    );
}

#[test]
fn a_scrape_without_the_hit_series_is_unreadable_not_zero() {
    let text = "vllm:num_requests_running 0\nvllm:external_prefix_cache_queries_total 5\n";
    let e = parse_engine_metrics(EngineName::Vllm, "http://p:8000/metrics", text)
        .expect_err("no hit series");
    assert!(matches!(e, ReadError::Unreadable { ref url, .. } if url == "http://p:8000/metrics"));
    assert_eq!(
        e.to_string(),
        "http://p:8000/metrics answered something unreadable: no vllm:external_prefix_cache_queries_total and vllm:external_prefix_cache_hits_total series: the engine runs without the store's connector or does not count external prefix hits"
    );
    assert_eq!(
        parse_engine_metrics(EngineName::Sglang, "u", SCRAPE),
        Err(ReadError::Unreadable {
            url: "u".into(),
            cause: BadAnswer::EngineUncounted
        })
    );
}

#[test]
fn malformed_lines_and_negative_values_are_skipped() {
    let text = "vllm:external_prefix_cache_queries_total{engine=\"0\" 9\nvllm:external_prefix_cache_queries_total -3\nvllm:external_prefix_cache_queries_total NaN\nvllm:external_prefix_cache_queries_total 4\nvllm:external_prefix_cache_hits_total 1 1700000000000\n";
    assert_eq!(
        parse_engine_metrics(EngineName::Vllm, "u", text),
        Ok(counters(4, 1, 0))
    );
}

#[test]
fn the_window_counts_growth_since_its_start_and_pods_first_read_inside_it_from_zero() {
    let mut w = Window::default();
    w.record(0, 60_000, &[reading("a", Ok(counters(100, 0, 0)))]);
    w.record(50_000, 60_000, &[reading("a", Ok(counters(300, 150, 150)))]);
    // Both samples are inside the window: a's counters count from zero.
    let s = w.summary(50_000, 60_000, "1m");
    assert_eq!((s.queried_tokens, s.hit_tokens), (300, 150));
    assert_eq!(s.hit_ratio.as_deref(), Some("0.50"));
    // 90 s: the first sample is the baseline.
    w.record(
        90_000,
        60_000,
        &[
            reading("a", Ok(counters(400, 250, 250))),
            reading("b", Ok(counters(200, 200, 200))),
        ],
    );
    let s = w.summary(90_000, 60_000, "1m");
    assert_eq!((s.queried_tokens, s.hit_tokens), (300 + 200, 250 + 200));
    assert_eq!(s.hit_ratio.as_deref(), Some("0.90"));
    assert_eq!(s.tokens_from_store, 450);
    assert_eq!(s.engines_read, 2);
}

#[test]
fn a_pod_gone_leaves_the_window_and_a_failed_read_keeps_its_samples() {
    let mut w = Window::default();
    w.record(
        0,
        60_000,
        &[
            reading("a", Ok(counters(10, 5, 5))),
            reading("b", Ok(counters(10, 0, 0))),
        ],
    );
    w.record(
        1_000,
        60_000,
        &[reading(
            "a",
            Err(ReadError::Status {
                url: "u".into(),
                status: 500,
            }),
        )],
    );
    let s = w.summary(1_000, 60_000, "1m");
    assert_eq!((s.queried_tokens, s.hit_tokens, s.engines_read), (10, 5, 1));
}

#[test]
fn a_restarted_engine_starts_its_samples_again() {
    let mut w = Window::default();
    w.record(0, 60_000, &[reading("a", Ok(counters(500, 400, 400)))]);
    w.record(70_000, 60_000, &[reading("a", Ok(counters(600, 450, 450)))]);
    w.record(80_000, 60_000, &[reading("a", Ok(counters(20, 10, 10)))]);
    let s = w.summary(80_000, 60_000, "1m");
    assert_eq!((s.queried_tokens, s.hit_tokens), (20, 10));
}

#[test]
fn no_lookups_give_no_ratio() {
    let w = Window::default();
    let s = w.summary(0, 60_000, "1m");
    assert_eq!(s.hit_ratio, None);
    assert_eq!(ratio(5, 4).as_deref(), Some("1.00"));
}

fn role(ready: i32, unmanaged: bool) -> RoleObservation {
    RoleObservation {
        name: "server".into(),
        desired: 2,
        ready,
        updated: 2,
        total: 2,
        observed: true,
        unmanaged,
    }
}

#[test]
fn only_an_attached_vllm_counts_and_take_over_roles_are_left_out() {
    let resolved = Resolution::Resolved {
        binding: "team-a/team-a".into(),
        pool: "shared-dram".into(),
        tenant: "default".into(),
    };
    let roles = [role(2, false), role(1, true)];
    assert_eq!(
        engines(EngineName::Vllm, &resolved, &roles),
        Engines::Counted { ready: 2 }
    );
    assert_eq!(
        engines(EngineName::Sglang, &resolved, &roles),
        Engines::Uncounted(EngineName::Sglang)
    );
    assert_eq!(
        engines(EngineName::Vllm, &Resolution::NotApplicable, &roles),
        Engines::NotAttached
    );
}

#[test]
fn an_unreadable_engine_is_named_in_the_condition() {
    let ok = reading("a", Ok(counters(1, 1, 1)));
    let bad = reading(
        "b",
        Err(ReadError::Unreachable {
            url: "http://10.0.0.2:8000/metrics".into(),
            cause: kvcache_quota::admin::NoAnswer::TimedOut { after_ms: 1500 },
        }),
    );
    let c = condition(Engines::Counted { ready: 2 }, &[ok.clone(), bad]);
    assert_eq!(
        (c.status, c.reason),
        (
            kvcache_api::condition::Status::False,
            "EngineMetricsUnreadable"
        )
    );
    assert!(
        c.message
            .contains("b: no answer from http://10.0.0.2:8000/metrics"),
        "{}",
        c.message
    );
    let c = condition(Engines::Counted { ready: 1 }, std::slice::from_ref(&ok));
    assert_eq!(
        (c.reason, c.message.as_str()),
        (
            "EnginesRead",
            "read the shared-cache counters of 1 ready engine Pod(s)"
        )
    );
    let c = condition(Engines::Counted { ready: 40 }, &[ok]);
    assert_eq!(
        c.message,
        format!(
            "read the shared-cache counters of 1 ready engine Pod(s) (of 40: a pass reads at most {})",
            crate::observe::read::ENGINE_PODS_PER_PASS
        )
    );
    assert_eq!(
        condition(Engines::Counted { ready: 0 }, &[]).reason,
        "NoEngineReady"
    );
    assert_eq!(
        condition(Engines::Uncounted(EngineName::Sglang), &[]).reason,
        "NotCountedByEngine"
    );
    assert_eq!(condition(Engines::NotAttached, &[]).reason, "NotApplicable");
}
