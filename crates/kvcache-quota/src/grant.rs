//! The master's grant: each tenant's ceiling when the ceilings fit the allocatable capacity,
//! otherwise a proportional recut. Modelled so status can be explained and compared with the store.

use std::collections::BTreeMap;

/// Grants for `requests` (tenant, ceiling bytes) against `capacity` allocatable bytes.
///
/// When the ceilings fit, each tenant is granted its ceiling. Otherwise each is granted
/// `floor(ceiling × capacity / Σ ceilings)`, and the bytes the rounding leaves are handed out one
/// each to the largest remainders (ties in tenant-name order), so the grants add up to the
/// capacity exactly. With 64 MiB mounted and ceilings of 64 MiB and 32 MiB the real master
/// granted 44739243 and 22369621 bytes, which is what this gives.
pub fn recut(capacity: u64, requests: &[(String, u64)]) -> BTreeMap<String, u64> {
    let sum: u128 = requests.iter().map(|(_, r)| u128::from(*r)).sum();
    if sum <= u128::from(capacity) {
        return requests.iter().map(|(t, r)| (t.clone(), *r)).collect();
    }
    let cap = u128::from(capacity);
    let mut grants: Vec<(String, u128, u128)> = requests
        .iter()
        .map(|(t, r)| {
            let scaled = u128::from(*r) * cap;
            (t.clone(), scaled / sum, scaled % sum)
        })
        .collect();
    let handed: u128 = grants.iter().map(|(_, g, _)| *g).sum();
    let mut left = cap.saturating_sub(handed);
    let mut order: Vec<usize> = (0..grants.len()).collect();
    order.sort_by(|&a, &b| {
        grants[b]
            .2
            .cmp(&grants[a].2)
            .then_with(|| grants[a].0.cmp(&grants[b].0))
    });
    for i in order {
        if left == 0 {
            break;
        }
        if grants[i].2 > 0 {
            grants[i].1 += 1;
            left -= 1;
        }
    }
    grants
        .into_iter()
        .map(|(t, g, _)| (t, u64::try_from(g).unwrap_or(u64::MAX)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
        pairs.iter().map(|(t, r)| ((*t).to_owned(), *r)).collect()
    }

    #[test]
    fn the_figures_the_real_master_gave() {
        let g = recut(
            64 << 20,
            &req(&[("default", 64 << 20), ("team-a", 32 << 20)]),
        );
        assert_eq!(g["default"], 44_739_243);
        assert_eq!(g["team-a"], 22_369_621);
    }

    #[test]
    fn ceilings_that_fit_are_granted_whole() {
        let g = recut(16 << 30, &req(&[("default", 8 << 30)]));
        assert_eq!(g["default"], 8 << 30);
        let g = recut(150, &req(&[("a", 100), ("b", 200)]));
        assert_eq!((g["a"], g["b"]), (50, 100));
    }

    proptest! {
        #[test]
        fn a_grant_never_exceeds_its_ceiling_and_an_oversubscribed_recut_hands_out_exactly_the_capacity(
            capacity in any::<u64>(),
            requests in prop::collection::vec(any::<u64>(), 0..8),
        ) {
            let named: Vec<(String, u64)> = requests.iter().enumerate().map(|(i, r)| (format!("t{i}"), *r)).collect();
            let g = recut(capacity, &named);
            let mut total: u128 = 0;
            for (t, r) in &named {
                prop_assert!(g[t] <= *r, "grant above ceiling");
                total += u128::from(g[t]);
            }
            let sum: u128 = requests.iter().map(|r| u128::from(*r)).sum();
            if sum > u128::from(capacity) {
                prop_assert_eq!(total, u128::from(capacity), "oversubscribed: the grants add up to the capacity");
            } else {
                prop_assert_eq!(total, sum, "ceilings that fit are granted whole");
            }
        }
    }
}
