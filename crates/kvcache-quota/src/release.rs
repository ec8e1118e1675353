//! When a Binding being deleted may go: the decision of its finalizer, one step per answer the
//! master gives. The operator fetches (its workloads from the cache, the tenant's ledger entry,
//! the delete's answer) and calls these; what they return is both the Binding's `Releasable`
//! condition ([`crate::status::Release`]) and whether the finalizer may be removed.
//!
//! The order (docs/design.md#binding-release): a Binding used by a ModelDeployment is held;
//! one on a backend without a ledger (multi-tenancy off, an external store, no pool or backend
//! left) goes at once; a tenant another Binding still claims stays on the master and this
//! Binding goes; otherwise the tenant's entry is read: a tenant holding bytes is held until it
//! drains, unless the Binding asks for its cached data to be dropped
//! (`kvcache_api::DROP_CACHED_DATA_ANNOTATION`): then its objects are removed on the master
//! first. An empty tenant is deleted on the master, and only a delete the master confirmed (or a
//! tenant already gone) lets the Binding go. A request whose outcome is unknown holds.

use std::collections::BTreeSet;

use crate::admin::{AdminError, LedgerFailure, TenantEntry, Unanswered};
pub use crate::status::Unclaimed;
use crate::status::{NotReleased, Release, RequestFailed};

/// Whether the Binding's backend keeps a ledger this release must clear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ledger {
    /// No ledger to clear: no pool or backend left, no admin address, multi-tenancy off.
    None,
    /// Another Binding on the backend claims the same tenant: its entry stays.
    SharedTenant,
    /// The tenant's entry is this Binding's alone.
    Own,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Decided: released (the finalizer goes) or held (retried).
    Done(Release),
    /// Read the tenant's entry, then call [`after_entry`].
    ReadEntry,
    /// Delete the tenant's entry, then call [`after_delete`].
    DeleteEntry,
    /// Remove every object the tenant holds, then call [`after_removal`].
    RemoveObjects,
}

/// The first step, from the workloads attached to the Binding (`namespace/name` of each) and
/// its backend's ledger.
pub fn first_step(users: &[String], ledger: &Ledger) -> Step {
    if !users.is_empty() {
        return Step::Done(Release::Held(users.to_vec()));
    }
    match ledger {
        Ledger::None | Ledger::SharedTenant => Step::Done(Release::Released),
        Ledger::Own => Step::ReadEntry,
    }
}

/// After reading the tenant's entry; `drop_cached_data`: the Binding asks for the tenant's
/// objects to be removed rather than waited out.
pub fn after_entry(
    tenant: &str,
    read: Result<Result<TenantEntry, AdminError>, Unanswered>,
    drop_cached_data: bool,
) -> Step {
    let failed = |cause: LedgerFailure| {
        Step::Done(Release::LedgerRequestFailed(RequestFailed::ReadingEntry {
            tenant: tenant.to_owned(),
            cause,
        }))
    };
    match read {
        Err(e) => failed(e.into()),
        Ok(Err(AdminError::UnavailableInCurrentMode | AdminError::NotFound)) => {
            Step::Done(Release::Released)
        }
        Ok(Err(e)) => failed(e.into()),
        Ok(Ok(entry)) if entry.usage_bytes() > 0 && drop_cached_data => Step::RemoveObjects,
        Ok(Ok(entry)) if entry.usage_bytes() > 0 => {
            Step::Done(Release::LedgerNotReleased(NotReleased::HoldsBytes {
                tenant: tenant.to_owned(),
                bytes: entry.usage_bytes(),
            }))
        }
        Ok(Ok(_)) => Step::DeleteEntry,
    }
}

/// After asking the master to remove the tenant's objects: on success its entry is deleted
/// next.
pub fn after_removal(tenant: &str, removed: Result<Result<u64, AdminError>, Unanswered>) -> Step {
    let tenant = tenant.to_owned();
    match removed {
        Ok(Ok(_)) => Step::DeleteEntry,
        Ok(Err(refusal)) => Step::Done(Release::LedgerNotReleased(NotReleased::RemovalRefused {
            tenant,
            refusal,
        })),
        Err(cause) => Step::Done(Release::LedgerRequestFailed(
            RequestFailed::RemovingObjects { tenant, cause },
        )),
    }
}

/// After deleting the tenant's entry.
pub fn after_delete(tenant: &str, deleted: Result<Result<(), AdminError>, Unanswered>) -> Release {
    let tenant = tenant.to_owned();
    match deleted {
        Ok(Ok(()) | Err(AdminError::NotFound)) => Release::Released,
        Ok(Err(AdminError::TenantNotEmpty)) => {
            Release::LedgerNotReleased(NotReleased::NotEmpty { tenant })
        }
        Ok(Err(refusal)) => {
            Release::LedgerNotReleased(NotReleased::DeleteRefused { tenant, refusal })
        }
        Err(cause) => Release::LedgerRequestFailed(RequestFailed::DeletingEntry { tenant, cause }),
    }
}

/// The tenants this pool registered (`registered`: its last `status.domains` and
/// `status.unclaimedTenants`) that are on the ledger with a policy of their own and that no
/// Binding claims (`claimed`: every Binding's tenant), sorted. Only what the pool itself
/// registered is ever a candidate: another cluster's or an administrator's tenants on the same
/// master are not this operator's to remove. A candidate is removed only after `claimed` was
/// read from the API server itself (the operator's cache can lag a Binding just created).
pub fn unclaimed(
    entries: &[TenantEntry],
    registered: &BTreeSet<String>,
    claimed: &BTreeSet<String>,
) -> Vec<Unclaimed> {
    let mut out: Vec<Unclaimed> = entries
        .iter()
        .filter(|e| {
            e.has_explicit_policy
                && registered.contains(&e.tenant_id)
                && !claimed.contains(&e.tenant_id)
        })
        .map(|e| Unclaimed {
            tenant: e.tenant_id.clone(),
            bytes: e
                .usage_bytes()
                .saturating_add(e.reserved_bytes.unwrap_or(0)),
            objects: e
                .committed_count
                .unwrap_or(0)
                .max(e.metadata_object_count.unwrap_or(0)),
        })
        .collect();
    out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::NoAnswer;

    fn entry(charged: u64) -> TenantEntry {
        serde_json::from_value(serde_json::json!({
            "tenant_id": "team-a", "requested_quota_bytes": 1, "effective_quota_bytes": 1,
            "charged_bytes": charged, "admission_closed": false, "over_quota": false,
            "has_explicit_policy": true
        }))
        .expect("an entry")
    }

    #[test]
    fn a_binding_in_use_is_held_whatever_the_ledger() {
        let users = vec!["team-a/qwen-chat".to_owned()];
        for ledger in [Ledger::None, Ledger::SharedTenant, Ledger::Own] {
            assert_eq!(
                first_step(&users, &ledger),
                Step::Done(Release::Held(users.clone()))
            );
        }
    }

    #[test]
    fn without_a_ledger_of_its_own_a_binding_goes_at_once() {
        assert_eq!(
            first_step(&[], &Ledger::None),
            Step::Done(Release::Released)
        );
        assert_eq!(
            first_step(&[], &Ledger::SharedTenant),
            Step::Done(Release::Released)
        );
        assert_eq!(first_step(&[], &Ledger::Own), Step::ReadEntry);
    }

    /// The ledger request `method` to the master `m` got no answer, for `cause`.
    fn unanswered(method: &'static str, cause: NoAnswer) -> Unanswered {
        Unanswered {
            method,
            url: "http://m:9003/api/v1/tenant_quotas?tenant_id=chat".into(),
            cause,
        }
    }

    fn timed_out() -> NoAnswer {
        NoAnswer::TimedOut { after_ms: 1500 }
    }

    #[test]
    fn a_tenant_holding_bytes_is_held_and_an_empty_one_is_deleted() {
        assert_eq!(
            after_entry("team-a", Ok(Ok(entry(4096))), false),
            Step::Done(Release::LedgerNotReleased(NotReleased::HoldsBytes {
                tenant: "team-a".into(),
                bytes: 4096
            }))
        );
        assert_eq!(
            after_entry("team-a", Ok(Ok(entry(0))), false),
            Step::DeleteEntry
        );
        assert_eq!(
            after_entry("team-a", Ok(Err(AdminError::NotFound)), false),
            Step::Done(Release::Released)
        );
        assert_eq!(
            after_entry(
                "team-a",
                Ok(Err(AdminError::UnavailableInCurrentMode)),
                false
            ),
            Step::Done(Release::Released)
        );
    }

    #[test]
    fn a_binding_that_drops_its_cached_data_removes_the_objects_then_the_entry() {
        assert_eq!(
            after_entry("team-a", Ok(Ok(entry(4096))), true),
            Step::RemoveObjects
        );
        assert_eq!(
            after_entry("team-a", Ok(Ok(entry(0))), true),
            Step::DeleteEntry
        );
        assert_eq!(after_removal("team-a", Ok(Ok(5))), Step::DeleteEntry);
        assert_eq!(
            after_removal("team-a", Ok(Err(AdminError::UnavailableInCurrentStatus))),
            Step::Done(Release::LedgerNotReleased(NotReleased::RemovalRefused {
                tenant: "team-a".into(),
                refusal: AdminError::UnavailableInCurrentStatus
            }))
        );
        assert_eq!(
            after_removal("team-a", Err(unanswered("POST", timed_out()))),
            Step::Done(Release::LedgerRequestFailed(
                RequestFailed::RemovingObjects {
                    tenant: "team-a".into(),
                    cause: unanswered("POST", timed_out())
                }
            ))
        );
    }

    #[test]
    fn an_unanswered_or_refused_request_holds_and_says_which_step_failed() {
        let reading = |cause: LedgerFailure| {
            Step::Done(Release::LedgerRequestFailed(RequestFailed::ReadingEntry {
                tenant: "team-a".into(),
                cause,
            }))
        };
        assert_eq!(
            after_entry("team-a", Err(unanswered("GET", NoAnswer::Refused)), true),
            reading(LedgerFailure::Unanswered(unanswered(
                "GET",
                NoAnswer::Refused
            )))
        );
        assert_eq!(
            after_entry(
                "team-a",
                Ok(Err(AdminError::UnavailableInCurrentStatus)),
                true
            ),
            reading(LedgerFailure::Refused(
                AdminError::UnavailableInCurrentStatus
            ))
        );
        assert_eq!(
            after_delete("team-a", Ok(Err(AdminError::TenantNotEmpty))),
            Release::LedgerNotReleased(NotReleased::NotEmpty {
                tenant: "team-a".into()
            })
        );
        assert_eq!(
            after_delete("team-a", Ok(Err(AdminError::PersistentFail))),
            Release::LedgerNotReleased(NotReleased::DeleteRefused {
                tenant: "team-a".into(),
                refusal: AdminError::PersistentFail
            })
        );
        assert_eq!(
            after_delete("team-a", Err(unanswered("DELETE", timed_out()))),
            Release::LedgerRequestFailed(RequestFailed::DeletingEntry {
                tenant: "team-a".into(),
                cause: unanswered("DELETE", timed_out())
            })
        );
        assert_eq!(after_delete("team-a", Ok(Ok(()))), Release::Released);
        assert_eq!(
            after_delete("team-a", Ok(Err(AdminError::NotFound))),
            Release::Released
        );
    }

    /// The `Releasable` messages each cause renders, word for word as users and the
    /// end-to-end tests have read them.
    #[test]
    fn each_cause_renders_the_releasable_message_it_always_has() {
        let message = |release: Release| {
            let c = crate::status::binding_releasable("team-a/chat", &release);
            format!("{:?}/{}: {}", c.status, c.reason, c.message)
        };
        let not_released = "False/LedgerNotReleased: team-a/chat waits for the master to release its tenant entries (retried every 30s): ";
        let failed = "False/LedgerRequestFailed: the ledger request for team-a/chat failed and its outcome is unknown, so it is held: ";
        let cases = [
            (
                Release::LedgerNotReleased(NotReleased::HoldsBytes {
                    tenant: "chat".into(),
                    bytes: 4096,
                }),
                format!(
                    "{not_released}tenant chat still holds 4Ki on the master until it is evicted; to drop it now (the domain's cached KV blocks are lost), annotate the Binding kvcache.gpustack.ai/drop-cached-data=true"
                ),
            ),
            (
                Release::LedgerNotReleased(NotReleased::RemovalRefused {
                    tenant: "chat".into(),
                    refusal: AdminError::NotFound,
                }),
                format!(
                    "{not_released}the master refused to remove the objects of tenant chat: the tenant is not in the ledger (OBJECT_NOT_FOUND)"
                ),
            ),
            (
                Release::LedgerNotReleased(NotReleased::NotEmpty {
                    tenant: "chat".into(),
                }),
                format!(
                    "{not_released}the master refused to release tenant chat: it still holds objects"
                ),
            ),
            (
                Release::LedgerNotReleased(NotReleased::DeleteRefused {
                    tenant: "chat".into(),
                    refusal: AdminError::Invalid("bad id".into()),
                }),
                format!(
                    "{not_released}the master refused to release tenant chat: the master refused the request as invalid: bad id"
                ),
            ),
            (
                Release::LedgerRequestFailed(RequestFailed::ReadingEntry {
                    tenant: "chat".into(),
                    cause: LedgerFailure::Unanswered(unanswered("GET", NoAnswer::Refused)),
                }),
                format!(
                    "{failed}reading the ledger of tenant chat: no answer to GET http://m:9003/api/v1/tenant_quotas?tenant_id=chat: connection refused"
                ),
            ),
            (
                Release::LedgerRequestFailed(RequestFailed::ReadingEntry {
                    tenant: "chat".into(),
                    cause: LedgerFailure::Refused(AdminError::NotFound),
                }),
                format!(
                    "{failed}reading the ledger of tenant chat: the tenant is not in the ledger (OBJECT_NOT_FOUND)"
                ),
            ),
            (
                Release::LedgerRequestFailed(RequestFailed::RemovingObjects {
                    tenant: "chat".into(),
                    cause: unanswered("POST", timed_out()),
                }),
                format!(
                    "{failed}removing the objects of tenant chat: no answer to POST http://m:9003/api/v1/tenant_quotas?tenant_id=chat: timed out after 1500 ms"
                ),
            ),
            (
                Release::LedgerRequestFailed(RequestFailed::DeletingEntry {
                    tenant: "chat".into(),
                    cause: unanswered("DELETE", timed_out()),
                }),
                format!(
                    "{failed}releasing tenant chat: no answer to DELETE http://m:9003/api/v1/tenant_quotas?tenant_id=chat: timed out after 1500 ms"
                ),
            ),
        ];
        for (release, want) in cases {
            assert_eq!(message(release), want);
        }
    }

    #[test]
    fn a_tenant_no_binding_claims_is_found_and_only_an_empty_one_is_deletable() {
        let mut held = entry(4096);
        held.tenant_id = "gone-with-data".into();
        let mut empty = entry(0);
        empty.tenant_id = "gone".into();
        let mut counted = entry(0);
        counted.tenant_id = "gone-counted".into();
        counted.charged_bytes = None;
        counted.committed_count = Some(3);
        let mut masters = entry(0);
        masters.tenant_id = "default".into();
        masters.has_explicit_policy = false;
        let mut others = entry(0);
        others.tenant_id = "another-clusters".into();
        let registered: BTreeSet<String> = [
            "team-a",
            "gone",
            "gone-with-data",
            "gone-counted",
            "default",
        ]
        .map(str::to_owned)
        .into();
        let claimed: BTreeSet<String> = ["team-a".to_owned()].into();
        let found = unclaimed(
            &[entry(10), held, empty, counted, masters, others],
            &registered,
            &claimed,
        );
        let tenants: Vec<(&str, bool)> = found
            .iter()
            .map(|u| (u.tenant.as_str(), u.deletable()))
            .collect();
        assert_eq!(
            tenants,
            vec![
                ("gone", true),
                ("gone-counted", false),
                ("gone-with-data", false)
            ],
            "claimed, the master's own and tenants this pool never registered are left alone"
        );
    }
}
