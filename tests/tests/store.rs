//! The real Mooncake store on loopback: capacity is read from the master, members mount and
//! unmount, a master restart leaves a cold cache.

use std::time::Duration;

use kvcache_e2e::paths;
use kvcache_e2e::store::{self, Lookup, Master, MasterOptions, Member, MemberOptions};

const SEGMENT: u64 = 64 << 20;

#[test]
fn capacity_follows_members_and_a_restart_is_cold() {
    let dir = paths::scratch("store").expect("scratch dir");
    let mut master = Master::start(
        &dir,
        MasterOptions {
            client_ttl: Some(3),
            ..Default::default()
        },
    )
    .expect("master starts");
    assert_eq!(
        master.capacity_bytes().expect("metrics"),
        0,
        "no member yet"
    );
    let health = master.health().expect("health");
    assert_eq!(health["service_ready"], true, "{health}");

    let opts = MemberOptions::new(master.address(), SEGMENT);
    let _first = Member::start(&dir, &opts).expect("first member");
    master
        .wait_capacity(SEGMENT, Duration::from_secs(10))
        .expect("the members' segments are mounted");
    let mut second = Member::start(&dir, &opts).expect("second member");
    master
        .wait_capacity(2 * SEGMENT, Duration::from_secs(10))
        .expect("the members' segments are mounted");

    // A killed member is dropped after the client TTL.
    second.proc.kill();
    master
        .wait_capacity(SEGMENT, Duration::from_secs(20))
        .expect("the members' segments are mounted");

    // A put reads back, then a master restart knows no keys: a cold cache.
    assert_eq!(
        store::put(&master.address(), "warm-key", None, 4096).expect("put"),
        0
    );
    assert_eq!(
        store::get(&master.address(), "warm-key", None).expect("get"),
        Lookup::Hit(4096)
    );
    master.restart().expect("master restarts on the same ports");
    master
        .wait_capacity(SEGMENT, Duration::from_secs(20))
        .expect("the surviving member remounts");
    assert_eq!(master.metric("master_key_count").expect("metric"), 0.0);
    assert_eq!(
        store::get(&master.address(), "warm-key", None).expect("get"),
        Lookup::Miss,
        "a miss"
    );
}

#[test]
fn a_failed_read_is_an_error_not_a_miss() {
    // Something that accepts connections and drops them at once: the client comes up without a
    // master, and its `get` returns empty bytes, exactly like a miss. The harness must report an
    // error instead.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let err = store::get(&address.to_string(), "any-key", None)
        .expect_err("no master behind the address: an error, never a miss");
    assert!(
        matches!(
            err,
            kvcache_e2e::Error::Store {
                op: "setup" | "is_exist",
                ..
            }
        ),
        "{err}"
    );
}
