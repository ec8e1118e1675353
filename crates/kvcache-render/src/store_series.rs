//! Which of a master's series the operator re-exports on its own `/metrics`, and under which
//! names, so that Prometheus reads the store through the operator (which reads each master
//! anyway) and needs no way to the master's port, which is the admin API's too.
//!
//! Every counter and gauge the master prints is kept, up to [`MAX_SERIES`] samples a backend,
//! under `kvcache_operator_store_<the master's name>` with a `backend` label added (the master's
//! own labels kept, e.g. `tenant_id`): `master_ping_requests_total` becomes
//! `kvcache_operator_store_master_ping_requests_total{backend="mooncake-dram"}`. Histograms and
//! summaries are skipped (the 0.3.13 master prints none; one re-exported bucket by bucket would
//! be cut by the cap mid-family). What is skipped is counted by reason ([`Skipped`]), and the
//! operator exports the counts (`kvcache_operator_backend_store_series_skipped`).

use std::collections::{BTreeMap, BTreeSet};

use crate::exposition::{Exposition, Kind, Label};

/// The most samples of one backend's master the operator keeps (in the master's order; the
/// rest are counted as [`Skipped::over_cap`]). A 0.3.13 master prints about 140 series of its
/// own and 6 a tenant: 16,384 holds a ledger of 2,000 tenants with room, and bounds what one
/// master can make the operator hold (about 3 MiB) and Prometheus store.
pub const MAX_SERIES: usize = 16_384;

/// What the operator's registry (prefix `kvcache_operator_`) puts before a master's name.
pub const NAME_PREFIX: &str = "store_";

/// The whole prefix of a re-exported series' name on the operator's `/metrics`.
pub const EXPORTED_PREFIX: &str = "kvcache_operator_store_";

/// The label naming the backend whose master printed the sample.
pub const BACKEND_LABEL: &str = "backend";

/// What a master's own `backend` label is renamed to (Prometheus's convention for a clash).
pub const EXPORTED_BACKEND_LABEL: &str = "exported_backend";

/// Master names the operator's own series take under [`EXPORTED_PREFIX`]
/// (`kvcache_operator_store_reads_total`): skipped, so that no family is written twice.
const RESERVED: &[&str] = &["reads", "reads_total"];

/// How a family is re-exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exported {
    /// A counter whose name ends in `_total` (the encoder writes the suffix back).
    Counter,
    /// A gauge; also a counter without the `_total` suffix the operator's encoder would add to
    /// its name, and an untyped series, so that every name stays the master's.
    Gauge,
}

/// One family of a master, as re-exported.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesFamily {
    /// The master's name, e.g. `master_ping_requests_total`.
    pub name: String,
    /// How it is written.
    pub kind: Exported,
    /// The master's `# HELP` text, its escapes kept.
    pub help: String,
    /// Each sample's labels (the master's, `backend` renamed to `exported_backend`) and value.
    pub samples: Vec<(Vec<Label>, f64)>,
}

impl SeriesFamily {
    /// The name given to the operator's registry: [`NAME_PREFIX`] and the master's name, a
    /// counter's without `_total`, which the encoder appends.
    pub fn descriptor(&self) -> String {
        let name = match self.kind {
            Exported::Counter => self.name.strip_suffix("_total").unwrap_or(&self.name),
            Exported::Gauge => &self.name,
        };
        format!("{NAME_PREFIX}{name}")
    }
}

/// Samples a master printed that are not re-exported, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Past [`MAX_SERIES`].
    pub over_cap: usize,
    /// Of a histogram or a summary.
    pub histogram: usize,
    /// Lines that did not read ([`crate::exposition::BadLine`]).
    pub unreadable: usize,
    /// Named as one of the operator's own series, or printed twice with the same labels.
    pub clash: usize,
}

impl Skipped {
    /// Each reason's label and count, for the operator's series.
    pub fn by_reason(&self) -> [(&'static str, usize); 4] {
        [
            ("over_cap", self.over_cap),
            ("histogram", self.histogram),
            ("unreadable", self.unreadable),
            ("clash", self.clash),
        ]
    }
}

/// A master's series as the operator re-exports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreSeries {
    /// The families, in the order the master first printed a sample of each.
    pub families: Vec<SeriesFamily>,
    /// What was left out.
    pub skipped: Skipped,
}

impl StoreSeries {
    /// The counters and gauges of `e`, at most `cap` samples.
    pub fn from_exposition(e: &Exposition, cap: usize) -> StoreSeries {
        let mut out = StoreSeries {
            skipped: Skipped {
                unreadable: e.unreadable.len(),
                ..Skipped::default()
            },
            ..StoreSeries::default()
        };
        let mut index: BTreeMap<&str, usize> = BTreeMap::new();
        let mut seen: BTreeSet<(&str, &[Label])> = BTreeSet::new();
        let mut kept = 0;
        for s in &e.samples {
            let family = e.family_of(&s.name);
            let kind = family.map(|(_, f)| f.kind).unwrap_or_default();
            let exported = match kind {
                Kind::Histogram | Kind::Summary => {
                    out.skipped.histogram += 1;
                    continue;
                }
                Kind::Counter if s.name.ends_with("_total") => Exported::Counter,
                Kind::Counter | Kind::Gauge | Kind::Untyped => Exported::Gauge,
            };
            if RESERVED.contains(&s.name.as_str())
                || !seen.insert((s.name.as_str(), s.labels.as_slice()))
            {
                out.skipped.clash += 1;
                continue;
            }
            if kept == cap {
                out.skipped.over_cap += 1;
                continue;
            }
            kept += 1;
            let i = *index.entry(s.name.as_str()).or_insert_with(|| {
                out.families.push(SeriesFamily {
                    name: s.name.clone(),
                    kind: exported,
                    help: family.map(|(_, f)| f.help.clone()).unwrap_or_default(),
                    samples: Vec::new(),
                });
                out.families.len() - 1
            });
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| {
                    let k = if k == BACKEND_LABEL {
                        EXPORTED_BACKEND_LABEL
                    } else {
                        k
                    };
                    (k.to_owned(), v.clone())
                })
                .collect();
            out.families[i].samples.push((labels, s.value));
        }
        out
    }

    /// How many samples are kept.
    pub fn len(&self) -> usize {
        self.families.iter().map(|f| f.samples.len()).sum()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.families.iter().all(|f| f.samples.is_empty())
    }
}

/// One re-exported family across backends: one descriptor, each backend's samples.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged<'a> {
    /// The name given to the operator's registry ([`SeriesFamily::descriptor`]).
    pub descriptor: String,
    /// How it is written (the first backend's, when masters of two versions disagree: the
    /// samples' names are the masters' either way).
    pub kind: Exported,
    /// The first backend's help text.
    pub help: &'a str,
    /// Each sample: its backend, its own labels, its value.
    pub samples: Vec<(&'a str, &'a [Label], f64)>,
}

/// The families of every backend's reading, each once, by the master's name; within one, the
/// backends in the order given. A family written twice would make Prometheus refuse the scrape.
pub fn merged<'a>(
    readings: impl IntoIterator<Item = (&'a str, &'a StoreSeries)>,
) -> Vec<Merged<'a>> {
    let mut out: BTreeMap<&'a str, Merged<'a>> = BTreeMap::new();
    for (backend, series) in readings {
        for f in &series.families {
            let m = out.entry(&f.name).or_insert_with(|| Merged {
                descriptor: f.descriptor(),
                kind: f.kind,
                help: &f.help,
                samples: Vec::new(),
            });
            m.samples.extend(
                f.samples
                    .iter()
                    .map(|(labels, v)| (backend, labels.as_slice(), *v)),
            );
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASTER: &str = "# HELP master_ping_requests_total Total number of ping requests received\n# TYPE master_ping_requests_total counter\nmaster_ping_requests_total 12\n# TYPE mem_cache_hit_nums_ counter\nmem_cache_hit_nums_ 3\n# TYPE master_key_count gauge\nmaster_key_count 5\n# TYPE mooncake_tenant_quota_charged_bytes gauge\nmooncake_tenant_quota_charged_bytes{tenant_id=\"a\"} 1\nmooncake_tenant_quota_charged_bytes{tenant_id=\"b\"} 2\nuntyped_thing{backend=\"theirs\"} 9\n# TYPE lat histogram\nlat_bucket{le=\"+Inf\"} 1\nlat_sum 0.5\nlat_count 1\nreads_total 4\nmaster_key_count 6\nbroken{ 1\n";

    #[test]
    fn counters_and_gauges_are_kept_under_the_masters_names() {
        let s = StoreSeries::from_exposition(&Exposition::parse(MASTER), MAX_SERIES);
        let names: Vec<(&str, String, Exported)> = s
            .families
            .iter()
            .map(|f| (f.name.as_str(), f.descriptor(), f.kind))
            .collect();
        assert_eq!(
            names,
            [
                (
                    "master_ping_requests_total",
                    "store_master_ping_requests".into(),
                    Exported::Counter
                ),
                (
                    "mem_cache_hit_nums_",
                    "store_mem_cache_hit_nums_".into(),
                    Exported::Gauge
                ),
                (
                    "master_key_count",
                    "store_master_key_count".into(),
                    Exported::Gauge
                ),
                (
                    "mooncake_tenant_quota_charged_bytes",
                    "store_mooncake_tenant_quota_charged_bytes".into(),
                    Exported::Gauge
                ),
                (
                    "untyped_thing",
                    "store_untyped_thing".into(),
                    Exported::Gauge
                ),
            ]
        );
        assert_eq!(s.families[0].help, "Total number of ping requests received");
        assert_eq!(s.families[3].samples.len(), 2);
        assert_eq!(
            s.families[4].samples,
            [(vec![("exported_backend".into(), "theirs".into())], 9.0)],
            "the master's own backend label does not clash with the one added"
        );
        assert_eq!(
            s.skipped,
            Skipped {
                over_cap: 0,
                histogram: 3,
                unreadable: 1,
                clash: 2,
            },
            "the histogram's three samples, reads_total and the second master_key_count"
        );
        assert_eq!(s.len(), 6);
    }

    #[test]
    fn the_cap_keeps_the_first_samples_and_counts_the_rest() {
        let text: String = (0..50).map(|i| format!("g{{i=\"{i}\"}} {i}\n")).collect();
        let s = StoreSeries::from_exposition(&Exposition::parse(&text), 20);
        assert_eq!(s.len(), 20);
        assert_eq!(s.skipped.over_cap, 30);
        assert_eq!(s.families[0].samples[19].1, 19.0);
        let real = StoreSeries::from_exposition(
            &Exposition::parse(include_str!(
                "../tests/fixtures/master-metrics-0.3.13.post1.txt"
            )),
            MAX_SERIES,
        );
        assert_eq!(real.skipped, Skipped::default());
        assert_eq!(real.len(), 148);
    }

    #[test]
    fn backends_share_one_family_each() {
        let a = StoreSeries::from_exposition(
            &Exposition::parse("# TYPE master_key_count gauge\nmaster_key_count 1\nonly_a 1\n"),
            MAX_SERIES,
        );
        let b =
            StoreSeries::from_exposition(&Exposition::parse("master_key_count 2\n"), MAX_SERIES);
        let m = merged([("a", &a), ("b", &b)]);
        assert_eq!(
            m.iter().map(|m| m.descriptor.as_str()).collect::<Vec<_>>(),
            ["store_master_key_count", "store_only_a"]
        );
        assert_eq!(m[0].samples, [("a", &[][..], 1.0), ("b", &[][..], 2.0)]);
    }
}
