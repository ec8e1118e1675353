//! Which of a master's series the operator re-exports on its own `/metrics`, and under which
//! names, so that Prometheus reads the store through the operator (which reads each master
//! anyway) and needs no way to the master's port, which is the admin API's too.
//!
//! Every counter and gauge the master prints is kept, up to `MAX_SERIES` samples a backend,
//! under `kvcache_operator_store_<the master's name>` with a `backend` label added (the master's
//! own labels kept, e.g. `tenant_id`): `master_ping_requests_total` becomes
//! `kvcache_operator_store_master_ping_requests_total{backend="mooncake-dram"}`. A master's label
//! that the scrape sets on the operator's series (`TARGET_LABELS`: `backend`, `pod`,
//! `namespace`, …) is renamed `exported_<name>`, as Prometheus renames a clash, since the
//! installation's ServiceMonitor honours the operator's labels. Histograms and summaries are
//! skipped (the 0.3.13 master prints none; one re-exported bucket by bucket would be cut by the
//! cap mid-family), and so is a family whose name on the operator's `/metrics` another family
//! takes (a gauge `foo` and a counter `foo_total` are both `kvcache_operator_store_foo`, and two
//! `# TYPE` lines for one name make Prometheus refuse the whole scrape). What is skipped is
//! counted by reason ([`Skipped`]), and the operator exports the counts
//! (`kvcache_operator_backend_store_series_skipped`).

use std::collections::{BTreeMap, BTreeSet};

use crate::observe::exposition::{Exposition, Kind, Label};

/// The most samples of one backend's master the operator reads and keeps (in the master's
/// order; the rest are counted as [`Skipped::over_cap`], and not held even while reading:
/// [`Exposition::parse_capped`]). A 0.3.13 master prints about 140 series of its own and 6 a
/// tenant: 16,384 holds a ledger of 2,000 tenants with room, and bounds what one master can make
/// the operator hold (about 3 MiB) and Prometheus store.
pub(crate) const MAX_SERIES: usize = 16_384;

/// What the operator's registry (prefix `kvcache_operator_`) puts before a master's name.
pub(crate) const NAME_PREFIX: &str = "store_";

/// The label naming the backend whose master printed the sample.
pub const BACKEND_LABEL: &str = "backend";

/// Labels a scrape of the operator sets on every series (the prometheus-operator's target
/// labels, and [`BACKEND_LABEL`], which the operator adds). The installation's ServiceMonitor
/// has `honorLabels: true`, so a master's own label of one of these names would override the
/// target's: it is renamed `exported_<name>` (`exported_exported_<name>` if the master prints
/// that too, and so on), as Prometheus renames a clash.
pub(crate) const TARGET_LABELS: &[&str] = &[
    BACKEND_LABEL,
    "container",
    "endpoint",
    "instance",
    "job",
    "namespace",
    "pod",
    "service",
];

/// What Prometheus and this module put before a label's name to rename it.
pub(crate) const EXPORTED_LABEL_PREFIX: &str = "exported_";

/// Names on the operator's `/metrics` (less its `kvcache_operator_` prefix) its own series take
/// under [`NAME_PREFIX`] (`kvcache_operator_store_reads_total`): a master's family that would
/// be written under one of them is skipped, so that no name is described twice.
const RESERVED: &[&str] = &["store_reads", "store_reads_total"];

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
    /// Each sample's labels (the master's, those of `TARGET_LABELS` renamed
    /// `exported_<name>`) and value.
    pub samples: Vec<(Vec<Label>, f64)>,
}

impl SeriesFamily {
    /// The name given to the operator's registry: `NAME_PREFIX` and the master's name, a
    /// counter's without `_total`, which the encoder appends.
    pub fn descriptor(&self) -> String {
        let name = match self.kind {
            Exported::Counter => self.name.strip_suffix("_total").unwrap_or(&self.name),
            Exported::Gauge => &self.name,
        };
        format!("{NAME_PREFIX}{name}")
    }

    /// The names the family's samples and metadata take on the operator's `/metrics` (less
    /// its `kvcache_operator_` prefix): the descriptor, and a counter's samples' `_total` name.
    /// Two families that share one cannot both be written.
    pub fn claims(&self) -> Vec<String> {
        let descriptor = self.descriptor();
        match self.kind {
            Exported::Counter => vec![format!("{descriptor}_total"), descriptor],
            Exported::Gauge => vec![descriptor],
        }
    }
}

/// `labels` as re-exported: each of [`TARGET_LABELS`] renamed with [`EXPORTED_LABEL_PREFIX`]
/// until its name is one no other label of the sample has; the rest as they are. Distinct label
/// sets stay distinct.
pub(crate) fn exported_labels(labels: &[Label]) -> Vec<Label> {
    let is_target = |name: &str| TARGET_LABELS.contains(&name);
    let taken: BTreeSet<&str> = labels
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !is_target(k))
        .collect();
    let mut renamed: BTreeSet<String> = BTreeSet::new();
    labels
        .iter()
        .map(|(k, v)| {
            if !is_target(k) {
                return (k.clone(), v.clone());
            }
            let mut name = format!("{EXPORTED_LABEL_PREFIX}{k}");
            while taken.contains(name.as_str()) || renamed.contains(&name) {
                name.insert_str(0, EXPORTED_LABEL_PREFIX);
            }
            renamed.insert(name.clone());
            (name, v.clone())
        })
        .collect()
}

/// Samples a master printed that are not re-exported, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Past `MAX_SERIES`.
    pub over_cap: usize,
    /// Of a histogram or a summary.
    pub histogram: usize,
    /// Lines that did not read ([`crate::observe::exposition::BadLine`]).
    pub unreadable: usize,
    /// Of a family whose name on the operator's `/metrics` is taken (by the operator's own
    /// series, by another family of the master's, or by another backend's master's), or printed
    /// twice with the same labels.
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
    /// The counters and gauges of `e`, at most `cap` samples; what `e` itself left past its cap
    /// ([`Exposition::parse_capped`]) is counted as over the cap, its unreadable lines as such.
    pub(crate) fn from_exposition(e: &Exposition, cap: usize) -> StoreSeries {
        let mut out = StoreSeries {
            skipped: Skipped {
                unreadable: e.unreadable_lines(),
                over_cap: e.samples_past_cap,
                ..Skipped::default()
            },
            ..StoreSeries::default()
        };
        // Each master name's family (its index in `out.families`), or `None` for one skipped
        // because its name on the operator's `/metrics` is taken.
        let mut index: BTreeMap<&str, Option<usize>> = BTreeMap::new();
        let mut claimed: BTreeSet<String> = RESERVED.iter().map(|r| (*r).to_owned()).collect();
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
            let slot = *index.entry(s.name.as_str()).or_insert_with(|| {
                let f = SeriesFamily {
                    name: s.name.clone(),
                    kind: exported,
                    help: family.map(|(_, f)| f.help.clone()).unwrap_or_default(),
                    samples: Vec::new(),
                };
                let claims = f.claims();
                if claims.iter().any(|c| claimed.contains(c)) {
                    return None;
                }
                claimed.extend(claims);
                out.families.push(f);
                Some(out.families.len() - 1)
            });
            let Some(i) = slot else {
                out.skipped.clash += 1;
                continue;
            };
            if !seen.insert((s.name.as_str(), s.labels.as_slice())) {
                out.skipped.clash += 1;
                continue;
            }
            if kept == cap {
                out.skipped.over_cap += 1;
                continue;
            }
            kept += 1;
            if let Some(f) = out.families.get_mut(i) {
                f.samples.push((exported_labels(&s.labels), s.value));
            }
        }
        // A family all of whose samples were past the cap is not written.
        out.families.retain(|f| !f.samples.is_empty());
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

/// Every backend's families, each written once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Merge<'a> {
    /// The families, by the master's name.
    pub families: Vec<Merged<'a>>,
    /// Samples of each backend left out because another backend's master has a different
    /// family under the same name on the operator's `/metrics` (the first backend's is kept).
    pub clashes: BTreeMap<&'a str, usize>,
}

impl Merge<'_> {
    /// How many of `series`, `backend`'s reading, are written, and what is left out, this
    /// merge's clashes included.
    pub fn written(&self, backend: &str, series: &StoreSeries) -> (usize, Skipped) {
        let clashed = self.clashes.get(backend).copied().unwrap_or(0);
        let skipped = Skipped {
            clash: series.skipped.clash.saturating_add(clashed),
            ..series.skipped
        };
        (series.len().saturating_sub(clashed), skipped)
    }
}

/// The families of every backend's reading, each once, by the master's name; within one, the
/// backends in the order given. A name described twice would make Prometheus refuse the scrape:
/// a family whose name on the operator's `/metrics` an earlier backend's different family took
/// ([`SeriesFamily::claims`]) is left out, and counted in [`Merge::clashes`].
pub fn merged<'a>(readings: impl IntoIterator<Item = (&'a str, &'a StoreSeries)>) -> Merge<'a> {
    let mut out: BTreeMap<&'a str, Merged<'a>> = BTreeMap::new();
    let mut claimed: BTreeSet<String> = BTreeSet::new();
    let mut clashes: BTreeMap<&'a str, usize> = BTreeMap::new();
    for (backend, series) in readings {
        for f in &series.families {
            let m = match out.entry(&f.name) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let claims = f.claims();
                    if claims.iter().any(|c| claimed.contains(c)) {
                        *clashes.entry(backend).or_default() += f.samples.len();
                        continue;
                    }
                    claimed.extend(claims);
                    v.insert(Merged {
                        descriptor: f.descriptor(),
                        kind: f.kind,
                        help: &f.help,
                        samples: Vec::new(),
                    })
                }
            };
            m.samples.extend(
                f.samples
                    .iter()
                    .map(|(labels, v)| (backend, labels.as_slice(), *v)),
            );
        }
    }
    Merge {
        families: out.into_values().collect(),
        clashes,
    }
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
                "../../tests/fixtures/master-metrics-0.3.13.post1.txt"
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
            m.families
                .iter()
                .map(|m| m.descriptor.as_str())
                .collect::<Vec<_>>(),
            ["store_master_key_count", "store_only_a"]
        );
        assert_eq!(
            m.families[0].samples,
            [("a", &[][..], 1.0), ("b", &[][..], 2.0)]
        );
        assert_eq!(m.clashes, BTreeMap::new());
    }

    fn read(text: &str) -> StoreSeries {
        StoreSeries::from_exposition(&Exposition::parse(text), MAX_SERIES)
    }

    #[test]
    fn a_gauge_and_a_counter_written_under_one_name_keep_the_first_family() {
        // `foo` (a gauge) and `foo_total` (a counter) are both `kvcache_operator_store_foo`.
        let s = read(
            "# TYPE foo gauge\nfoo 1\n# TYPE foo_total counter\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3\n",
        );
        assert_eq!(
            s.families
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>(),
            ["foo"]
        );
        assert_eq!(s.skipped.clash, 2);
        let s = read("# TYPE foo_total counter\nfoo_total 2\n# TYPE foo gauge\nfoo 1\n");
        assert_eq!(
            s.families
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>(),
            ["foo_total"]
        );
        assert_eq!(s.skipped.clash, 1);
        // The operator's own `kvcache_operator_store_reads` takes `reads` and `reads_total`.
        let s = read("# TYPE reads_total counter\nreads_total 2\nreads 1\n");
        assert_eq!((s.len(), s.skipped.clash), (0, 2));
        // Every name the operator writes is described once.
        for s in [
            read("# TYPE foo gauge\nfoo 1\n# TYPE foo_total counter\nfoo_total 2\nreads 1\n"),
            read(MASTER),
        ] {
            let mut names: Vec<String> = s.families.iter().flat_map(SeriesFamily::claims).collect();
            let all = names.len();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), all, "{s:?}");
        }
    }

    #[test]
    fn across_backends_a_name_taken_by_another_family_is_left_out_and_counted() {
        let a = read("# TYPE foo gauge\nfoo 1\nshared 1\n");
        let b = read(
            "# TYPE foo_total counter\nfoo_total{x=\"1\"} 2\nfoo_total{x=\"2\"} 2\nshared 2\n",
        );
        let m = merged([("a", &a), ("b", &b)]);
        assert_eq!(
            m.families
                .iter()
                .map(|m| (m.descriptor.as_str(), m.samples.len()))
                .collect::<Vec<_>>(),
            [("store_foo", 1), ("store_shared", 2)]
        );
        assert_eq!(m.clashes, BTreeMap::from([("b", 2)]));
        assert_eq!(m.written("a", &a), (2, Skipped::default()));
        assert_eq!(
            m.written("b", &b),
            (
                1,
                Skipped {
                    clash: 2,
                    ..Skipped::default()
                }
            )
        );
    }

    #[test]
    fn labels_a_scrape_sets_are_renamed_and_never_doubled() {
        let s = read(
            "x{backend=\"a\",exported_backend=\"b\",pod=\"p\",namespace=\"n\",job=\"j\",instance=\"i\",service=\"s\",tenant_id=\"t\"} 1\nx{exported_backend=\"a\",backend=\"b\"} 2\n",
        );
        assert_eq!(s.skipped, Skipped::default());
        let names = |i: usize| -> Vec<&str> {
            s.families[0].samples[i]
                .0
                .iter()
                .map(|(k, _)| k.as_str())
                .collect()
        };
        assert_eq!(
            names(0),
            [
                "exported_exported_backend",
                "exported_backend",
                "exported_pod",
                "exported_namespace",
                "exported_job",
                "exported_instance",
                "exported_service",
                "tenant_id"
            ]
        );
        assert_eq!(s.families[0].samples[0].0[0].1, "a");
        assert_eq!(s.families[0].samples[0].0[1].1, "b");
        assert_eq!(
            s.families[0].samples[1].0,
            labels(&[
                ("exported_backend", "a"),
                ("exported_exported_backend", "b")
            ]),
            "the same names, whatever the order: one family's samples stay one series each"
        );
        for (labels, _) in &s.families[0].samples {
            let mut names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
            names.sort_unstable();
            let all = names.len();
            names.dedup();
            assert_eq!(names.len(), all, "{labels:?}");
            assert!(
                names.iter().all(|n| !TARGET_LABELS.contains(n)),
                "{labels:?}"
            );
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<Label> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_capped_reading_counts_what_it_did_not_hold_as_over_the_cap() {
        let text: String = (0..100)
            .map(|i| format!("g{{i=\"{i}\"}} {i}\nbad{i}\n"))
            .collect();
        let e = Exposition::parse_capped(&text, 30, |_| {});
        let s = StoreSeries::from_exposition(&e, MAX_SERIES);
        assert_eq!(s.len(), 30);
        assert_eq!(
            s.skipped,
            Skipped {
                over_cap: 70,
                unreadable: 100,
                ..Skipped::default()
            }
        );
    }
}
