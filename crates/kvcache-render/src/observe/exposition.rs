//! A reader of Prometheus text exposition (format 0.0.4, what a Mooncake master's `/metrics`
//! prints): each sample's name, labels and value, and each family's `# TYPE` and `# HELP`.
//! Timestamps are read and dropped; `NaN`, `+Inf` and `-Inf` are values like any other. A line
//! that does not read is skipped and recorded with its number and why ([`BadLine`]), so that
//! one odd line does not hide the rest of the answer.
//!
//! Written here rather than taken from a crate: the grammar the master uses is small, and the
//! parsers on crates.io bring a date library or a parser generator to the pure crate for it
//! (`crates/kvcache-render/README.md`).

use std::collections::BTreeMap;

/// What a family's `# TYPE` line says it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// `counter`: only goes up (resets when the process restarts).
    Counter,
    /// `gauge`: goes up and down.
    Gauge,
    /// `histogram`: `_bucket`, `_sum` and `_count` samples together.
    Histogram,
    /// `summary`: quantile, `_sum` and `_count` samples together.
    Summary,
    /// `untyped`, or no `# TYPE` line at all.
    #[default]
    Untyped,
}

impl Kind {
    fn parse(word: &str) -> Option<Kind> {
        Some(match word {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            "summary" => Kind::Summary,
            "untyped" | "unknown" => Kind::Untyped,
            _ => return None,
        })
    }
}

/// A family's metadata: its `# TYPE` and `# HELP` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Family {
    /// What the `# TYPE` line says (untyped without one).
    pub kind: Kind,
    /// The `# HELP` text as written, its escapes (`\\`, `\n`) kept, so it can be written back
    /// on one line as it is.
    pub help: String,
}

/// One sample: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series name, e.g. `master_put_start_requests_total`.
    pub name: String,
    /// The labels in the order written, values unescaped.
    pub labels: Vec<Label>,
    /// The value (`NaN` and the infinities included).
    pub value: f64,
}

/// A line that did not read, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// Its number, from 1.
    pub line: usize,
    /// What is wrong with it, e.g. `an unterminated label value`.
    pub why: &'static str,
}

/// A label: its name and its value (unescaped).
pub(crate) type Label = (String, String);

/// A whole answer read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exposition {
    /// Each family named by a `# TYPE` or `# HELP` line, by name.
    pub families: BTreeMap<String, Family>,
    /// The samples, in the order written (the first, up to the cap of
    /// `Exposition::parse_capped`).
    pub samples: Vec<Sample>,
    /// The lines skipped (the first, up to the cap).
    pub unreadable: Vec<BadLine>,
    /// Samples that read but were not kept, past the cap.
    pub samples_past_cap: usize,
    /// Lines that did not read and were not recorded in [`Exposition::unreadable`], past the cap.
    pub unreadable_past_cap: usize,
}

impl Exposition {
    /// Reads `text` line by line, keeping every sample.
    pub fn parse(text: &str) -> Exposition {
        Exposition::parse_capped(text, usize::MAX, |_| {})
    }

    /// Reads `text` line by line, keeping the first `cap` samples and recording the first `cap`
    /// lines that do not read; the rest are counted ([`Exposition::samples_past_cap`],
    /// [`Exposition::unreadable_past_cap`]), so that what is held stays bounded however many
    /// lines the text has. `each` sees every sample that reads, kept or not, in order.
    pub(crate) fn parse_capped(
        text: &str,
        cap: usize,
        mut each: impl FnMut(&Sample),
    ) -> Exposition {
        let mut out = Exposition::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_matches([' ', '\t', '\r']);
            let read = if let Some(comment) = line.strip_prefix('#') {
                out.metadata(comment)
            } else if line.is_empty() {
                Ok(())
            } else {
                sample(line).map(|s| {
                    each(&s);
                    if out.samples.len() < cap {
                        out.samples.push(s);
                    } else {
                        out.samples_past_cap += 1;
                    }
                })
            };
            if let Err(why) = read {
                if out.unreadable.len() < cap {
                    out.unreadable.push(BadLine { line: i + 1, why });
                } else {
                    out.unreadable_past_cap += 1;
                }
            }
        }
        out
    }

    /// How many lines did not read, recorded or not.
    pub(crate) fn unreadable_lines(&self) -> usize {
        self.unreadable
            .len()
            .saturating_add(self.unreadable_past_cap)
    }

    /// A `# HELP` or `# TYPE` line (any other comment is ignored).
    fn metadata(&mut self, comment: &str) -> Result<(), &'static str> {
        let mut words = comment
            .trim_start_matches([' ', '\t'])
            .splitn(2, [' ', '\t']);
        let (keyword, rest) = (words.next().unwrap_or_default(), words.next());
        if keyword != "HELP" && keyword != "TYPE" {
            return Ok(());
        }
        let rest = rest.unwrap_or_default().trim_start_matches([' ', '\t']);
        let (name, text) = rest.split_once([' ', '\t']).unwrap_or((rest, ""));
        if !is_metric_name(name) {
            return Err("a HELP or TYPE line without a valid metric name");
        }
        let text = text.trim_start_matches([' ', '\t']);
        if keyword == "TYPE" {
            let kind = Kind::parse(text.trim_end()).ok_or("a TYPE line with an unknown type")?;
            self.families.entry(name.to_owned()).or_default().kind = kind;
        } else {
            self.families.entry(name.to_owned()).or_default().help = text.to_owned();
        }
        Ok(())
    }

    /// The family a sample named `name` belongs to: its own, or for a histogram's or a
    /// summary's `_bucket`, `_sum`, `_count` sample the family without the suffix.
    pub(crate) fn family_of(&self, name: &str) -> Option<(&str, &Family)> {
        if let Some((n, f)) = self.families.get_key_value(name) {
            return Some((n, f));
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = name.strip_suffix(suffix)?;
            let (n, f) = self.families.get_key_value(base)?;
            matches!(f.kind, Kind::Histogram | Kind::Summary).then_some((n.as_str(), f))
        })
    }

    /// The value of the sample `name` without labels, if there is one.
    pub fn unlabelled(&self, name: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels.is_empty())
            .map(|s| s.value)
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub(crate) fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`.
pub(crate) fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One sample line (not a comment, not empty).
fn sample(line: &str) -> Result<Sample, &'static str> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..end];
    if !is_metric_name(name) {
        return Err("a sample without a valid metric name");
    }
    let mut rest = line[end..].trim_start_matches([' ', '\t']);
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        let (read, after) = label_set(inside)?;
        labels = read;
        rest = after;
    }
    let mut words = rest.split([' ', '\t']).filter(|w| !w.is_empty());
    let value = words.next().ok_or("a sample without a value")?;
    let value = value
        .parse::<f64>()
        .map_err(|_| "a sample whose value is not a number")?;
    if let Some(ts) = words.next() {
        ts.parse::<i64>()
            .map_err(|_| "a sample whose timestamp is not whole milliseconds")?;
    }
    if words.next().is_some() {
        return Err("a sample with more than a value and a timestamp");
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The labels after `{` up to and including `}`; what follows.
fn label_set(mut s: &str) -> Result<(Vec<Label>, &str), &'static str> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', '\t']);
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let (name, after) = s.split_once('=').ok_or("a label without a value")?;
        let name = name.trim_matches([' ', '\t']);
        if !is_label_name(name) {
            return Err("a label without a valid name");
        }
        let after = after
            .trim_start_matches([' ', '\t'])
            .strip_prefix('"')
            .ok_or("a label value without its opening quote")?;
        let (value, after) = label_value(after)?;
        if labels.iter().any(|(n, _)| n == name) {
            return Err("a label named twice");
        }
        labels.push((name.to_owned(), value));
        s = after.trim_start_matches([' ', '\t']);
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("labels not separated by commas");
        }
    }
}

/// A label value after its opening quote, unescaped (`\\`, `\"`, `\n`); what follows its
/// closing quote.
fn label_value(s: &str) -> Result<(String, &str), &'static str> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, '\\')) => out.push('\\'),
                Some((_, '"')) => out.push('"'),
                // The format leaves other escapes undefined: kept as written.
                Some((_, other)) => {
                    out.push('\\');
                    out.push(other);
                }
                None => break,
            },
            c => out.push(c),
        }
    }
    Err("an unterminated label value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn samples_labels_types_and_help_are_read() {
        let e = Exposition::parse(
            "# HELP master_key_count Total number of keys\n# TYPE master_key_count gauge\nmaster_key_count 7\n\n# a comment\nmooncake_tenant_quota_charged_bytes{tenant_id=\"team-a\",} 4096\n",
        );
        assert_eq!(e.unreadable, []);
        assert_eq!(
            e.families["master_key_count"],
            Family {
                kind: Kind::Gauge,
                help: "Total number of keys".into()
            }
        );
        assert_eq!(e.unlabelled("master_key_count"), Some(7.0));
        assert_eq!(
            e.samples[1],
            Sample {
                name: "mooncake_tenant_quota_charged_bytes".into(),
                labels: labels(&[("tenant_id", "team-a")]),
                value: 4096.0
            }
        );
        assert_eq!(e.unlabelled("mooncake_tenant_quota_charged_bytes"), None);
    }

    #[test]
    fn escapes_in_label_values_are_undone() {
        let e =
            Exposition::parse(r#"x{a="say \"hi\"",b="back\\slash",c="two\nlines",d="a}b,c=d"} 1"#);
        assert_eq!(e.unreadable, []);
        assert_eq!(
            e.samples[0].labels,
            labels(&[
                ("a", "say \"hi\""),
                ("b", "back\\slash"),
                ("c", "two\nlines"),
                ("d", "a}b,c=d")
            ])
        );
    }

    #[test]
    fn nan_and_the_infinities_are_values_and_a_timestamp_is_dropped() {
        let e =
            Exposition::parse("a NaN\nb +Inf\nc -Inf\nd 1.5e3 1712345678000\ne{l=\"v\"} 2 -5\n");
        assert_eq!(e.unreadable, []);
        let v: Vec<f64> = e.samples.iter().map(|s| s.value).collect();
        assert!(v[0].is_nan());
        assert_eq!(v[1..], [f64::INFINITY, f64::NEG_INFINITY, 1500.0, 2.0]);
    }

    #[test]
    fn a_line_that_does_not_read_is_skipped_with_its_number() {
        let e = Exposition::parse(
            "ok 1\nno_value\nbad{l=\"open} 1\n9starts_with_a_digit 1\nv abc\nt 1 soon\n# TYPE ok sideways\nx{l=\"1\",l=\"2\"} 1\nlast 2\n",
        );
        let lines: Vec<usize> = e.unreadable.iter().map(|b| b.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8], "{:?}", e.unreadable);
        assert_eq!(
            e.samples
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["ok", "last"]
        );
    }

    #[test]
    fn a_histograms_samples_belong_to_its_family_but_a_gauge_named_sum_to_its_own() {
        let e = Exposition::parse(
            "# TYPE lat histogram\nlat_bucket{le=\"+Inf\"} 3\nlat_sum 1.5\nlat_count 3\n# TYPE q_bytes_sum gauge\nq_bytes_sum 4\n# TYPE w_total counter\n",
        );
        assert_eq!(e.family_of("lat_bucket").map(|f| f.0), Some("lat"));
        assert_eq!(
            e.family_of("lat_count").map(|f| f.1.kind),
            Some(Kind::Histogram)
        );
        assert_eq!(e.family_of("q_bytes_sum").map(|f| f.0), Some("q_bytes_sum"));
        assert_eq!(
            e.family_of("w_total").map(|f| f.1.kind),
            Some(Kind::Counter)
        );
        assert_eq!(e.family_of("w_count"), None, "a counter has no _count");
    }

    #[test]
    fn past_the_cap_samples_and_bad_lines_are_counted_not_kept() {
        let text: String = (0..1000)
            .map(|i| format!("g{{i=\"{i}\"}} {i}\nbad{i}\n"))
            .collect();
        let mut seen = 0;
        let e = Exposition::parse_capped(&text, 10, |_| seen += 1);
        assert_eq!(e.samples.len(), 10);
        assert_eq!(e.samples[9].value, 9.0);
        assert_eq!(e.samples_past_cap, 990);
        assert_eq!((e.unreadable.len(), e.unreadable_past_cap), (10, 990));
        assert_eq!(e.unreadable_lines(), 1000);
        assert_eq!(seen, 1000, "every sample that reads is seen, kept or not");
        let whole = Exposition::parse(&text);
        assert_eq!((whole.samples.len(), whole.samples_past_cap), (1000, 0));
    }

    #[test]
    fn the_real_masters_answer_reads_whole() {
        let e = Exposition::parse(include_str!(
            "../../tests/fixtures/master-metrics-0.3.13.post1.txt"
        ));
        assert_eq!(e.unreadable, []);
        assert_eq!(e.samples.len(), 148);
        assert_eq!(
            e.families["master_put_start_requests_total"].kind,
            Kind::Counter
        );
        assert!(e.samples.iter().all(|s| e.family_of(&s.name).is_some()));
    }
}
