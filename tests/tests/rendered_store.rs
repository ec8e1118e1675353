//! What the render layer writes is what the real store runs: the leader's rendered flags start a
//! real `mooncake_master` (multi-tenancy with the rendered policy document, offload), a member
//! started with the rendered environment mounts its segment and its disk tier, and the rendered
//! preStop hook deregisters the tier.

use std::process::Command;
use std::time::Duration;

use kvcache_api::KVCacheBackend;
use kvcache_e2e::paths;
use kvcache_e2e::process::{Proc, free_port, wait_tcp};
use kvcache_e2e::store::{Master, MasterOptions, http_get, loopback_env, wait_metric};
use kvcache_quota::policy::{self, BindingCeiling};
use kvcache_render::objects::backend::{BackendInputs, render};

const MI: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn the_rendered_leader_and_member_run_on_the_real_store() {
    let dir = paths::scratch("rendered").expect("dir");
    let tier = dir.join("tier");
    std::fs::create_dir_all(&tier).expect("tier dir");
    let backend: KVCacheBackend = serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: rendered}}\nspec:\n  connection:\n    managed:\n      scaleIn: {{gracePeriodSeconds: 0}}\n      members:\n        - medium: DRAM\n          capacityPerMember: 64Mi\n          localDisks:\n            - path: {}\n              capacity: 1Gi\n              eviction: {{policy: LRU}}\n",
        tier.display()
    ))
    .expect("backend");
    let doc = policy::render(
        "rendered",
        &[BindingCeiling {
            binding: "team-a/team-a".into(),
            tenant: "default".into(),
            ceiling_bytes: 32 * MI,
        }],
    )
    .expect("policy");
    let objects = render(&BackendInputs {
        backend: &backend,
        store_image: "img:0.3.13.post1",
        namespace: "gpustack-system",
        elector_image: "elector:1",
        etcd_image: "etcd:1",
        bound_namespaces: &[],
        policy: Some(&doc),
        access: &kvcache_render::objects::backend::StoreAccess::IN_CLUSTER,
    })
    .expect("renders");

    // The leader: the master's own flags from the rendered command, after the elector's `--`.
    let leader = objects
        .deployment
        .expect("deployment")
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers[0]
        .clone();
    let command = leader.command.expect("command");
    let master_at = command
        .iter()
        .position(|c| c == "mooncake_master")
        .expect("the master runs under the elector");
    let policy_file = dir.join("tenant-quota-policy.yaml");
    let seed = objects
        .config_map
        .expect("policy ConfigMap")
        .data
        .expect("data");
    std::fs::write(&policy_file, &seed["tenant-quota-policy.yaml"]).expect("seed the policy");
    let (rpc, admin) = (free_port().expect("port"), free_port().expect("port"));
    let flags: Vec<String> = command[master_at + 1..]
        .iter()
        .map(|f| {
            if f.starts_with("-rpc_port=") {
                format!("-rpc_port={rpc}")
            } else if f.starts_with("-metrics_port=") {
                format!("-metrics_port={admin}")
            } else if f.starts_with("-tenant_quota_connector_uri=") {
                format!("-tenant_quota_connector_uri={}", policy_file.display())
            } else {
                f.clone()
            }
        })
        .collect();
    assert!(
        flags.contains(&"-enable_offload=true".to_string())
            && flags.contains(&"-default_kv_lease_ttl=5m".to_string()),
        "{flags:?}"
    );
    let master = Master::start(
        &dir,
        MasterOptions {
            ports: Some((rpc, admin)),
            extra_args: flags
                .into_iter()
                .filter(|f| !f.starts_with("-rpc_port") && !f.starts_with("-metrics_port"))
                .collect(),
            ..Default::default()
        },
    )
    .expect("the master accepts every rendered flag");
    let ledger = http_get(&format!("{}/api/v1/tenant_quotas", master.admin_url()))
        .expect("the ledger answers");
    assert!(
        ledger.contains("\"tenant_id\":\"default\""),
        "the rendered policy is in force: {ledger}"
    );

    // The member: the rendered literal environment (field references become loopback values).
    let ds = objects.daemon_sets[0].clone();
    let member = ds
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers[0]
        .clone();
    let port = free_port().expect("port");
    let venv = paths::mooncake_venv().expect("venv");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.current_dir(&dir).args([
        "-m",
        "mooncake.mooncake_store_service",
        "--port",
        &port.to_string(),
    ]);
    for e in member.env.iter().flatten() {
        if let Some(v) = &e.value {
            cmd.env(&e.name, v);
        }
    }
    loopback_env(&mut cmd);
    cmd.env("MOONCAKE_MASTER", master.address());
    let mut proc = Proc::spawn("rendered-member", cmd, &dir.join("member.log")).expect("member");
    wait_tcp(
        &mut proc,
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(60),
    )
    .expect("the member serves");
    let admin_url = master.admin_url();
    wait_metric(
        &admin_url,
        "master_total_capacity_bytes",
        (64 * MI) as f64,
        WAIT,
    )
    .expect("the member's segment is mounted");
    wait_metric(
        &admin_url,
        "master_total_file_capacity_bytes",
        (1u64 << 30) as f64,
        WAIT,
    )
    .expect("the tier registers its declared capacity");

    // The rendered preStop hook deregisters the tier (run with the venv's Python on the member's port).
    let hook = member
        .lifecycle
        .and_then(|l| l.pre_stop)
        .and_then(|p| p.exec)
        .and_then(|e| e.command)
        .expect("preStop");
    let script = hook[2].replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    let status = Command::new(venv.join("bin/python"))
        .args(["-c", &script])
        .status()
        .expect("hook runs");
    assert!(
        status.success(),
        "the unmount endpoint accepts the hook's request"
    );
    wait_metric(&admin_url, "master_total_file_capacity_bytes", 0.0, WAIT)
        .expect("the tier is deregistered");
}
