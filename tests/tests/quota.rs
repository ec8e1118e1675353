//! The quota crate against the real master: the rendered policy document is accepted, listed
//! tenants write and unlisted ones are refused, the admin API's answers decode, and the modelled
//! recut equals the store's grants when ceilings exceed capacity.

use std::time::{Duration, Instant};

use kvcache_e2e::paths;
use kvcache_e2e::store::{self, Master, MasterOptions, Member, MemberOptions, http_get};
use kvcache_quota::admin::{self, AdminError, Request, TenantEntry};
use kvcache_quota::policy::{self, BindingCeiling};
use kvcache_quota::recut;

const MI: u64 = 1 << 20;

fn send(master: &Master, req: &Request) -> (u16, String) {
    let url = format!("{}{}", master.admin_url(), req.path());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut response = match (req.method(), req.body()) {
        ("PUT", Some(body)) => agent
            .put(&url)
            .header("Content-Type", "application/json")
            .send(body),
        ("DELETE", _) => agent.delete(&url).call(),
        _ => agent.get(&url).call(),
    }
    .expect("the admin API answers");
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().expect("body"))
}

fn ledger(master: &Master) -> Vec<TenantEntry> {
    let (status, body) = send(master, &Request::List);
    admin::decode_list(status, &body).expect("the list decodes")
}

/// A master with multi-tenancy reading `tenants`, and one member of `segment` bytes.
fn store_with(tenants: &[(&str, u64)], segment: u64) -> (Master, Member, Vec<(String, u64)>) {
    let dir = paths::scratch("quota").expect("dir");
    let ceilings: Vec<BindingCeiling> = tenants
        .iter()
        .map(|(t, q)| BindingCeiling {
            binding: format!("ns/{t}"),
            tenant: (*t).to_owned(),
            ceiling_bytes: *q,
        })
        .collect();
    let doc = policy::render("loopback", &ceilings).expect("the document renders");
    let file = dir.join("tenant-quota-policy.yaml");
    std::fs::write(&file, doc.to_yaml()).expect("write policy");
    let master = Master::start(&dir, MasterOptions::multi_tenant(&file))
        .expect("the master accepts the rendered document");
    let member =
        Member::start(&dir, &MemberOptions::new(master.address(), segment)).expect("member");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let capacity = master.capacity_bytes();
        if matches!(capacity, Ok(c) if c >= segment) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "waited 15s for the master to report the member's {segment} bytes mounted; last read: {capacity:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let requests = tenants.iter().map(|(t, q)| ((*t).to_owned(), *q)).collect();
    (master, member, requests)
}

/// Waits until the master has recomputed grants against the mounted capacity.
fn settled(master: &Master, capacity: u64) -> Vec<TenantEntry> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let entries = ledger(master);
        let granted: u64 = entries.iter().map(|e| e.effective_quota_bytes).sum();
        if granted > 0 && granted <= capacity {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "waited 15s for the master to recut grants against {capacity} bytes; last ledger: {entries:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_real_master_takes_the_document_and_grants_what_the_model_says() {
    let (master, _member, requests) =
        store_with(&[("default", 64 * MI), ("team-a", 32 * MI)], 64 * MI);
    let entries = settled(&master, 64 * MI);
    let model = recut(64 * MI, &requests);
    for e in &entries {
        assert_eq!(e.effective_quota_bytes, model[&e.tenant_id], "{e:?}");
        assert_eq!(
            e.requested_quota_bytes,
            requests
                .iter()
                .find(|(t, _)| *t == e.tenant_id)
                .map(|r| r.1)
                .unwrap_or(0)
        );
        assert!(e.has_explicit_policy);
    }
    assert_eq!(entries.len(), 2);

    // A listed tenant writes; an unlisted one is refused by the master.
    assert_eq!(
        store::put(&master.address(), "k1", Some("team-a"), 4096).expect("put"),
        0
    );
    assert_eq!(
        store::put(&master.address(), "k2", Some("team-b"), 4096).expect("put"),
        -1701,
        "TENANT_NOT_REGISTERED"
    );
    let held = ledger(&master)
        .into_iter()
        .find(|e| e.tenant_id == "team-a")
        .expect("team-a");
    assert!(held.usage_bytes() >= 4096, "{held:?}");

    // Upsert through the admin API, then read the one tenant back.
    let (status, body) = send(
        &master,
        &Request::Upsert {
            tenant: "team-c".into(),
            bytes: 16 * MI,
        },
    );
    let entry = admin::decode_entry(status, &body).expect("upsert answers with the entry");
    assert_eq!(entry.requested_quota_bytes, 16 * MI);
    let (status, body) = send(&master, &Request::Get("team-c".into()));
    assert_eq!(
        admin::decode_entry(status, &body).expect("get").tenant_id,
        "team-c"
    );

    // Typed refusals.
    let (status, body) = send(&master, &Request::Delete("team-a".into()));
    assert_eq!(
        admin::decode_ack(status, &body),
        Err(AdminError::TenantNotEmpty)
    );
    let (status, body) = send(&master, &Request::Delete("nobody".into()));
    assert_eq!(admin::decode_ack(status, &body), Err(AdminError::NotFound));
    let (status, body) = send(
        &master,
        &Request::Upsert {
            tenant: "team-d".into(),
            bytes: 0,
        },
    );
    assert!(
        matches!(
            admin::decode_ack(status, &body),
            Err(AdminError::Invalid(_))
        ),
        "{body}"
    );
    let (status, body) = send(&master, &Request::Delete("team-c".into()));
    assert_eq!(admin::decode_ack(status, &body), Ok(()));
}

#[test]
fn the_recut_matches_with_three_uneven_tenants() {
    let tenants = [
        ("alpha", 40 * MI + 1),
        ("beta", 24 * MI + 7),
        ("gamma", 48 * MI + 3),
    ];
    let (master, _member, requests) = store_with(&tenants, 64 * MI);
    let entries = settled(&master, 64 * MI);
    let model = recut(64 * MI, &requests);
    let got: Vec<(String, u64)> = entries
        .iter()
        .map(|e| (e.tenant_id.clone(), e.effective_quota_bytes))
        .collect();
    let want: Vec<(String, u64)> = model.into_iter().collect();
    assert_eq!(got, want);
}

#[test]
fn a_master_without_multi_tenancy_reports_no_ledger() {
    let dir = paths::scratch("quota-off").expect("dir");
    let master = Master::start(&dir, MasterOptions::default()).expect("master");
    let url = format!("{}{}", master.admin_url(), Request::List.path());
    assert!(http_get(&url).is_err(), "a 409 is not a 200");
    let (status, body) = send(&master, &Request::List);
    assert_eq!(
        admin::decode_list(status, &body),
        Err(AdminError::UnavailableInCurrentMode)
    );
}
