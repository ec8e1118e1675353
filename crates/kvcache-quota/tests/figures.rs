//! Pools and Bindings with exact figures: the walkthrough, three namespaces oversubscribing a
//! pool, a backend without multi-tenancy; the policy documents as snapshots.

use kvcache_api::condition::{Cond, Status, find};
use kvcache_api::pool::PoolPhase;
use kvcache_quota::admin::{LedgerFailure, NoAnswer, Outcome, TenantEntry, Unanswered};
use kvcache_quota::policy::{self, BindingCeiling};
use kvcache_quota::recut;
use kvcache_quota::status::*;

const GI: u64 = 1 << 30;

fn cond<'a>(conds: &'a [Cond], t: &str) -> &'a Cond {
    find(conds, t).unwrap_or_else(|| panic!("no {t} condition in {conds:#?}"))
}

fn ledger_for(capacity: u64, bindings: &[BindingCeiling]) -> Outcome {
    let requests: Vec<(String, u64)> = bindings
        .iter()
        .map(|b| (b.tenant.clone(), b.ceiling_bytes))
        .collect();
    let grants = recut(capacity, &requests);
    Outcome::Listed(
        bindings
            .iter()
            .map(|b| TenantEntry {
                tenant_id: b.tenant.clone(),
                requested_quota_bytes: b.ceiling_bytes,
                effective_quota_bytes: grants[&b.tenant],
                charged_bytes: Some(0),
                has_explicit_policy: true,
                ..Default::default()
            })
            .collect(),
    )
}

fn entry<'a>(ledger: &'a Outcome, tenant: &str) -> Option<&'a TenantEntry> {
    match ledger {
        Outcome::Listed(e) => e.iter().find(|e| e.tenant_id == tenant),
        _ => None,
    }
}

fn managed(multi_tenancy: bool) -> BackendView {
    BackendView::Managed {
        name: "mooncake-dram".into(),
        multi_tenancy,
        client_endpoint: "mooncake-dram-leader.gpustack-system.svc:50051".into(),
    }
}

/// The walkthrough's one Binding (8Gi, the default tenant) and its ledger on 16Gi.
fn walkthrough() -> ([BindingCeiling; 1], Outcome) {
    let bindings = [BindingCeiling {
        binding: "team-a/team-a".into(),
        tenant: "default".into(),
        ceiling_bytes: 8 * GI,
    }];
    let ledger = ledger_for(16 * GI, &bindings);
    (bindings, ledger)
}

#[test]
fn the_walkthrough() {
    // Pool 16Gi over two 8Gi members, one Binding at 8Gi, the default tenant.
    let (bindings, ledger) = walkthrough();
    let pool = pool_status(&PoolInput {
        pool: "shared-dram",
        total_bytes: 16 * GI,
        backend: managed(true),
        ledger: &ledger,
        capacity_bytes: Some(16 * GI),
        policy_write: Some(PolicyWrite::Written),
        bindings: &bindings,
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    assert_eq!(pool.phase, PoolPhase::Ready, "{:#?}", pool.conditions);
    assert_eq!(pool.phase_message, None);
    assert_eq!(pool.domains, vec!["default".to_string()]);
    assert_eq!(
        pool.client_endpoint.as_deref(),
        Some("mooncake-dram-leader.gpustack-system.svc:50051")
    );
    assert_eq!(
        cond(&pool.conditions, "QuotaWithinTotal").reason,
        "WithinTotal"
    );
    assert!(
        cond(&pool.conditions, "QuotaWithinTotal")
            .message
            .contains("8Gi")
    );

    let binding = binding_status(&BindingInput {
        binding: "team-a/team-a",
        tenant: "default",
        ceiling_bytes: 8 * GI,
        pool: Some(("shared-dram", &pool)),
        entry: entry(&ledger, "default"),
        contested_with: &[],
        release: Release::NotDeleting,
    });
    assert_eq!(binding.phase, PoolPhase::Ready);
    assert_eq!(binding.effective_quota_bytes, Some(8 * GI));
    assert_eq!(binding.usage_bytes, Some(0));
    assert_eq!(binding.over_quota, Some(false));
    assert_eq!(cond(&binding.conditions, "QuotaGranted").reason, "Granted");

    let doc = policy::render(
        "mooncake-dram",
        &[BindingCeiling {
            binding: "team-a/team-a".into(),
            tenant: "default".into(),
            ceiling_bytes: 8 * GI,
        }],
    )
    .expect("renders");
    insta::assert_snapshot!("walkthrough_policy", doc.to_yaml());
}

#[test]
fn three_namespaces_oversubscribe_a_pool() {
    let bindings = [
        BindingCeiling {
            binding: "team-a/cache".into(),
            tenant: "team-a".into(),
            ceiling_bytes: 8 * GI,
        },
        BindingCeiling {
            binding: "team-b/cache".into(),
            tenant: "team-b".into(),
            ceiling_bytes: 8 * GI,
        },
        BindingCeiling {
            binding: "team-c/cache".into(),
            tenant: "team-c".into(),
            ceiling_bytes: 16 * GI,
        },
    ];
    // 32Gi of ceilings against a 16Gi total and 16Gi mounted.
    let ledger = ledger_for(16 * GI, &bindings);
    let pool = pool_status(&PoolInput {
        pool: "shared-dram",
        total_bytes: 16 * GI,
        backend: managed(true),
        ledger: &ledger,
        capacity_bytes: Some(16 * GI),
        policy_write: Some(PolicyWrite::Written),
        bindings: &bindings,
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    let within = cond(&pool.conditions, "QuotaWithinTotal");
    assert_eq!(
        (within.status, within.reason),
        (Status::False, "Oversubscribed")
    );
    assert!(
        within.message.contains("sum to 32Gi") && within.message.contains("quota.total 16Gi"),
        "{}",
        within.message
    );
    assert_eq!(
        pool.phase,
        PoolPhase::Ready,
        "oversubscription is reported, never a refusal"
    );

    let grants: Vec<u64> = bindings
        .iter()
        .map(|b| {
            binding_status(&BindingInput {
                binding: &b.binding,
                tenant: &b.tenant,
                ceiling_bytes: b.ceiling_bytes,
                pool: Some(("shared-dram", &pool)),
                entry: entry(&ledger, &b.tenant),
                contested_with: &[],
                release: Release::NotDeleting,
            })
        })
        .map(|v| {
            assert_eq!(cond(&v.conditions, "QuotaGranted").reason, "Recut");
            v.effective_quota_bytes.expect("figure")
        })
        .collect();
    assert_eq!(grants, vec![4 * GI, 4 * GI, 8 * GI]);

    let ceilings: Vec<BindingCeiling> = bindings.iter().rev().cloned().collect();
    insta::assert_snapshot!(
        "three_namespaces_policy",
        policy::render("mooncake-dram", &ceilings)
            .expect("renders")
            .to_yaml()
    );
}

#[test]
fn without_multi_tenancy_nothing_is_enforced() {
    let bindings = [BindingCeiling {
        binding: "team-a/team-a".into(),
        tenant: "default".into(),
        ceiling_bytes: 8 * GI,
    }];
    let pool = pool_status(&PoolInput {
        pool: "shared-dram",
        total_bytes: 16 * GI,
        backend: managed(false),
        ledger: &Outcome::NotObserved,
        capacity_bytes: Some(16 * GI),
        policy_write: None,
        bindings: &bindings,
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    let ledger = cond(&pool.conditions, "QuotaLedgerAvailable");
    assert_eq!(
        (ledger.status, ledger.reason),
        (Status::False, "MultiTenancyDisabled")
    );
    assert!(ledger.message.contains("one reuse domain"));
    assert_eq!(pool.phase, PoolPhase::Ready);
    assert_eq!(pool.ledger, Some(false));

    let binding = binding_status(&BindingInput {
        binding: "team-a/team-a",
        tenant: "default",
        ceiling_bytes: 8 * GI,
        pool: Some(("shared-dram", &pool)),
        entry: None,
        contested_with: &[],
        release: Release::NotDeleting,
    });
    let granted = cond(&binding.conditions, "QuotaGranted");
    assert_eq!(
        (granted.status, granted.reason),
        (Status::True, "Unenforced")
    );
    assert!(granted.message.contains("no tenant id"));
    assert_eq!(binding.effective_quota_bytes, None, "no EFFECTIVE figure");
    assert_eq!(binding.usage_bytes, None);
    assert_eq!(binding.phase, PoolPhase::Ready);

    // An external master that answers UNAVAILABLE_IN_CURRENT_MODE is the same.
    let ext = pool_status(&PoolInput {
        pool: "p",
        total_bytes: GI,
        backend: BackendView::External {
            name: "ext".into(),
            client_endpoint: "m:50051".into(),
        },
        ledger: &Outcome::NoLedger,
        capacity_bytes: Some(GI),
        policy_write: None,
        bindings: &[],
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    assert_eq!(
        cond(&ext.conditions, "QuotaLedgerAvailable").reason,
        "MultiTenancyDisabled"
    );
}

#[test]
fn nothing_to_allocate_after_a_restart() {
    let bindings = [BindingCeiling {
        binding: "team-a/team-a".into(),
        tenant: "default".into(),
        ceiling_bytes: 8 * GI,
    }];
    let ledger = ledger_for(0, &bindings);
    let pool = pool_status(&PoolInput {
        pool: "shared-dram",
        total_bytes: 16 * GI,
        backend: managed(true),
        ledger: &ledger,
        capacity_bytes: Some(0),
        policy_write: Some(PolicyWrite::Written),
        bindings: &bindings,
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    let c = cond(&pool.conditions, "CapacityAllocatable");
    assert_eq!((c.status, c.reason), (Status::False, "NothingToAllocate"));
    assert!(
        c.message.contains("every domain's effective quota is zero")
            && c.message.contains("remounted after a leader restart")
    );
    assert_eq!(pool.phase, PoolPhase::Error);
    let binding = binding_status(&BindingInput {
        binding: "team-a/team-a",
        tenant: "default",
        ceiling_bytes: 8 * GI,
        pool: Some(("shared-dram", &pool)),
        entry: entry(&ledger, "default"),
        contested_with: &[],
        release: Release::NotDeleting,
    });
    assert_eq!(
        cond(&binding.conditions, "QuotaGranted").reason,
        "ZeroGranted"
    );
    assert_eq!(binding.effective_quota_bytes, Some(0));
    assert_eq!(binding.phase, PoolPhase::Error);
}

#[test]
fn failures_and_deletion() {
    let unreachable = Outcome::Unreachable(LedgerFailure::Unanswered(Unanswered {
        method: "GET",
        url: "http://gone-leader.kvcache-system:9003/api/v1/tenant_quotas".into(),
        cause: NoAnswer::Refused,
    }));
    let pool = pool_status(&PoolInput {
        pool: "p",
        total_bytes: GI,
        backend: BackendView::Missing {
            name: "gone".into(),
        },
        ledger: &unreachable,
        capacity_bytes: None,
        policy_write: Some(PolicyWrite::Refused(vec![RefusedCeiling {
            binding: "team-a/b".into(),
            answer: "PERSISTENT_FAIL".into(),
        }])),
        bindings: &[],
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    assert_eq!(
        cond(&pool.conditions, "BackendResolved").reason,
        "BackendNotFound"
    );
    assert!(
        cond(&pool.conditions, "BackendResolved")
            .message
            .contains("KVCacheBackend gone")
    );
    let policy = cond(&pool.conditions, "QuotaPolicyWritable");
    assert_eq!(
        (policy.status, policy.reason),
        (Status::False, "PolicyNotWritable")
    );
    assert!(policy.message.ends_with("gone: team-a/b: PERSISTENT_FAIL"));
    let ledger = cond(&pool.conditions, "QuotaLedgerAvailable");
    assert_eq!(
        (ledger.reason, ledger.message.as_str()),
        (
            "LedgerUnreachable",
            "the tenant ledger of KVCacheBackend gone could not be read: no answer to GET http://gone-leader.kvcache-system:9003/api/v1/tenant_quotas: connection refused"
        )
    );
    assert_eq!(
        cond(&pool.conditions, "QuotaPolicyWritable").reason,
        "PolicyNotWritable"
    );
    assert_eq!(pool.phase, PoolPhase::Error);

    let deleting = pool_status(&PoolInput {
        pool: "p",
        total_bytes: GI,
        backend: managed(true),
        ledger: &Outcome::Listed(vec![]),
        capacity_bytes: Some(GI),
        policy_write: Some(PolicyWrite::Written),
        bindings: &[],
        unclaimed: &[],
        release: Release::LedgerNotReleased(NotReleased::NotEmpty {
            tenant: "chat".into(),
        }),
    });
    assert_eq!(deleting.phase, PoolPhase::Deleting);
    assert_eq!(
        cond(&deleting.conditions, "Releasable").reason,
        "LedgerNotReleased"
    );

    let held = binding_status(&BindingInput {
        binding: "team-a/team-a",
        tenant: "default",
        ceiling_bytes: GI,
        pool: Some(("p", &deleting)),
        entry: None,
        contested_with: &["team-b/other".to_string()],
        release: Release::Held(vec!["ModelDeployment team-a/qwen-chat".into()]),
    });
    let r = cond(&held.conditions, "Releasable");
    assert_eq!((r.status, r.reason), (Status::False, "HeldByWorkloads"));
    assert!(r.message.contains("ModelDeployment team-a/qwen-chat"));
    let d = cond(&held.conditions, "DomainExclusive");
    assert_eq!(d.reason, "DomainClaimedByMultipleBindings");
    assert!(d.message.contains("team-b/other"));
    for (release, reason) in [
        (
            Release::LedgerNotReleased(NotReleased::NotEmpty {
                tenant: "chat".into(),
            }),
            "LedgerNotReleased",
        ),
        (
            Release::LedgerRequestFailed(RequestFailed::DeletingEntry {
                tenant: "chat".into(),
                cause: Unanswered {
                    method: "DELETE",
                    url: "http://m:9003/api/v1/tenant_quotas?tenant_id=chat".into(),
                    cause: NoAnswer::TimedOut { after_ms: 1500 },
                },
            }),
            "LedgerRequestFailed",
        ),
    ] {
        let v = binding_status(&BindingInput {
            binding: "a/b",
            tenant: "chat",
            ceiling_bytes: GI,
            pool: None,
            entry: None,
            contested_with: &[],
            release,
        });
        assert_eq!(cond(&v.conditions, "Releasable").reason, reason);
        assert_eq!(v.phase, PoolPhase::Deleting);
    }
}

#[test]
fn admission_helpers() {
    use kvcache_quota::claims::{pool_warning, second_domain};
    let off: kvcache_api::KVCacheBackend = serde_yaml::from_str(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: old-store}\nspec:\n  connection:\n    managed:\n      leader: {multiTenancy: false}\n      members: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    )
    .expect("backend");
    let w = pool_warning("p", &off).expect("a warning");
    assert!(w.contains("old-store") && w.contains("Unenforced"), "{w}");
    let tenants = vec!["default".to_string()];
    assert!(
        second_domain("old-store", Some(false), &tenants, "chat")
            .expect_err("refused")
            .to_string()
            .contains("one reuse domain")
    );
    assert!(
        second_domain("b", None, &tenants, "chat")
            .expect("admitted")
            .is_some_and(|w| w.contains("unproven"))
    );
    assert_eq!(second_domain("b", Some(true), &tenants, "chat"), Ok(None));
    assert_eq!(
        second_domain("b", Some(false), &tenants, "default"),
        Ok(None)
    );
}

#[test]
fn a_tenant_no_binding_claims_is_named_on_the_pool_and_the_pool_keeps_serving() {
    let (bindings, ledger) = walkthrough();
    let input = |unclaimed| PoolInput {
        pool: "shared-dram",
        total_bytes: 16 * GI,
        backend: managed(true),
        ledger: &ledger,
        capacity_bytes: Some(16 * GI),
        policy_write: Some(PolicyWrite::Written),
        bindings: &bindings,
        unclaimed,
        release: Release::NotDeleting,
    };
    let clean = pool_status(&input(&[]));
    assert_eq!(
        cond(&clean.conditions, "TenantsClaimed").reason,
        "AllClaimed"
    );
    let left = [Unclaimed {
        tenant: "stuck".into(),
        bytes: 3 << 20,
        objects: 0,
    }];
    let pool = pool_status(&input(&left));
    let c = cond(&pool.conditions, "TenantsClaimed");
    assert_eq!((c.status, c.reason), (Status::False, "UnclaimedTenants"));
    assert!(c.message.contains("stuck holds 3Mi"), "{}", c.message);
    assert!(
        c.message
            .contains("delete it: its release revokes the tenant and removes its objects"),
        "{}",
        c.message
    );
    assert_eq!(pool.phase, PoolPhase::Ready, "reported, never blocking");
}

#[test]
fn a_domain_at_its_grant_is_under_pressure_and_the_fix_named_but_the_binding_stays_ready() {
    let (bindings, ledger) = walkthrough();
    let pool = pool_status(&PoolInput {
        pool: "shared-dram",
        total_bytes: 16 * GI,
        backend: managed(true),
        ledger: &ledger,
        capacity_bytes: Some(16 * GI),
        policy_write: Some(PolicyWrite::Written),
        bindings: &bindings,
        unclaimed: &[],
        release: Release::NotDeleting,
    });
    let charged = |bytes: u64| {
        let mut e = entry(&ledger, "default").expect("an entry").clone();
        e.charged_bytes = Some(bytes);
        // A 0.3.13 master's entry carries the flag.
        e.admission_closed = Some(false);
        e
    };
    let verdict = |e: &TenantEntry| {
        binding_status(&BindingInput {
            binding: "team-a/team-a",
            tenant: "default",
            ceiling_bytes: 8 * GI,
            pool: Some(("shared-dram", &pool)),
            entry: Some(e),
            contested_with: &[],
            release: Release::NotDeleting,
        })
    };
    let quiet = SavesInWindow::default();
    let pressure = |v: &BindingVerdict, saves: SavesInWindow| {
        quota_pressure(v, 8 * GI, saves).expect("the ledger gave figures")
    };
    // The pool's pass reads the ledger, not the engines: the Binding's writer decides.
    assert!(find(&verdict(&charged(GI)).conditions, "QuotaPressure").is_none());
    // 7.5 of 8Gi: above 90 %.
    let full = verdict(&charged(15 * GI / 2));
    let c = pressure(&full, quiet);
    assert_eq!((c.status, c.reason), (Status::True, "AtGrant"));
    assert!(
        c.message.contains("94%") && c.message.contains("raise spec.quota.ceiling"),
        "{}",
        c.message
    );
    assert_eq!(full.phase, PoolPhase::Ready, "a full domain still serves");
    // Half full: no pressure, and no fault either.
    let half = verdict(&charged(4 * GI));
    let c = pressure(&half, quiet);
    assert_eq!((c.status, c.reason), (Status::False, "BelowGrant"));
    // Saves failing while the domain holds most of its grant: the store refuses what would
    // take it past the grant (a block a large part of a small grant), below 90 %.
    let most = verdict(&charged(11 * GI / 2));
    let refused_saves = SavesInWindow {
        saves: 12,
        failed: 3,
    };
    let c = pressure(&most, refused_saves);
    assert_eq!((c.status, c.reason), (Status::True, "SavesRefused"));
    assert!(
        c.message.contains("3 of its engines' 12 saves") && c.message.contains("69%"),
        "{}",
        c.message
    );
    assert_eq!(pressure(&most, quiet).reason, "BelowGrant");
    // Saves failing in a domain that holds half its grant or less are not its grant's doing.
    assert_eq!(pressure(&half, refused_saves).reason, "BelowGrant");
    assert_eq!(half.phase, PoolPhase::Ready);
    assert_eq!(
        half.admission_closed,
        Some(false),
        "the master's flag shown"
    );
    // The master refusing the domain's allocations is pressure whatever the share.
    let mut closed = charged(4 * GI);
    closed.admission_closed = Some(true);
    let refused = verdict(&closed);
    let c = pressure(&refused, quiet);
    assert_eq!((c.status, c.reason), (Status::True, "AdmissionClosed"));
    assert!(c.message.contains("saves fail"), "{}", c.message);
    assert_eq!(refused.admission_closed, Some(true));
    assert_eq!(refused.phase, PoolPhase::Ready);
    // No ledger figures: nothing said.
    let unread = binding_status(&BindingInput {
        binding: "team-a/team-a",
        tenant: "default",
        ceiling_bytes: 8 * GI,
        pool: None,
        entry: None,
        contested_with: &[],
        release: Release::NotDeleting,
    });
    assert!(quota_pressure(&unread, 8 * GI, refused_saves).is_none());
}
