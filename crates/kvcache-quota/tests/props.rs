//! Properties of the policy render and the status computation.

use kvcache_quota::admin::{Outcome, TenantEntry, decode_ack, decode_list};
use kvcache_quota::policy::{self, BindingCeiling};
use kvcache_quota::status::*;
use proptest::prelude::*;

fn ceilings() -> impl Strategy<Value = Vec<BindingCeiling>> {
    prop::collection::vec(
        (
            "[a-z]{1,3}/[a-z]{1,3}",
            "[a-z][a-z0-9-]{0,8}[a-z0-9]",
            1u64..=i64::MAX as u64,
        ),
        0..8,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(binding, tenant, ceiling_bytes)| BindingCeiling {
                binding,
                tenant,
                ceiling_bytes,
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn the_document_is_invariant_under_reordering(mut bindings in ceilings(), seed in any::<u64>()) {
        let a = policy::render("b", &bindings).expect("valid input renders");
        let n = bindings.len().max(1);
        bindings.rotate_left((seed as usize) % n);
        bindings.reverse();
        let b = policy::render("b", &bindings).expect("renders");
        prop_assert_eq!(a.to_yaml(), b.to_yaml());
        prop_assert_eq!(policy::PolicyDocument::from_yaml(&a.to_yaml()).expect("reads back"), a);
    }

    #[test]
    fn render_and_status_never_panic(
        tenants in prop::collection::vec((".{0,12}", any::<u64>()), 0..6),
        total in any::<u64>(),
        capacity in prop::option::of(any::<u64>()),
        body in ".{0,64}",
        status in any::<u16>(),
    ) {
        let ceilings: Vec<BindingCeiling> = tenants.iter().enumerate().map(|(i, (t, c))| BindingCeiling { binding: format!("ns/b{i}"), tenant: t.clone(), ceiling_bytes: *c }).collect();
        let _ = policy::render("b", &ceilings);
        let views = ceilings.clone();
        let entries: Vec<TenantEntry> = views.iter().map(|v| TenantEntry { tenant_id: v.tenant.clone(), effective_quota_bytes: v.ceiling_bytes / 2, ..Default::default() }).collect();
        let ledger = Outcome::Listed(entries.clone());
        let pool = pool_status(&PoolInput { pool: "p", total_bytes: total, backend: BackendView::External { name: "e".into(), client_endpoint: "m:1".into() }, ledger: &ledger, capacity_bytes: capacity, policy_write: None, bindings: &views, unclaimed: &[], release: Release::NotDeleting });
        for (v, e) in views.iter().zip(&entries) {
            let _ = binding_status(&BindingInput { binding: &v.binding, tenant: &v.tenant, ceiling_bytes: v.ceiling_bytes, pool: Some(("p", &pool)), entry: Some(e), contested_with: &[], release: Release::NotDeleting });
        }
        let _ = decode_list(status, &body);
        let _ = decode_ack(status, &body);
    }
}
