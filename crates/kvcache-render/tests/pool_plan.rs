//! The pool controller's pass decided from recorded inputs (the walkthrough's backend, pool and
//! Binding under `tests/inputs/`, plus a second team's Binding) and recorded ledger answers,
//! without an API server or a master.

use kvcache_api::manifest::{self, Object};
use kvcache_api::{KVCachePool, KVCachePoolBinding};
use kvcache_quota::admin::{Outcome, TenantEntry};
use kvcache_quota::status::{BackendView, PolicyWrite, Release};
use kvcache_render::plan::pool::{LedgerAnswers, conclude, plan};
use kvcache_render::world::World;

const NS: &str = "gpustack-system";
const GI: u64 = 1 << 30;

const TEAM_B: &str = "
apiVersion: worker.gpustack.ai/v1
kind: KVCachePoolBinding
metadata: {name: team-b, namespace: team-b}
spec:
  poolRef: {name: shared-dram}
  quota: {ceiling: 4Gi}
  domain: {name: team-b, blockSize: 64, dtype: bfloat16}
";

fn objects(name: &str, extra: &str) -> Vec<Object> {
    let path = format!("{}/tests/inputs/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("input") + "\n---\n" + extra;
    manifest::parse(&path, &text)
        .expect("input parses")
        .into_iter()
        .map(|m| m.object)
        .collect()
}

fn pool(world: &World) -> KVCachePool {
    world.pool("shared-dram").expect("the pool").clone()
}

fn entry(tenant: &str, granted: u64) -> TenantEntry {
    TenantEntry {
        tenant_id: tenant.into(),
        requested_quota_bytes: granted,
        effective_quota_bytes: granted,
        ..TenantEntry::default()
    }
}

#[test]
fn every_bindings_ceiling_is_pushed_but_one_being_deleted() {
    let mut objects = objects("walkthrough-model-with-cache.yaml", TEAM_B);
    for o in &mut objects {
        if let Object::Binding(b) = o
            && b.metadata.name.as_deref() == Some("team-b")
        {
            let mut going: KVCachePoolBinding = (**b).clone();
            going.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            *b = going.into();
        }
    }
    let world = World::from_objects(&objects);
    let p = plan(&world, NS, &pool(&world), false);
    assert_eq!(
        p.bindings
            .iter()
            .map(|v| v.binding.as_str())
            .collect::<Vec<_>>(),
        ["team-a/team-a", "team-b/team-b"]
    );
    assert_eq!(
        p.pushed
            .iter()
            .map(|v| v.binding.as_str())
            .collect::<Vec<_>>(),
        ["team-a/team-a"],
        "a Binding being deleted gets no push: its release may have removed its tenant"
    );
    assert!(p.read_ledger && p.push);
    assert_eq!(p.release, Release::NotDeleting);
    assert!(matches!(
        p.backend,
        BackendView::Managed {
            multi_tenancy: true,
            ..
        }
    ));
}

#[test]
fn a_pool_deleted_while_bindings_name_it_is_held_and_pushes_nothing() {
    let world = World::from_objects(&objects("walkthrough-model-with-cache.yaml", TEAM_B));
    let p = plan(&world, NS, &pool(&world), true);
    assert!(!p.push);
    assert_eq!(
        p.release,
        Release::Held(vec!["team-a/team-a".into(), "team-b/team-b".into()])
    );
}

#[test]
fn a_backend_without_multi_tenancy_has_no_ledger_to_read() {
    let pool_yaml = "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: shared-dram}\nspec: {backends: [mooncake-dram], quota: {total: 16Gi}}\n";
    let world = World::from_objects(&objects("multi-tenancy-false.yaml", pool_yaml));
    let p = plan(&world, NS, &pool(&world), false);
    assert!(!p.read_ledger);
    assert!(matches!(
        p.backend,
        BackendView::Managed {
            multi_tenancy: false,
            ..
        }
    ));
}

#[test]
fn the_ledgers_answers_become_the_pools_status_and_each_bindings_verdict() {
    let world = World::from_objects(&objects("walkthrough-model-with-cache.yaml", TEAM_B));
    let p = plan(&world, NS, &pool(&world), false);
    let answers = LedgerAnswers {
        // team-a's domain is `default`; team-b was recut to 2Gi of its 4Gi.
        ledger: Outcome::Listed(vec![entry("default", 8 * GI), entry("team-b", 2 * GI)]),
        policy_write: Some(PolicyWrite::Written),
        capacity_bytes: Some(10 * GI),
        unclaimed: Vec::new(),
    };
    let c = conclude(&p, &world, &answers);
    let reason = |binding: &str, type_: &str| {
        let (_, v) = c
            .bindings
            .iter()
            .find(|(b, _)| b == binding)
            .unwrap_or_else(|| panic!("a verdict for {binding}"));
        v.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.reason.to_string())
    };
    assert_eq!(
        reason("team-a/team-a", "QuotaGranted").as_deref(),
        Some("Granted")
    );
    assert_eq!(
        reason("team-b/team-b", "QuotaGranted").as_deref(),
        Some("Recut")
    );
    assert_eq!(
        c.grants.into_iter().collect::<Vec<_>>(),
        [
            ("default".to_owned(), 8 * GI),
            ("team-b".to_owned(), 2 * GI)
        ]
    );
    assert_eq!(c.verdict.domains, ["default", "team-b"]);
}

#[test]
fn a_pool_naming_no_backend_that_exists_sees_it_missing() {
    let world = World::from_objects(
        &objects("walkthrough-model-with-cache.yaml", "")
            .into_iter()
            .filter(|o| !matches!(o, Object::Backend(_)))
            .collect::<Vec<_>>(),
    );
    let p = plan(&world, NS, &pool(&world), false);
    assert_eq!(
        p.backend,
        BackendView::Missing {
            name: "mooncake-dram".into()
        }
    );
    let c = conclude(
        &p,
        &world,
        &LedgerAnswers {
            ledger: Outcome::NotObserved,
            policy_write: None,
            capacity_bytes: None,
            unclaimed: Vec::new(),
        },
    );
    assert_ne!(c.verdict.phase, kvcache_api::pool::PoolPhase::Ready);
}
