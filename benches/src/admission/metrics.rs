//! The figures both admission benches read: the operator's webhook histogram and refusal
//! counters, and the API server's own timing of its webhook calls, from their `/metrics`.

use std::time::Duration;

use kvcache_e2e::operator::Operator;
use kvcache_render::observe::exposition::{Exposition, Sample};

/// The `q` quantile of sorted durations.
pub(super) fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The value of `s`'s label `name`.
fn label<'a>(s: &'a Sample, name: &str) -> Option<&'a str> {
    s.labels
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// One webhook's buckets from `/metrics`: (upper bound in seconds, cumulative count).
fn buckets(text: &str, webhook: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for s in Exposition::parse(text).samples {
        if s.name != "kvcache_operator_webhook_request_duration_seconds_bucket"
            || label(&s, "webhook") != Some(webhook)
        {
            continue;
        }
        // `+Inf` reads as infinity.
        let Some(Ok(le)) = label(&s, "le").map(str::parse::<f64>) else {
            continue;
        };
        // Outcomes (allowed, refused, ...) are summed per bound.
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some(slot) => slot.1 += s.value,
            None => out.push((le, s.value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

pub(super) fn minus(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map(|(_, m)| *m)
                .unwrap_or(0.0);
            (*le, n - was)
        })
        .collect()
}

/// The `_sum` and `_count` of the histogram `metric` in Prometheus text, added over the series
/// whose labels hold every `(name, value)` of `with`.
fn sum_count(text: &str, metric: &str, with: &[(&str, &str)]) -> (f64, f64) {
    let (sum, count) = (format!("{metric}_sum"), format!("{metric}_count"));
    let mut out = (0.0, 0.0);
    for s in Exposition::parse(text).samples {
        let slot = if s.name == sum {
            &mut out.0
        } else if s.name == count {
            &mut out.1
        } else {
            continue;
        };
        if with
            .iter()
            .all(|(name, want)| label(&s, name) == Some(*want))
        {
            *slot += s.value;
        }
    }
    out
}

/// What the operator's webhook server refused so far, by reason, from its `/metrics` and the
/// counter `metric`: `reason count, ...`.
pub(super) fn refusals(text: &str, metric: &str) -> String {
    Exposition::parse(text)
        .samples
        .iter()
        .filter(|s| s.name == metric && label(s, "server") == Some("webhook"))
        .filter_map(|s| Some(format!("{} {}", label(s, "reason")?, s.value)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The mean of the samples added between two `(sum, count)` readings, in seconds.
pub(super) fn mean_between(after: (f64, f64), before: (f64, f64)) -> Option<f64> {
    let n = after.1 - before.1;
    (n > 0.0).then(|| (after.0 - before.0) / n)
}

/// The API server's `/metrics` (its own timing of admission webhook calls).
async fn apiserver_metrics(client: &kube::Client) -> anyhow::Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// The API server's timing of its webhook calls on create, and the handler's own (its
/// histogram's buckets and its sum and count), read before and after the creates with the
/// webhook: one reading of each `/metrics`.
pub(super) struct Calls {
    pub(super) apiserver: (f64, f64),
    pub(super) handler: (f64, f64),
    pub(super) buckets: Vec<(f64, f64)>,
}

impl Calls {
    pub(super) async fn read(
        client: &kube::Client,
        operator: &Operator,
        webhook: &str,
    ) -> anyhow::Result<Self> {
        let handler = operator.metrics()?;
        Ok(Calls {
            apiserver: sum_count(
                &apiserver_metrics(client).await?,
                "apiserver_admission_webhook_admission_duration_seconds",
                &[("operation", "CREATE")],
            ),
            handler: sum_count(
                &handler,
                "kvcache_operator_webhook_request_duration_seconds",
                &[("webhook", webhook)],
            ),
            buckets: buckets(&handler, webhook),
        })
    }
}

/// A quantile from cumulative buckets, interpolated linearly inside the bucket it falls in
/// (as Prometheus' `histogram_quantile` does).
pub(super) fn bucket_quantile(b: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in b {
        if n >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = if n > lower.1 {
                (rank - lower.1) / (n - lower.1)
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, n);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_counts_are_read_per_series_and_added_over_the_matching_ones() {
        let text = "\
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name=\"inject.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"admit\",le=\"0.005\"} 3
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"inject.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"admit\"} 0.5
apiserver_admission_webhook_admission_duration_seconds_count{name=\"inject.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"admit\"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"validate.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"validating\"} 0.25
apiserver_admission_webhook_admission_duration_seconds_count{name=\"validate.kvcache\",operation=\"CREATE\",rejected=\"false\",type=\"validating\"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"validate.kvcache\",operation=\"UPDATE\",rejected=\"false\",type=\"validating\"} 9
";
        let metric = "apiserver_admission_webhook_admission_duration_seconds";
        assert_eq!(
            sum_count(text, metric, &[("operation", "CREATE")]),
            (0.75, 20.0)
        );
        assert_eq!(sum_count(text, metric, &[("type", "admit")]), (0.5, 10.0));
        assert_eq!(sum_count(text, metric, &[("name", "nothing")]), (0.0, 0.0));
        assert_eq!(mean_between((0.75, 20.0), (0.25, 10.0)), Some(0.05));
        assert_eq!(mean_between((0.75, 20.0), (0.75, 20.0)), None);
    }

    #[test]
    fn samples_are_read_as_the_format_writes_them_not_by_substring() {
        // Valid text all three must read: a space after a label's comma, a comma inside a
        // value, a timestamp after a value.
        let text = "\
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\", outcome=\"allowed\", le=\"0.001\"} 5
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\", outcome=\"allowed\", le=\"+Inf\"} 6
apiserver_admission_webhook_admission_duration_seconds_sum{name=\"a,b\",operation=\"CREATE\"} 0.5
apiserver_admission_webhook_admission_duration_seconds_count{name=\"a,b\",operation=\"CREATE\"} 2
# TYPE kvcache_operator_connections_refused counter
kvcache_operator_connections_refused_total{server=\"webhook\",reason=\"source_full\"} 3 1700000000000
kvcache_operator_connections_refused_total{server=\"metrics\",reason=\"full\"} 1
kvcache_operator_connections_refused_total{server=\"webhook\",reason=\"full\"} 2
";
        assert_eq!(
            buckets(text, "inject"),
            [(0.001, 5.0), (f64::INFINITY, 6.0)]
        );
        assert_eq!(
            sum_count(
                text,
                "apiserver_admission_webhook_admission_duration_seconds",
                &[("name", "a,b")]
            ),
            (0.5, 2.0)
        );
        assert_eq!(
            refusals(text, "kvcache_operator_connections_refused_total"),
            "source_full 3, full 2"
        );
    }

    #[test]
    fn a_quantile_from_buckets_interpolates_inside_its_bucket() {
        let text = "\
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\",outcome=\"allowed\",le=\"0.001\"} 50
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\",outcome=\"allowed\",le=\"0.002\"} 90
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"inject\",outcome=\"allowed\",le=\"+Inf\"} 100
kvcache_operator_webhook_request_duration_seconds_bucket{webhook=\"validate\",outcome=\"allowed\",le=\"0.001\"} 7
";
        let b = buckets(text, "inject");
        assert_eq!(b.len(), 3);
        let p50 = bucket_quantile(&b, 0.5).expect("p50");
        assert!((p50 - 0.001).abs() < 1e-9, "{p50}");
        let p70 = bucket_quantile(&b, 0.7).expect("p70");
        assert!((p70 - 0.0015).abs() < 1e-9, "{p70}");
        // In the +Inf bucket: the last finite bound.
        assert_eq!(bucket_quantile(&b, 0.99), Some(0.002));
    }
}
