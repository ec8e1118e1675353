//! The passes' figures as the tables of benches/README.md ("transfer").

use std::collections::BTreeMap;

use super::passes::SizeRow;
use super::settings::{ROUNDS, SIZES, VARIANTS, Variant};

/// Every round's rows per (condition, variant).
pub(super) type Results = BTreeMap<(&'static str, &'static str), Vec<Vec<SizeRow>>>;

/// The median over rounds of one size's put and get rates, and the failures summed. A rate
/// counts only from passes whose puts (or gets) all succeeded: a failed get returns at once, so
/// a pass of failures would read as a fast one. NaN where no pass was whole.
fn medians(rounds: &[Vec<SizeRow>], size: usize) -> (f64, f64, usize) {
    let rows: Vec<&SizeRow> = rounds.iter().flatten().filter(|r| r.size == size).collect();
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    (
        mid(rows
            .iter()
            .filter(|r| r.put_failed == 0)
            .map(|r| r.rate(r.put_s))
            .collect()),
        mid(rows
            .iter()
            .filter(|r| r.get_failed == 0)
            .map(|r| r.rate(r.get_s))
            .collect()),
        rows.iter().map(|r| r.put_failed + r.get_failed).sum(),
    )
}

/// A rate for the tables: MB/s, or "no whole pass".
fn mbs(rate: f64) -> String {
    if rate.is_nan() {
        "no whole pass".into()
    } else {
        format!("{rate:.0} MB/s")
    }
}

/// The tables of benches/README.md ("transfer"): per variant and size, the median MB/s idle and
/// loaded, loaded/idle, store/raw.
pub(super) fn print_table(results: &Results, raw: &BTreeMap<&str, f64>) {
    let (raw_idle, raw_loaded) = (raw["idle"], raw["loaded"]);
    println!();
    println!(
        "raw TCP node 0 -> node 1 (median of {ROUNDS}): idle {raw_idle:.0} MB/s, loaded {raw_loaded:.0} MB/s ({:.2})",
        raw_loaded / raw_idle
    );
    println!();
    println!(
        "| client setting | object | put idle | get idle | put loaded | get loaded | loaded/idle (put, get) | idle store/raw (put, get) | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for Variant { name: variant, .. } in VARIANTS {
        let (Some(idle), Some(loaded)) = (
            results.get(&("idle", variant)),
            results.get(&("loaded", variant)),
        ) else {
            continue;
        };
        for (size, count) in SIZES {
            let (pi, gi, fi) = medians(idle, size);
            let (pl, gl, fl) = medians(loaded, size);
            println!(
                "| {variant} | {count} x {} KiB | {} | {} | {} | {} | {:.2}, {:.2} | {:.2}, {:.2} | {} |",
                size >> 10,
                mbs(pi),
                mbs(gi),
                mbs(pl),
                mbs(gl),
                pl / pi,
                gl / gi,
                pi / raw_idle,
                gi / raw_idle,
                fi + fl
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(get_s: f64, get_failed: usize) -> SizeRow {
        SizeRow {
            size: 1 << 20,
            count: 10,
            put_s: 0.1,
            get_s,
            put_failed: 0,
            get_failed,
            get_gone: 0,
        }
    }

    #[test]
    fn a_pass_with_failed_gets_gives_no_get_rate() {
        // The failed pass returned at once: counted, it would be the median.
        let rounds = vec![vec![row(1.0, 0)], vec![row(0.001, 9)], vec![row(0.002, 8)]];
        let (_, get, failed) = medians(&rounds, 1 << 20);
        assert!((get - row(1.0, 0).rate(1.0)).abs() < 1e-9, "{get}");
        assert_eq!(failed, 17);
        let (_, get, _) = medians(&[vec![row(0.001, 3)]], 1 << 20);
        assert_eq!(mbs(get), "no whole pass");
    }
}
