//! Every single-object admission rule (docs/design.md#backend-admission and the sections after
//! it), accepted and refused, with the message a user reads.

mod support;

use kvcache_api::Settings;
use kvcache_api::admission::{Admission, Verdict, is_host_port, tier_path_problem};
use kvcache_api::backend::{KVCacheBackendStatus, ObjectRef};
use support::*;

const M: &str = "spec.connection.managed";

fn create(b: &impl Admission) -> Verdict {
    b.validate_create(&Settings::default())
}

fn update<T: Admission>(new: &T, old: &T) -> Verdict {
    new.validate_update(old, &Settings::default())
}

#[track_caller]
fn assert_refused(v: &Verdict, field: &str, fragment: &str) {
    assert!(
        v.refuses(field, fragment),
        "expected a refusal at {field} containing {fragment:?}, got {:#?}",
        v.violations
    );
}

#[track_caller]
fn assert_ok(v: &Verdict) {
    assert!(v.allowed(), "expected admission, got {:#?}", v.violations);
}

#[test]
fn the_seed_manifests_are_admitted() {
    assert_ok(&create(&backend(WALKTHROUGH_BACKEND)));
    assert_ok(&create(&backend(DISK_HEAVY_BACKEND)));
    assert_ok(&create(&pool(WALKTHROUGH_POOL)));
    assert_ok(&create(&binding(WALKTHROUGH_BINDING)));
    assert_ok(&create(&model_deployment(WALKTHROUGH_MD)));
}

#[test]
fn defaults_are_the_documented_ones() {
    let b = backend(WALKTHROUGH_BACKEND);
    let m = b.spec.connection.managed.expect("managed");
    assert_eq!(m.leader.replicas, 1);
    assert!(m.leader.multi_tenancy, "multiTenancy defaults on");
    assert!(
        m.leader.elects(),
        "election defaults to Kubernetes, even at one replica"
    );
    assert_eq!(
        m.leader.allocation_strategy.flag_value(),
        "free_ratio_first"
    );
    assert_eq!(b.spec.transport.protocol.artifact(), "tcp");
    let binding = binding(WALKTHROUGH_BINDING);
    assert_eq!(
        binding.spec.domain.name, "default",
        "an omitted domain name is default"
    );
    let disk = backend(DISK_HEAVY_BACKEND);
    let tier = disk.spec.connection.managed.expect("managed").members[0]
        .tier()
        .cloned()
        .expect("tier");
    assert!(!tier.clean_after_delete);
    assert!(tier.eviction.expect("eviction").enabled);
}

// --- connection (docs/design.md#backend-connection) ------------------------------------------

#[test]
fn exactly_one_connection() {
    let both = backend(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: b}\nspec:\n  connection:\n    external:\n      endpoints:\n        - {name: Client, address: 'm:50051'}\n        - {name: Admin, address: 'm:9003'}\n    managed:\n      members: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&both),
        "spec.connection",
        "exactly one of spec.connection.managed and spec.connection.external",
    );
    let neither = backend(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: b}\nspec:\n  connection: {}\n",
    );
    assert_refused(&create(&neither), "spec.connection", "exactly one");
}

// --- one tier (docs/design.md#disk-tier-admission) -------------------------------------------

#[test]
fn at_most_one_tiered_group() {
    let b = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /a}]}\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /b}]}\n",
    );
    assert_refused(
        &create(&b),
        &format!("{M}.members"),
        "at most one member group",
    );
    let two_entries = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /a}, {path: /b}]}\n",
    );
    assert_refused(
        &create(&two_entries),
        &format!("{M}.members[0].localDisks"),
        "at most one entry",
    );
}

// --- medium, order, tier immutable (docs/design.md#member-groups, #disk-tier-admission) ------

const TWO_GROUPS: &str = "members:\n  - {medium: DRAM, capacityPerMember: 1Gi, nodeSelector: {a: '1'}}\n  - {medium: DRAM, capacityPerMember: 2Gi, nodeSelector: {b: '1'}}\n";

#[test]
fn medium_is_immutable() {
    let old = managed("members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n");
    let new = managed("members:\n  - {medium: VRAM, capacityPerMember: 1Gi}\n");
    assert_refused(
        &update(&new, &old),
        &format!("{M}.members[0].medium"),
        "is immutable (DRAM -> VRAM)",
    );
}

#[test]
fn groups_keep_their_positions() {
    let old = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 2Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n",
    );
    let swap = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 2Gi}\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n",
    );
    let v = update(&swap, &old);
    assert_refused(
        &v,
        &format!("{M}.members[0]"),
        "is the group that was members[1]",
    );
    assert_refused(
        &v,
        &format!("{M}.members[1]"),
        "is the group that was members[0]",
    );

    let remove_middle = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n",
    );
    assert_refused(
        &update(&remove_middle, &old),
        &format!("{M}.members[1]"),
        "is the group that was members[2]",
    );

    // Allowed: append, remove from the end, edit in place, the [A,B,C] -> [A,C,C] case.
    let append = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 2Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n  - {medium: VRAM, capacityPerMember: 4Gi}\n",
    );
    assert_ok(&update(&append, &old));
    let drop_last = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 2Gi}\n",
    );
    assert_ok(&update(&drop_last, &old));
    let widen = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi, nodeSelector: {x: y}}\n  - {medium: DRAM, capacityPerMember: 2Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n",
    );
    assert_ok(&update(&widen, &old));
    let copy_next = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n  - {medium: DRAM, capacityPerMember: 3Gi}\n",
    );
    assert_ok(&update(&copy_next, &old));
    // Knowingly admitted: reorder combined with an edit of both groups.
    let old2 = managed(TWO_GROUPS);
    let reorder_and_edit = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 5Gi, nodeSelector: {b: '1'}}\n  - {medium: DRAM, capacityPerMember: 6Gi, nodeSelector: {a: '1'}}\n",
    );
    assert_ok(&update(&reorder_and_edit, &old2));
}

#[test]
fn the_tier_is_chosen_once() {
    let plain = managed("members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n");
    let with_tier = tiered("1Gi", "");
    assert_refused(
        &update(&with_tier, &plain),
        &format!("{M}.members[0].localDisks"),
        "adding a disk tier",
    );
    assert_refused(
        &update(&plain, &with_tier),
        &format!("{M}.members[0].localDisks"),
        "removing a group's disk tier",
    );
    let repath = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /elsewhere}]}\n",
    );
    assert_refused(
        &update(&repath, &with_tier),
        &format!("{M}.members[0].localDisks[0].path"),
        "repathing a tier is refused",
    );
    // capacity, keyLimit and eviction stay editable, both ways.
    let edited = tiered(
        "1Gi",
        "capacity: 1Ti\nkeyLimit: 1000\neviction: {policy: LRU}",
    );
    assert_ok(&update(&edited, &with_tier));
    assert_ok(&update(&with_tier, &edited));
    // Dropping the last group takes its tier with it.
    let two = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /t}]}\n",
    );
    assert_ok(&update(&plain, &two));
}

// --- image (docs/design.md#backend-image) ----------------------------------------------------

#[test]
fn an_image_must_come_from_somewhere_and_is_ratcheted() {
    let b = backend(WALKTHROUGH_BACKEND);
    let no_setting = Settings {
        kv_cache_backend_image: None,
        ..Settings::default()
    };
    let v = b.validate_create(&no_setting);
    assert_refused(&v, "spec.image", "\"kv-cache-backend-image\"");
    assert_refused(&v, "spec.image", "neither carries one");
    // An update that leaves spec.image alone is admitted whatever the setting holds.
    assert_ok(&b.validate_update(&b, &no_setting));
    let blank =
        backend(&WALKTHROUGH_BACKEND.replace("type: Mooncake", "type: Mooncake\n  image: '  '"));
    assert_refused(&create(&blank), "spec.image", "must not be blank");
    // External stores need no image.
    let external = backend(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: b}\nspec:\n  connection:\n    external:\n      endpoints:\n        - {name: Client, address: 'm:50051'}\n        - {name: Admin, address: 'm:9003'}\n",
    );
    assert_ok(&external.validate_create(&no_setting));
}

// --- leader replicas (docs/design.md#leader-replicas) ----------------------------------------

#[test]
fn leader_replicas() {
    let six = managed("leader: {replicas: 6}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n");
    assert_refused(
        &create(&six),
        &format!("{M}.leader.replicas"),
        "between 1 and 5",
    );
    let none = managed(
        "leader: {replicas: 3, electionBackend: None}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&none),
        &format!("{M}.leader.replicas"),
        "needs leader.electionBackend: Kubernetes or Etcd",
    );
    let ha = managed("leader: {replicas: 3}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n");
    assert_ok(&create(&ha));
}

// --- warm failover (docs/warm-failover.md) ----------------------------------------------------

#[test]
fn the_etcd_election_is_chosen_at_creation_and_its_size_stays_on_its_side_of_one() {
    let warm = |replicas: i32| {
        managed(&format!(
            "leader: {{replicas: {replicas}, electionBackend: Etcd}}\nmembers: [{{medium: DRAM, capacityPerMember: 1Gi}}]\n"
        ))
    };
    let lease =
        managed("leader: {replicas: 2}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n");
    assert_ok(&create(&warm(1)));
    assert_ok(&create(&warm(3)));
    let lf = format!("{M}.leader");
    assert_refused(
        &update(&warm(2), &lease),
        &format!("{lf}.electionBackend"),
        "create a new backend",
    );
    assert_refused(
        &update(&lease, &warm(2)),
        &format!("{lf}.electionBackend"),
        "cannot move to or from Etcd",
    );
    assert_refused(
        &update(&warm(2), &warm(1)),
        &format!("{lf}.replicas"),
        "three members with standbys",
    );
    assert_refused(
        &update(&warm(1), &warm(3)),
        &format!("{lf}.replicas"),
        "not changed in place",
    );
    assert_ok(&update(&warm(3), &warm(2)));
    assert_ok(&update(&warm(1), &warm(1)));
    let m = warm(2).spec.connection.managed.expect("managed");
    assert!(!m.leader.elects(), "Etcd is not the Lease election");
    assert_eq!(
        (
            m.leader.etcd_replicas(),
            warm(1)
                .spec
                .connection
                .managed
                .expect("managed")
                .leader
                .etcd_replicas()
        ),
        (3, 1)
    );
}

#[test]
fn a_warm_backends_etcd_storage_is_fixed_and_its_running_etcd_survives_no_detour() {
    let with = |etcd: &str| {
        managed(&format!(
            "leader: {{electionBackend: Etcd{etcd}}}\nmembers: [{{medium: DRAM, capacityPerMember: 1Gi}}]\n"
        ))
    };
    let plain = with("");
    let sized = with(", etcd: {storageSize: 2Gi}");
    assert_refused(
        &update(&sized, &plain),
        &format!("{M}.leader.etcd"),
        "fixed when the backend is created",
    );
    assert_refused(
        &update(&plain, &sized),
        &format!("{M}.leader.etcd"),
        "claim templates",
    );
    assert_ok(&update(&sized, &sized));
    // A running etcd (status.etcd) of one member: the backend stays warm at that size, even
    // through `external`.
    let mut running = plain.clone();
    running.status = Some(KVCacheBackendStatus {
        etcd: Some(kvcache_api::backend::EtcdStatus {
            replicas: 1,
            ready: 1,
            endpoints: String::new(),
        }),
        ..Default::default()
    });
    let external = backend(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: m}\nspec:\n  connection:\n    external:\n      endpoints: [{name: Client, address: 'm.x.svc:50051'}]\n",
    );
    assert_refused(
        &update(&external, &running),
        &format!("{M}.leader.electionBackend"),
        "cannot move to or from Etcd",
    );
    let mut detoured = external.clone();
    detoured.status = running.status.clone();
    let three = managed(
        "leader: {replicas: 2, electionBackend: Etcd}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &update(&three, &detoured),
        &format!("{M}.leader.replicas"),
        "not changed in place",
    );
    assert_ok(&update(&plain, &detoured));
}

#[test]
fn a_warm_backends_etcd_claim_has_a_floor() {
    let small = managed(
        "leader: {electionBackend: Etcd, etcd: {storageSize: 1Mi}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&small),
        &format!("{M}.leader.etcd.storageSize"),
        "floor of 64Mi",
    );
    let odd = managed(
        "leader: {electionBackend: Etcd, etcd: {storageSize: lots}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&odd),
        &format!("{M}.leader.etcd.storageSize"),
        "lots",
    );
    let fine = managed(
        "leader: {electionBackend: Etcd, etcd: {storageClassName: local, storageSize: 256Mi}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_ok(&create(&fine));
}

// --- multiTenancy off while used (docs/design.md#multi-tenancy-off) --------------------------

#[test]
fn multi_tenancy_stays_on_while_pools_use_the_backend() {
    let mut old = backend(WALKTHROUGH_BACKEND);
    old.status = Some(KVCacheBackendStatus {
        used_by: vec![ObjectRef {
            kind: "KVCachePool".into(),
            namespace: None,
            name: "shared-dram".into(),
        }],
        ..Default::default()
    });
    let new = backend(&WALKTHROUGH_BACKEND.replace("leader: {}", "leader: {multiTenancy: false}"));
    let v = update(&new, &old);
    assert_refused(
        &v,
        &format!("{M}.leader.multiTenancy"),
        "KVCachePool shared-dram",
    );
    old.status = None;
    assert_ok(&update(&new, &old));
}

// --- extraArgs, extraEnv (docs/design.md#leader-flags, #rendered-env) ------------------------

#[test]
fn refused_leader_flags_name_the_key_and_the_reason() {
    let cases = [
        ("--enable_snapshot=true", "another key's bytes"),
        ("enable_snapshot_restore", "another key's bytes"),
        ("-snapshot_backup_dir=/x", "another key's bytes"),
        ("memory_allocator=offset", "another key's bytes"),
        ("enable_oplog", "electionBackend: Etcd"),
        ("oplog_poll_interval_ms=5", "electionBackend: Etcd"),
        ("etcd_endpoints=x:2379", "electionBackend: Etcd"),
        ("rpc_address=1.2.3.4", "50051"),
        ("rpc_interface=eth0", "50051"),
        ("--port=1", "50051"),
        ("enable_cxl=true", "CXL"),
        ("cxl_path=/dev/dax", "CXL"),
        ("cxl_size=1", "CXL"),
        ("enable_offload=true", "members[].localDisks"),
        ("offload_on_evict", "members[].localDisks"),
        ("enable_multi_tenants=false", "leader.multiTenancy"),
        ("allocation_strategy=random", "leader.allocationStrategy"),
        ("enable_ha=true", "leader.electionBackend"),
        ("config_path=/etc/m.json", "config file"),
    ];
    for (arg, reason) in cases {
        let b = managed(&format!(
            "leader: {{extraArgs: ['{arg}']}}\nmembers: [{{medium: DRAM, capacityPerMember: 1Gi}}]\n"
        ));
        let v = create(&b);
        let key = kvcache_api::rules::flag_key(arg);
        assert_refused(
            &v,
            &format!("{M}.leader.extraArgs[0]"),
            &format!("{key} is refused"),
        );
        assert_refused(&v, &format!("{M}.leader.extraArgs[0]"), reason);
    }
    // Deliberately allowed.
    let ok = managed(
        "leader: {extraArgs: ['metrics_host=::', '-default_kv_lease_ttl=10s', 'eviction_ratio=0.1']}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_ok(&create(&ok));
}

#[test]
fn rendered_environment_names_are_refused() {
    let leader = managed(
        "leader: {extraEnv: [{name: POD_IP, value: x}]}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&leader),
        &format!("{M}.leader.extraEnv[0].name"),
        "POD_IP is refused: the operator renders this variable",
    );
    for name in [
        "MC_TE_METRIC",
        "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
        "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
        "MOONCAKE_MASTER",
    ] {
        let member = managed(&format!(
            "members: [{{medium: DRAM, capacityPerMember: 1Gi, extraEnv: [{{name: {name}, value: x}}]}}]\n"
        ));
        assert_refused(
            &create(&member),
            &format!("{M}.members[0].extraEnv[0].name"),
            &format!("{name} is refused"),
        );
    }
    let dram_vis = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, extraEnv: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}]\n",
    );
    assert_refused(
        &create(&dram_vis),
        &format!("{M}.members[0].extraEnv[0].name"),
        "refused on a DRAM group",
    );
    let vram_vis = managed(
        "members: [{medium: VRAM, capacityPerMember: 1Gi, extraEnv: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}]\n",
    );
    assert_ok(&create(&vram_vis));
    let free = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, extraEnv: [{name: MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS, value: '1'}]}]\n",
    );
    assert_ok(&create(&free));
}

#[test]
fn member_args_are_key_value() {
    let bad =
        managed("members: [{medium: DRAM, capacityPerMember: 1Gi, extraArgs: ['novalue']}]\n");
    assert_refused(
        &create(&bad),
        &format!("{M}.members[0].extraArgs[0]"),
        "key=value",
    );
    let good = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, extraArgs: ['transfer_timeout=5']}]\n",
    );
    assert_ok(&create(&good));
}

// --- fabricInterfaceCount (docs/design.md#fabric-interface-count) ----------------------------

#[test]
fn fabric_interface_count_warns_off_fabric_and_refuses_below_one() {
    let tcp =
        managed("members: [{medium: DRAM, capacityPerMember: 1Gi, fabricInterfaceCount: 2}]\n");
    let v = create(&tcp);
    assert_ok(&v);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("only applies to RDMA and EFA")),
        "{:?}",
        v.warnings
    );
    let rdma = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, fabricInterfaceCount: 2, transport: {protocol: RDMA}}]\n",
    );
    let v = create(&rdma);
    assert_ok(&v);
    assert!(v.warnings.is_empty());
    let zero = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, fabricInterfaceCount: 0, transport: {protocol: RDMA}}]\n",
    );
    assert_refused(
        &create(&zero),
        &format!("{M}.members[0].fabricInterfaceCount"),
        "at least 1",
    );
}

// --- hostPaths (docs/design.md#host-paths) ---------------------------------------------------

#[test]
fn host_path_mounts() {
    let ib = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, hostPaths: [{path: /dev/infiniband, mountPath: /dev/infiniband}]}]\n",
    );
    assert_refused(
        &create(&ib),
        &format!("{M}.members[0].hostPaths[0].mountPath"),
        "must not be /dev/infiniband",
    );
    let dup = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, hostPaths: [{path: /a, mountPath: /x}, {path: /b, mountPath: /x}]}]\n",
    );
    assert_refused(
        &create(&dup),
        &format!("{M}.members[0].hostPaths[1].mountPath"),
        "mounted twice",
    );
    let over_tier = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, hostPaths: [{path: /a, mountPath: /t}], localDisks: [{path: /t}]}]\n",
    );
    assert_refused(
        &create(&over_tier),
        &format!("{M}.members[0].hostPaths[0].mountPath"),
        "own localDisks[].path",
    );
    let ascend = managed(
        "members: [{medium: VRAM, capacityPerMember: 1Gi, hostPaths: [{path: /usr/local/Ascend/driver, mountPath: /usr/local/Ascend/driver, readOnly: true}]}]\n",
    );
    assert_ok(&create(&ascend));
}

// --- tier path (docs/design.md#disk-tier-admission) ------------------------------------------

#[test]
fn tier_path_rules() {
    let cases = [
        ("relative/dir", Some("must be absolute")),
        ("/", Some("must not be /")),
        ("//", Some("must not be /")),
        ("/var/../etc", Some("..")),
        (" /var/lib/kvcache", Some("spaces or tabs")),
        ("/var/lib/kvcache\t", Some("spaces or tabs")),
        ("/dev/infiniband", Some("/dev/infiniband")),
        ("/dev/infiniband/", Some("/dev/infiniband")),
        ("/dev/infiniband/cache", Some("/dev/infiniband")),
        ("/dev", Some("/dev/infiniband")),
        ("/dev/", Some("/dev/infiniband")),
        ("/dev/infiniband-cache", Some("/proc, /sys, /dev or /etc")),
        ("/.", Some("normal form")),
        ("/var/./lib", Some("normal form")),
        ("/var//lib", Some("normal form")),
        ("/var/lib/kvcache/", Some("normal form")),
        ("/proc/cache", Some("/proc, /sys, /dev or /etc")),
        ("/sys", Some("/proc, /sys, /dev or /etc")),
        ("/dev/shm/kvcache", Some("/proc, /sys, /dev or /etc")),
        ("/etc/kvcache", Some("/proc, /sys, /dev or /etc")),
        ("/etcetera", None),
        ("/var/lib/kvcache", None),
        ("/mnt/nvme0/..cache", None),
        ("/mnt/nvme0/.cache", None),
    ];
    for (path, problem) in cases {
        let got = tier_path_problem(path);
        match problem {
            Some(fragment) => assert!(
                got.is_some_and(|g| g.contains(fragment)),
                "{path:?}: expected {fragment:?}, got {got:?}"
            ),
            None => assert_eq!(got, None, "{path:?}"),
        }
        let b = managed(&format!(
            "members: [{{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{{path: {path:?}}}]}}]\n"
        ));
        assert_eq!(create(&b).allowed(), problem.is_none(), "{path:?}");
    }
}

// --- eviction (docs/design.md#disk-tier-admission) -------------------------------------------

#[test]
fn eviction_combinations() {
    let d = format!("{M}.members[0].localDisks[0]");
    let v = create(&tiered("1Gi", "eviction: {enabled: false, policy: LRU}"));
    assert_refused(
        &v,
        &format!("{d}.eviction.policy"),
        "eviction.enabled: false",
    );
    let v = create(&tiered(
        "1Gi",
        "capacity: 1Ti\neviction: {enabled: false, watermark: {high: 90, low: 80}}",
    ));
    assert_refused(
        &v,
        &format!("{d}.eviction.watermark"),
        "eviction.enabled: false",
    );
    let v = create(&tiered("1Gi", "eviction: {watermark: {high: 90, low: 80}}"));
    assert_refused(
        &v,
        &format!("{d}.eviction.watermark"),
        "needs localDisks[].capacity",
    );
    let v = create(&tiered(
        "1Gi",
        "capacity: 1Ti\neviction: {watermark: {high: 80, low: 80}}",
    ));
    assert_refused(
        &v,
        &format!("{d}.eviction.watermark.low"),
        "must be below high",
    );
    assert_ok(&create(&tiered(
        "1Gi",
        "capacity: 1Ti\neviction: {policy: LRU, watermark: {high: 90, low: 80}}",
    )));
    assert_ok(&create(&tiered("1Gi", "eviction: {enabled: false}")));
}

// --- bucket bounds, ratcheting (docs/design.md#disk-tier-admission) --------------------------

#[test]
fn bucket_bounds_name_the_same_figure() {
    let g = format!("{M}.members[0]");
    let v = create(&tiered("8Mi", "capacity: 8Mi\nkeyLimit: 4"));
    assert_refused(&v, &format!("{g}.capacityPerMember"), "one bucket (16Mi)");
    assert_refused(
        &v,
        &format!("{g}.localDisks[0].capacity"),
        "one bucket (16Mi)",
    );
    assert_refused(&v, &format!("{g}.localDisks[0].keyLimit"), "16Mi bucket");
    assert_ok(&create(&tiered("16Mi", "capacity: 16Mi\nkeyLimit: 32")));
    // No floor without a tier.
    assert_ok(&create(&managed(
        "members: [{medium: DRAM, capacityPerMember: 1Mi}]\n",
    )));
}

#[test]
fn the_segment_floor_is_judged_only_when_the_value_moves() {
    let stored = tiered("8Mi", "");
    // Any other edit of an object already below the floor is admitted…
    let relabelled = managed(
        "members:\n  - medium: DRAM\n    capacityPerMember: 8Mi\n    nodeSelector: {kvcache: 'true'}\n    localDisks:\n      - path: /var/lib/kvcache\n        capacity: 1Ti\n",
    );
    assert_ok(&update(&relabelled, &stored));
    // …but moving the value re-judges it.
    let moved = tiered("12Mi", "");
    assert_refused(
        &update(&moved, &stored),
        &format!("{M}.members[0].capacityPerMember"),
        "16Mi",
    );
    assert_ok(&update(&tiered("32Mi", ""), &stored));
}

// --- scaleIn, external (docs/design.md#scale-in, #external-endpoints) ------------------------

#[test]
fn scale_in_grace() {
    let b = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /t}]}]\nscaleIn: {gracePeriodSeconds: 3601}\n",
    );
    assert_refused(
        &create(&b),
        &format!("{M}.scaleIn.gracePeriodSeconds"),
        "between 0 and 3600",
    );
    let inert = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi}]\nscaleIn: {gracePeriodSeconds: 30}\n",
    );
    let v = create(&inert);
    assert_ok(&v);
    assert!(v.warnings.iter().any(|w| w.contains("no effect")));
}

#[test]
fn external_endpoints() {
    let ext = |endpoints: &str| {
        backend(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: b}}\nspec:\n  connection:\n    external:\n      endpoints: {endpoints}\n"
        ))
    };
    let f = "spec.connection.external.endpoints";
    assert_refused(
        &create(&ext("[{name: Client, address: 'm:50051'}]")),
        f,
        "exactly two entries",
    );
    assert_refused(
        &create(&ext(
            "[{name: Client, address: 'm:50051'}, {name: Client, address: 'n:50051'}]",
        )),
        f,
        "named Client",
    );
    assert_refused(
        &create(&ext(
            "[{name: Client, address: 'm'}, {name: Admin, address: 'm:9003'}]",
        )),
        &format!("{f}[0].address"),
        "not host:port",
    );
    assert_ok(&create(&ext(
        "[{name: Client, address: 'm.store.svc:50051'}, {name: Admin, address: '[::1]:9003'}]",
    )));
    for (addr, ok) in [
        ("h:1", true),
        ("10.0.0.1:9003", true),
        ("[fe80::1]:1", true),
        ("h:", false),
        (":1", false),
        ("h:port", false),
        ("h:99999", false),
        ("h h:1", false),
        ("a:b:1", false),
    ] {
        assert_eq!(is_host_port(addr), ok, "{addr}");
    }
}

// --- pool (docs/design.md#pool-admission) ----------------------------------------------------

#[test]
fn pool_rules() {
    let p = pool(WALKTHROUGH_POOL);
    let two = pool(&WALKTHROUGH_POOL.replace("- mooncake-dram", "- mooncake-dram\n    - other"));
    assert_refused(
        &create(&two),
        "spec.backends",
        "exactly one KVCacheBackend; it names 2",
    );
    let repointed = pool(&WALKTHROUGH_POOL.replace("- mooncake-dram", "- other"));
    assert_refused(
        &update(&repointed, &p),
        "spec.backends",
        "cannot be re-pointed",
    );
    let zero = pool(&WALKTHROUGH_POOL.replace("16Gi", "'0'"));
    assert_refused(&create(&zero), "spec.quota.total", "above zero");
    // On the wire a quantity is a string, as the CRD schema says: a bare YAML number is refused.
    let bare =
        kvcache_api::manifest::parse("test", &WALKTHROUGH_POOL.replace("16Gi", "17179869184"))
            .expect_err("a bare number is not a quantity string");
    assert!(
        bare.to_string()
            .contains("spec.quota.total: invalid type: integer"),
        "{bare}"
    );
    let malformed = pool(&WALKTHROUGH_POOL.replace("16Gi", "16GB"));
    assert_refused(
        &create(&malformed),
        "spec.quota.total",
        "not a quantity suffix",
    );
    let bigger = pool(&WALKTHROUGH_POOL.replace("16Gi", "32Gi"));
    assert_ok(&update(&bigger, &p));
}

// --- binding (docs/design.md#binding-admission) ----------------------------------------------

#[test]
fn binding_rules() {
    let b = binding(WALKTHROUGH_BINDING);
    for (from, to, field) in [
        ("blockSize: 64", "blockSize: 16", "spec.domain.blockSize"),
        ("dtype: bfloat16", "dtype: fp8_e4m3", "spec.domain.dtype"),
        (
            "blockSize: 64",
            "blockSize: 64\n    name: other",
            "spec.domain.name",
        ),
        ("name: shared-dram", "name: other-pool", "spec.poolRef"),
    ] {
        let edited = binding(&WALKTHROUGH_BINDING.replace(from, to));
        assert_refused(&update(&edited, &b), field, "immutable");
    }
    let raised = binding(&WALKTHROUGH_BINDING.replace("ceiling: 8Gi", "ceiling: 12Gi"));
    assert_ok(&update(&raised, &b));

    let auto = binding(&WALKTHROUGH_BINDING.replace("dtype: bfloat16", "dtype: auto"));
    assert_refused(
        &create(&auto),
        "spec.domain.dtype",
        "auto is refused on a new Binding",
    );
    // Ratcheting: a Binding stored with auto stays updatable; with the setting off, auto is fine.
    let raised_auto = binding(
        &WALKTHROUGH_BINDING
            .replace("dtype: bfloat16", "dtype: auto")
            .replace("8Gi", "9Gi"),
    );
    assert_ok(&update(&raised_auto, &auto));
    let off = Settings {
        kv_cache_dtype_owned: false,
        ..Settings::default()
    };
    assert_ok(&auto.validate_create(&off));

    let underscore =
        binding(&WALKTHROUGH_BINDING.replace("blockSize: 64", "blockSize: 64\n    name: _system"));
    assert_refused(
        &create(&underscore),
        "spec.domain.name",
        "must not start with '_'",
    );
    let upper =
        binding(&WALKTHROUGH_BINDING.replace("blockSize: 64", "blockSize: 64\n    name: TeamA"));
    assert_refused(&create(&upper), "spec.domain.name", "DNS-1123 label");
    let zero = binding(&WALKTHROUGH_BINDING.replace("ceiling: 8Gi", "ceiling: '0'"));
    assert_refused(&create(&zero), "spec.quota.ceiling", "above zero");
    let huge = binding(&WALKTHROUGH_BINDING.replace("ceiling: 8Gi", "ceiling: 8Ei"));
    assert_refused(&create(&huge), "spec.quota.ceiling", "at most 8Ei");
}

// --- model deployment (docs/design.md#model-admission) ---------------------------------------

#[test]
fn model_deployment_rules() {
    let md = model_deployment(WALKTHROUGH_MD);
    for (from, to, field) in [
        (
            "name: Qwen/Qwen2.5-7B-Instruct",
            "name: Qwen/Qwen3-8B",
            "spec.model",
        ),
        ("name: vLLM", "name: SGLang", "spec.engine.name"),
        (
            "name: team-a                       #",
            "name: team-b #",
            "spec.kvCache",
        ),
        ("name: server", "name: chat", "spec.roles"),
        (
            "name: server",
            "name: server\n      kind: Prefill",
            "spec.roles",
        ),
    ] {
        let edited = model_deployment(&WALKTHROUGH_MD.replace(from, to));
        let v = update(&edited, &md);
        assert_refused(&v, field, "new ModelDeployment");
    }
    let detached = model_deployment(
        &WALKTHROUGH_MD.replace("  kvCache:\n    poolRef:\n      name: team-a                       # the Binding above, in this namespace\n", ""),
    );
    assert!(detached.spec.kv_cache.is_none());
    assert_refused(
        &update(&detached, &md),
        "spec.kvCache",
        "attaching, detaching",
    );
    // Editable: the engine version and replicas.
    let edited = model_deployment(
        &WALKTHROUGH_MD
            .replace("\"0.29.0\"", "\"0.29.1\"")
            .replace("replicas: 2", "replicas: 3"),
    );
    assert_ok(&update(&edited, &md));

    let no_version = model_deployment(&WALKTHROUGH_MD.replace("    version: \"0.29.0\"                    # on the same store line as Step 1's default image\n", ""));
    assert_refused(
        &create(&no_version),
        "spec.engine.version",
        "required when a role names no image",
    );
    let cross_ns = model_deployment(&WALKTHROUGH_MD.replace(
        "name: team-a                       #",
        "name: other/team-a #",
    ));
    assert_refused(
        &create(&cross_ns),
        "spec.kvCache.poolRef.name",
        "this namespace",
    );
    let empty = model_deployment(
        &WALKTHROUGH_MD.replace("name: team-a                       #", "name: '' #"),
    );
    assert_refused(
        &create(&empty),
        "spec.kvCache.poolRef.name",
        "must name a KVCachePoolBinding",
    );
    let no_it =
        model_deployment(&WALKTHROUGH_MD.replace("instanceType: gpu-a10-24g", "instanceType: ''"));
    assert_refused(
        &create(&no_it),
        "spec.roles[0].instanceType",
        "must name an InstanceType",
    );
}

// --- store Pods' CPU and memory (docs/store-resources.md) ----------------------------------

#[test]
fn store_resources_default_and_a_low_cpu_request_warns_with_the_floor() {
    let quiet = managed("members: [{medium: DRAM, capacityPerMember: 1Gi}]\n");
    assert_ok(&create(&quiet));
    assert!(create(&quiet).warnings.is_empty(), "defaults warn nothing");

    let low = managed(
        "leader: {resources: {requests: {cpu: 25m}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi, resources: {requests: {cpu: 100m}}}]\n",
    );
    let v = create(&low);
    assert_ok(&v);
    assert_eq!(v.warnings.len(), 2, "{:#?}", v.warnings);
    assert!(v.warnings[0].starts_with(&format!("{M}.leader.resources.requests.cpu: 25m")));
    assert!(v.warnings[0].contains("floor of 250m"), "{}", v.warnings[0]);
    assert!(v.warnings[1].starts_with(&format!("{M}.members[0].resources.requests.cpu: 100m")));

    let at_floor = managed(
        "leader: {resources: {requests: {cpu: 250m, memory: 256Mi}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert!(create(&at_floor).warnings.is_empty());
}

#[test]
fn a_member_memory_request_covers_its_segment_and_buffers() {
    // 1Gi segment + 16Mi buffer: 1040Mi.
    let under = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, resources: {requests: {memory: 1Gi}}}]\n",
    );
    assert_refused(
        &create(&under),
        &format!("{M}.members[0].resources.requests.memory"),
        "1Gi is below 1040Mi, the member's segment plus its staging buffers",
    );
    let covered = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, resources: {requests: {memory: 1040Mi}}}]\n",
    );
    assert_ok(&create(&covered));
    // A VRAM segment is accelerator memory: only the buffer is host memory.
    let vram = managed(
        "members: [{medium: VRAM, capacityPerMember: 8Gi, resources: {requests: {memory: 64Mi}}}]\n",
    );
    assert_ok(&create(&vram));
}

#[test]
fn store_limits_are_not_under_their_requests_written_or_default() {
    let cpu = managed(
        "leader: {resources: {requests: {cpu: '2'}, limits: {cpu: 1500m}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&cpu),
        &format!("{M}.leader.resources.limits.cpu"),
        "1500m is below the CPU request of 2000m",
    );
    // The member's default memory request is its floor (1040Mi here).
    let memory = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, resources: {limits: {memory: 1Gi}}}]\n",
    );
    assert_refused(
        &create(&memory),
        &format!("{M}.members[0].resources.limits.memory"),
        "1Gi is below the memory request of 1040Mi",
    );
    // The leader's default CPU request is 1.
    let leader = managed(
        "leader: {resources: {limits: {cpu: 500m}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&leader),
        &format!("{M}.leader.resources.limits.cpu"),
        "500m is below the CPU request of 1000m",
    );
    let bad = managed(
        "leader: {resources: {requests: {cpu: fast}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&bad),
        &format!("{M}.leader.resources.requests.cpu"),
        "is not a CPU amount",
    );
}

#[test]
fn a_priority_class_name_must_be_a_name() {
    let bad = managed(
        "priorityClassName: Store_Critical\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_refused(
        &create(&bad),
        &format!("{M}.priorityClassName"),
        "PriorityClass",
    );
    let good = managed(
        "priorityClassName: kvcache-store\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_ok(&create(&good));
}
