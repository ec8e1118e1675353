//! When a Binding being deleted may go, and how its tenant's access ends first: the decision
//! of its finalizer, one step per answer the master gives. The operator fetches (its workloads
//! from the cache, the tenant's ledger entry, each request's answer) and calls these; what they
//! return is both the Binding's `Releasable` condition ([`crate::status::Release`]) and whether
//! the finalizer may be removed.
//!
//! The order (docs/design.md#binding-release): a Binding on a backend without a ledger of its
//! own (multi-tenancy off, no pool or backend left, a tenant another Binding still claims) is
//! held while a ModelDeployment names it and goes once none does. Otherwise its tenant is
//! revoked on the master first, whatever still names the Binding (docs/isolation.md#revocation):
//! its quota cut to [`REVOKED_QUOTA_BYTES`], which refuses every put of the tenant on every
//! connection, open ones included, and its objects removed, which ends its reads (the master
//! does not check the ledger on a read). A NetworkPolicy cannot do either: an enforcer lets a
//! connection opened before the change go on. Then the Binding is held while a ModelDeployment
//! names it; then the tenant's entry is deleted, and only a delete the master confirmed (or a
//! tenant already gone) lets the Binding go. A request whose outcome is unknown holds, and every
//! pass starts again from the entry, so a put that landed between two steps is removed too.

use std::collections::BTreeSet;

use crate::admin::{AdminError, LedgerFailure, TenantEntry, Unanswered};
pub use crate::status::Unclaimed;
use crate::status::{NotReleased, Release, RequestFailed};

/// The quota a revoked tenant is cut to: the least the master takes (the 0.3.13.post1 master
/// refuses 0, "Tenant quota must be in [1, 2^63 - 1] bytes"). Every put is larger, so every put
/// of the tenant is refused (`TENANT_QUOTA_EXCEEDED`, -1700), and a refused put evicts the
/// tenant's objects no read lease holds.
pub const REVOKED_QUOTA_BYTES: u64 = 1;

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
    /// Cut the tenant's quota to [`REVOKED_QUOTA_BYTES`], then call [`after_revoke`].
    Revoke,
    /// Remove every object the tenant holds, then call [`after_removal`].
    RemoveObjects,
    /// Delete the tenant's entry, then call [`after_delete`].
    DeleteEntry,
}

/// Held while workloads (`namespace/name` of each) name the Binding, else `then`.
fn unless_used(users: &[String], then: Step) -> Step {
    if users.is_empty() {
        then
    } else {
        Step::Done(Release::Held(users.to_vec()))
    }
}

/// The first step, from the workloads attached to the Binding (`namespace/name` of each) and
/// its backend's ledger: a tenant of its own is read (and revoked) whatever uses the Binding.
pub fn first_step(users: &[String], ledger: &Ledger) -> Step {
    match ledger {
        Ledger::None | Ledger::SharedTenant => unless_used(users, Step::Done(Release::Released)),
        Ledger::Own => Step::ReadEntry,
    }
}

/// After reading the tenant's entry: revoked first (its quota cut, then its objects removed),
/// then held while `users` name the Binding, then deleted.
pub fn after_entry(
    tenant: &str,
    read: Result<Result<TenantEntry, AdminError>, Unanswered>,
    users: &[String],
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
            unless_used(users, Step::Done(Release::Released))
        }
        Ok(Err(e)) => failed(e.into()),
        Ok(Ok(entry)) if entry.requested_quota_bytes > REVOKED_QUOTA_BYTES => Step::Revoke,
        Ok(Ok(entry)) if entry.usage_bytes() > 0 => Step::RemoveObjects,
        Ok(Ok(_)) => unless_used(users, Step::DeleteEntry),
    }
}

/// After cutting the tenant's quota: its objects are removed next (the entry read before the
/// cut may miss a put that landed since).
pub fn after_revoke(tenant: &str, revoked: Result<Result<(), AdminError>, Unanswered>) -> Step {
    let tenant = tenant.to_owned();
    match revoked {
        Ok(Ok(())) => Step::RemoveObjects,
        Ok(Err(refusal)) => Step::Done(Release::LedgerNotReleased(NotReleased::RevokeRefused {
            tenant,
            refusal,
        })),
        Err(cause) => Step::Done(Release::LedgerRequestFailed(RequestFailed::Revoking {
            tenant,
            cause,
        })),
    }
}

/// After asking the master to remove the tenant's objects: the tenant is revoked; held while
/// `users` name the Binding, else its entry is deleted next.
pub fn after_removal(
    tenant: &str,
    removed: Result<Result<u64, AdminError>, Unanswered>,
    users: &[String],
) -> Step {
    let tenant = tenant.to_owned();
    match removed {
        Ok(Ok(_)) => unless_used(users, Step::DeleteEntry),
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

    /// An entry charging `charged` bytes, its quota `requested`.
    fn entry_of(requested: u64, charged: u64) -> TenantEntry {
        serde_json::from_value(serde_json::json!({
            "tenant_id": "team-a", "requested_quota_bytes": requested,
            "effective_quota_bytes": requested, "charged_bytes": charged,
            "admission_closed": false, "over_quota": false, "has_explicit_policy": true
        }))
        .expect("an entry")
    }

    /// An entry already revoked, charging `charged` bytes.
    fn entry(charged: u64) -> TenantEntry {
        entry_of(REVOKED_QUOTA_BYTES, charged)
    }

    fn users() -> Vec<String> {
        vec!["team-a/qwen-chat".to_owned()]
    }

    #[test]
    fn without_a_ledger_of_its_own_a_binding_is_held_while_named_and_goes_then() {
        for ledger in [Ledger::None, Ledger::SharedTenant] {
            assert_eq!(
                first_step(&users(), &ledger),
                Step::Done(Release::Held(users()))
            );
            assert_eq!(first_step(&[], &ledger), Step::Done(Release::Released));
        }
    }

    #[test]
    fn a_tenant_of_its_own_is_revoked_first_whatever_names_the_binding() {
        for named in [users(), Vec::new()] {
            assert_eq!(first_step(&named, &Ledger::Own), Step::ReadEntry);
            // Its quota cut, even with nothing stored (a put may come any moment).
            for charged in [0, 4096] {
                assert_eq!(
                    after_entry("team-a", Ok(Ok(entry_of(64 << 20, charged))), &named),
                    Step::Revoke
                );
            }
            // Then its objects removed, the cut acknowledged or seen on the entry.
            assert_eq!(after_revoke("team-a", Ok(Ok(()))), Step::RemoveObjects);
            assert_eq!(
                after_entry("team-a", Ok(Ok(entry(4096))), &named),
                Step::RemoveObjects
            );
        }
    }

    #[test]
    fn a_revoked_tenant_is_held_while_named_then_its_entry_is_deleted() {
        assert_eq!(
            after_removal("team-a", Ok(Ok(5)), &users()),
            Step::Done(Release::Held(users()))
        );
        assert_eq!(
            after_entry("team-a", Ok(Ok(entry(0))), &users()),
            Step::Done(Release::Held(users()))
        );
        assert_eq!(after_removal("team-a", Ok(Ok(5)), &[]), Step::DeleteEntry);
        assert_eq!(
            after_entry("team-a", Ok(Ok(entry(0))), &[]),
            Step::DeleteEntry
        );
        // No entry, or no ledger: nothing to revoke.
        for gone in [AdminError::NotFound, AdminError::UnavailableInCurrentMode] {
            assert_eq!(
                after_entry("team-a", Ok(Err(gone.clone())), &[]),
                Step::Done(Release::Released)
            );
            assert_eq!(
                after_entry("team-a", Ok(Err(gone)), &users()),
                Step::Done(Release::Held(users()))
            );
        }
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
    fn an_unanswered_or_refused_request_holds_and_says_which_step_failed() {
        let reading = |cause: LedgerFailure| {
            Step::Done(Release::LedgerRequestFailed(RequestFailed::ReadingEntry {
                tenant: "team-a".into(),
                cause,
            }))
        };
        assert_eq!(
            after_entry("team-a", Err(unanswered("GET", NoAnswer::Refused)), &[]),
            reading(LedgerFailure::Unanswered(unanswered(
                "GET",
                NoAnswer::Refused
            )))
        );
        assert_eq!(
            after_entry(
                "team-a",
                Ok(Err(AdminError::UnavailableInCurrentStatus)),
                &[]
            ),
            reading(LedgerFailure::Refused(
                AdminError::UnavailableInCurrentStatus
            ))
        );
        assert_eq!(
            after_revoke("team-a", Ok(Err(AdminError::UnavailableInCurrentStatus))),
            Step::Done(Release::LedgerNotReleased(NotReleased::RevokeRefused {
                tenant: "team-a".into(),
                refusal: AdminError::UnavailableInCurrentStatus
            }))
        );
        assert_eq!(
            after_revoke("team-a", Err(unanswered("PUT", timed_out()))),
            Step::Done(Release::LedgerRequestFailed(RequestFailed::Revoking {
                tenant: "team-a".into(),
                cause: unanswered("PUT", timed_out())
            }))
        );
        assert_eq!(
            after_removal(
                "team-a",
                Ok(Err(AdminError::UnavailableInCurrentStatus)),
                &[]
            ),
            Step::Done(Release::LedgerNotReleased(NotReleased::RemovalRefused {
                tenant: "team-a".into(),
                refusal: AdminError::UnavailableInCurrentStatus
            }))
        );
        assert_eq!(
            after_removal("team-a", Err(unanswered("POST", timed_out())), &users()),
            Step::Done(Release::LedgerRequestFailed(
                RequestFailed::RemovingObjects {
                    tenant: "team-a".into(),
                    cause: unanswered("POST", timed_out())
                }
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
                Release::LedgerNotReleased(NotReleased::RevokeRefused {
                    tenant: "chat".into(),
                    refusal: AdminError::UnavailableInCurrentStatus,
                }),
                format!(
                    "{not_released}the master refused to revoke tenant chat (its quota cut to 1 byte): the master cannot answer in its current state (UNAVAILABLE_IN_CURRENT_STATUS); it is starting or not the leader yet, retrying"
                ),
            ),
            (
                Release::LedgerRequestFailed(RequestFailed::Revoking {
                    tenant: "chat".into(),
                    cause: unanswered("PUT", timed_out()),
                }),
                format!(
                    "{failed}revoking tenant chat: no answer to PUT http://m:9003/api/v1/tenant_quotas?tenant_id=chat: timed out after 1500 ms"
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
