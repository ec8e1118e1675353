//! The figures of `status.sharedCache` as text, and several deployments' figures summed into a
//! Binding's.

use kvcache_api::model::SharedCacheStatus;

/// Microseconds as seconds with `decimals` decimals (no `-0.00`).
pub(super) fn seconds_text(micros: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, micros / 1e6);
    match text.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_owned(),
        _ => text,
    }
}

/// Several deployments' figures as one (a Binding's, from the ModelDeployments that use it):
/// every count summed and the ratio recomputed; the window is the first's (one operator writes
/// them all with its one `--shared-cache-window`); the loads' time and the seconds saved summed
/// (none saved when a deployment has none: the sum would undercount), their errors summed in
/// quadrature (each deployment's price is fitted on its own); no load median (medians do not
/// add) and no price (the deployments' differ). `None` for none.
pub fn sum(statuses: &[&SharedCacheStatus]) -> Option<SharedCacheStatus> {
    let first = statuses.first()?;
    let mut out = SharedCacheStatus {
        window: first.window.clone(),
        ..SharedCacheStatus::default()
    };
    let number = |v: &Option<String>| v.as_deref().and_then(|v| v.parse::<f64>().ok());
    let (mut load, mut saved, mut variance) = (None::<f64>, Some(0.0f64), Some(0.0f64));
    for s in statuses {
        out.queried_tokens += s.queried_tokens;
        out.hit_tokens += s.hit_tokens;
        out.tokens_from_store += s.tokens_from_store;
        out.engines_read += s.engines_read;
        out.loads += s.loads;
        out.failed_loads += s.failed_loads;
        out.saves += s.saves;
        out.failed_saves += s.failed_saves;
        if let Some(v) = number(&s.load_seconds) {
            *load.get_or_insert(0.0) += v;
        }
        saved = saved
            .zip(number(&s.prefill_seconds_saved))
            .map(|(a, b)| a + b);
        variance = variance
            .zip(number(&s.prefill_seconds_saved_error))
            .map(|(a, e)| a + e * e);
    }
    out.hit_ratio = ratio(out.hit_tokens, out.queried_tokens);
    out.load_seconds = load.map(|v| seconds_text(v * 1e6, 3));
    out.prefill_seconds_saved = saved.map(|v| seconds_text(v * 1e6, 2));
    out.prefill_seconds_saved_error = saved.and(variance).map(|v| seconds_text(v.sqrt() * 1e6, 2));
    Some(out)
}

/// `hit / queried` with two decimals, as a string (a CRD field with a float is not portable);
/// none when nothing was looked up.
pub fn ratio(hit: u64, queried: u64) -> Option<String> {
    (queried > 0).then(|| format!("{:.2}", hit.min(queried) as f64 / queried as f64))
}

/// The tenant's view of the shared cache: the `status.sharedCache` of the Binding's users in
/// `world` summed (`None` while none reports one).
pub fn tenant_shared_cache(
    world: &crate::world::World,
    b: &kvcache_api::KVCachePoolBinding,
) -> Option<SharedCacheStatus> {
    let reported: Vec<&SharedCacheStatus> = world
        .user_models(b)
        .filter_map(|md| md.status.as_ref()?.shared_cache.as_ref())
        .collect();
    sum(&reported)
}
