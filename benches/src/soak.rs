//! `cargo xtask bench soak --failovers N`: two backends failing over at the same moment, N
//! times, on two real nodes with the operator (as from a Pod). Each backend runs two electing
//! leader replicas and a member on each node (`soak-a`'s members dial the leader Service,
//! `soak-b`'s follow the Lease, checking who answers at its address); each round deletes both serving leader Pods at
//! once and samples, until both serve again with every member remounted: how many leader Pods
//! of one backend report `service_ready` at once (goal: never two), and whether a master lists a
//! segment of the other backend's member (goal: never; the harness's per-node address books and
//! the operator's `ForeignMember` check are what keep it so). Method and figures in
//! benches/README.md ("soak").

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_e2e::cluster::{self, block_on, client_from};
use kvcache_e2e::{Error, pods, walkthrough};
use kvcache_render::objects::backend::{ADMIN_PORT, leader_name};

const NS: &str = "gpustack-system";
const BACKENDS: [&str; 2] = ["soak-a", "soak-b"];
const FULL: u64 = 128 << 20;
const WAIT: Duration = Duration::from_secs(180);
/// How long one question to a leader Pod's admin port may take (a Pod whose network is gone
/// otherwise holds the proxied request for minutes): no answer is not serving.
const ASK: Duration = Duration::from_secs(2);

/// The soak backend `name`; the second one's members find the master through the Lease.
fn manifest(name: &str) -> Result<KVCacheBackend, Error> {
    let addressing = if name == BACKENDS[1] {
        "Lease"
    } else {
        "Service"
    };
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}}}\nspec:\n  type: Mooncake\n  connection:\n    managed:\n      leader: {{replicas: 2, multiTenancy: false, memberAddressing: {addressing}, resources: {{requests: {{cpu: 100m, memory: 128Mi}}}}}}\n      members:\n        - nodeSelector: {{kubernetes.io/os: linux}}\n          medium: DRAM\n          capacityPerMember: 64Mi\n          resources: {{requests: {{cpu: 100m}}}}\n"
    ))
    .map_err(|e| Error::Invalid {
        path: name.into(),
        what: "backend",
        reason: e.to_string(),
    })
}

fn serving_again(b: &KVCacheBackend, holder_before: &str, holder_now: Option<&str>) -> bool {
    let full = b
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| kvcache_api::quantity::parse_bytes(&c.total.0).ok())
        == Some(FULL);
    full && kvcache_e2e::status::has_condition(b, "MembersMounted=True")
        && holder_now.is_some_and(|h| h != holder_before)
}

async fn holder(leases: &Api<Lease>, backend: &str) -> Result<Option<String>, Error> {
    Ok(leases
        .get_opt(&leader_name(backend))
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// One sample: per backend, its leader Pods that report `service_ready`, and the segments its
/// serving master lists that are the other backend's members.
async fn sample(client: &Client, store: &Api<Pod>) -> Result<(Vec<usize>, Vec<String>), Error> {
    let mut serving = Vec::new();
    let mut foreign = Vec::new();
    let mut members: Vec<BTreeSet<String>> = Vec::new();
    for b in BACKENDS {
        let listed = store
            .list(&ListParams::default().labels(&walkthrough::backend_pods(b, "member-0")))
            .await?;
        members.push(
            listed
                .iter()
                .filter_map(|p| pods::ip_of(p).map(str::to_owned))
                .collect(),
        );
    }
    for (i, b) in BACKENDS.iter().enumerate() {
        let leaders = store
            .list(&ListParams::default().labels(&walkthrough::backend_pods(b, "leader")))
            .await?;
        let mut n = 0;
        for p in leaders
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let Ok(Ok(health)) = tokio::time::timeout(
                ASK,
                pods::proxy_get(client, NS, pods::name_of(p), ADMIN_PORT as u16, "health"),
            )
            .await
            else {
                continue;
            };
            let ready = serde_json::from_str::<serde_json::Value>(&health)
                .ok()
                .and_then(|v| v["service_ready"].as_bool())
                == Some(true);
            if !ready {
                continue;
            }
            n += 1;
            let Ok(Ok(detail)) = tokio::time::timeout(
                ASK,
                pods::proxy_get(
                    client,
                    NS,
                    pods::name_of(p),
                    ADMIN_PORT as u16,
                    "get_segments_detail",
                ),
            )
            .await
            else {
                continue;
            };
            let other = &members[1 - i];
            let listed: Vec<String> = serde_json::from_str::<serde_json::Value>(&detail)
                .ok()
                .and_then(|v| v["segments"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|s| s["segment_name"].as_str())
                .map(|s| s.rsplit_once(':').map_or(s, |(h, _)| h).to_owned())
                .collect();
            for host in listed {
                if other.contains(&host) && !members[i].contains(&host) {
                    foreign.push(format!(
                        "{b}'s master lists {host}, a member of the other backend"
                    ));
                }
            }
        }
        serving.push(n);
    }
    Ok((serving, foreign))
}

/// `cargo xtask bench soak`.
pub fn soak(failovers: usize) -> anyhow::Result<()> {
    let bench = crate::operator::with_operator("bench-soak", NS)?;
    let kc = bench.nodes.control_plane.kubeconfig.clone();
    let (rounds, two_serving, foreign, restarted, samples) = block_on(async move {
        let client = client_from(&kc).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
        let store: Api<Pod> = Api::namespaced(client.clone(), NS);
        for b in BACKENDS {
            backends
                .patch(
                    b,
                    &PatchParams::apply(walkthrough::MANAGER).force(),
                    &Patch::Apply(&manifest(b)?),
                )
                .await?;
        }
        for b in BACKENDS {
            cluster::wait_object(
                &backends,
                b,
                "Ready with 128Mi, every member mounted",
                WAIT,
                |x| serving_again(x, "", Some("any")),
            )
            .await?;
        }
        let mut rounds = Vec::new();
        let (mut two_serving, mut foreign, mut samples) = (0usize, Vec::new(), 0usize);
        for round in 0..failovers {
            let mut before = Vec::new();
            for b in BACKENDS {
                let h = holder(&leases, b).await?.unwrap_or_default();
                // The holder identity is the serving Pod's name.
                store.delete(&h, &DeleteParams::default()).await?;
                before.push(h);
            }
            let t = Instant::now();
            loop {
                let (serving, seen) = sample(&client, &store).await?;
                samples += 1;
                two_serving += serving.iter().filter(|n| **n > 1).count();
                foreign.extend(seen);
                let mut done = true;
                for (b, h) in BACKENDS.iter().zip(&before) {
                    let now = holder(&leases, b).await?;
                    let x = backends.get(b).await?;
                    done &= serving_again(&x, h, now.as_deref());
                }
                if done {
                    break;
                }
                if t.elapsed() > WAIT {
                    return Err(Error::Wait {
                        what: format!(
                            "round {}: both backends serving again with a new holder and every member remounted",
                            round + 1
                        ),
                        reason: format!("not within {WAIT:?}"),
                    });
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            rounds.push(t.elapsed());
            println!(
                "round {}: both serving again, members remounted, in {:.1} s",
                round + 1,
                t.elapsed().as_secs_f64()
            );
        }
        let restarted = Api::<Event>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ForeignMemberRestarted"))
            .count();
        for b in BACKENDS {
            backends.delete(b, &DeleteParams::default()).await?;
        }
        Ok::<_, Error>((rounds, two_serving, foreign, restarted, samples))
    })?;
    print_soak(&rounds, two_serving, &foreign, restarted, samples);
    drop(bench);
    Ok(())
}

/// The soak's table (benches/README.md, "soak"), after the foreign mounts seen: `rounds`' times
/// to both serving and remounted, and the counts of the run.
fn print_soak(
    rounds: &[Duration],
    two_serving: usize,
    foreign: &[String],
    restarted: usize,
    samples: usize,
) {
    let mut sorted = rounds.to_vec();
    sorted.sort();
    let pick = |q: f64| {
        sorted
            .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    for f in foreign {
        println!("foreign: {f}");
    }
    println!();
    println!(
        "| soak, 2 backends (2 electing leaders, 2 members of 64 MiB each) failing over together | rounds | samples | moments with two serving masters | foreign mounts seen | ForeignMemberRestarted events | delete to both serving and remounted (p50 / max) |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| this run | {} | {samples} | {two_serving} | {} | {restarted} | {:.1} s / {:.1} s |",
        rounds.len(),
        foreign.len(),
        pick(0.5),
        pick(1.0)
    );
}
