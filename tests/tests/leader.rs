//! The operator's own leader election on a real API server: of two replicas one runs the
//! controllers and the other stands by (serving only metrics and health); SIGTERM on the leader
//! releases the Lease so the standby takes over before the Lease would have expired.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kvcache_api::KVCachePool;
use kvcache_e2e::cluster::{block_on, shared, wait_object};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::store::{metric_sum, metric_value};
use kvcache_e2e::{Error, paths};

/// Long enough that a takeover within it can only come from the leader releasing the Lease.
const LEASE_SECONDS: u64 = 60;
const WAIT: Duration = Duration::from_secs(45);

/// Whether the replica leads, as its `kvcache_operator_leader` gauge says (`None`: no gauge).
fn leads(text: &str) -> Option<bool> {
    metric_value(text, "kvcache_operator_leader").map(|v| v == 1.0)
}

/// The reconciles the replica counted, of every controller and outcome (`None`: none yet).
fn reconciles(text: &str) -> Option<f64> {
    metric_sum(text, "kvcache_operator_reconciles_total", &[])
}

/// Waits until the replica's metrics satisfy `ok`; a wait that runs out names `what` (and
/// fails at the caller's line).
#[track_caller]
fn wait_metrics(op: &mut Operator, what: &str, ok: impl FnMut(&str) -> bool) -> String {
    match op.wait_metrics(what, WAIT, ok) {
        Ok(text) => text,
        Err(e) => panic!("{e}"),
    }
}

fn pool(name: &str) -> KVCachePool {
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {{name: {name}}}\nspec: {{backends: [nowhere], quota: {{total: 1Gi}}}}\n"
    ))
    .expect("a pool")
}

#[test]
fn one_replica_reconciles_the_other_stands_by_and_sigterm_hands_over_at_once() {
    let cluster = shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    let ns = block_on(async {
        let client = cluster.client().await?;
        cluster.namespace(&client, "op-leader").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = paths::scratch("leader").expect("dir");
    let args = [
        "--leader-elect".to_owned(),
        format!("--leader-election-duration={LEASE_SECONDS}"),
    ];
    let mut first = Operator::builder(&kc, &ns)
        .extra(&args)
        .start(&dir)
        .expect("first");
    wait_metrics(&mut first, "the first replica leading", |t| {
        leads(t) == Some(true)
    });
    let mut second = Operator::builder(&kc, &ns)
        .extra(&args)
        .start(&dir)
        .expect("second");
    wait_metrics(&mut second, "the second replica standing by", |t| {
        leads(t) == Some(false)
    });

    let ns2 = ns.clone();
    block_on(async move {
        let client = cluster.client().await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        pools
            .create(&PostParams::default(), &pool("led-by-first"))
            .await?;
        wait_object(
            &pools,
            "led-by-first",
            "a status from the leader",
            WAIT,
            |p| p.status.is_some(),
        )
        .await?;
        let lease = Api::<Lease>::namespaced(client, &ns2)
            .get("kvcache-operator")
            .await?;
        assert!(
            lease.spec.and_then(|s| s.holder_identity).is_some(),
            "the Lease has a holder"
        );
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // An absence cannot be awaited: it is read once, from a scrape that answered (a failed
    // scrape is an error here, not an absence).
    let standby = second
        .metrics()
        .unwrap_or_else(|e| panic!("the standby's metrics: {e}"));
    assert_eq!(
        reconciles(&standby),
        None,
        "the standby reconciles nothing: {standby}"
    );

    // SIGTERM on the leader: it releases the Lease, and the standby leads well before the
    // Lease (60 s) would have expired.
    let stopped = Instant::now();
    first.stop(Duration::from_secs(20));
    wait_metrics(
        &mut second,
        "the standby leading after the leader's SIGTERM",
        |t| leads(t) == Some(true),
    );
    assert!(
        stopped.elapsed() < Duration::from_secs(LEASE_SECONDS),
        "taken over by release, not by expiry"
    );
    block_on(async move {
        let client = cluster.client().await?;
        let pools: Api<KVCachePool> = Api::all(client);
        pools
            .create(&PostParams::default(), &pool("led-by-second"))
            .await?;
        wait_object(
            &pools,
            "led-by-second",
            "a status from the new leader",
            WAIT,
            |p| p.status.is_some(),
        )
        .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // The status above is written during a reconcile; the counter moves when that reconcile
    // ends: wait for it.
    wait_metrics(
        &mut second,
        "the new leader counting a reconcile of the pool controller",
        |t| {
            metric_sum(
                t,
                "kvcache_operator_reconciles_total",
                &[("controller", "kvcachepool")],
            )
            .is_some_and(|n| n >= 1.0)
        },
    );
}

/// What a replica logs when it starts leading (crates/kvcache-operator/src/election.rs).
const LEADING: &str = "leading: the controllers start";

#[test]
fn replicas_started_together_on_a_new_lease_never_lead_two_at_once() {
    let cluster = shared();
    let kc = cluster.control_plane.kubeconfig.clone();
    // A 15 s Lease: each replica's first renewal comes 5 s after it acquired, so a replica
    // whose Lease was taken from under it would have logged leading by then.
    let args = [
        "--leader-elect".to_owned(),
        "--leader-election-duration=15".to_owned(),
    ];
    for round in 0..4 {
        // A folder per round: logs are named by port, which a later round may draw again.
        let dir = paths::scratch(&format!("leader-together-{round}")).expect("dir");
        let name = format!("op-together-{round}");
        let ns = block_on(async move {
            let client = cluster.client().await?;
            cluster.namespace(&client, &name).await
        })
        .unwrap_or_else(|e| panic!("{e}"));
        // Three replicas at once on a namespace with no Lease yet, as a fresh installation.
        let replicas: Vec<Operator> = std::thread::scope(|scope| {
            let started: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        Operator::builder(&kc, &ns)
                            .extra(&args)
                            .start(&dir)
                            .expect("a replica")
                    })
                })
                .collect();
            started
                .into_iter()
                .map(|h| h.join().expect("a replica started"))
                .collect()
        });
        let lease_ns = ns.clone();
        let renewed = block_on(async move {
            let client = cluster.client().await?;
            let leases = Api::<Lease>::namespaced(client, &lease_ns);
            wait_object(
                &leases,
                "kvcache-operator",
                "the Lease renewed once by its holder",
                WAIT,
                |l| {
                    l.spec.as_ref().is_some_and(|s| {
                        s.holder_identity.is_some()
                            && s.renew_time.as_ref().map(|t| t.0)
                                > s.acquire_time.as_ref().map(|t| t.0)
                    })
                },
            )
            .await
        });
        renewed.unwrap_or_else(|e| panic!("round {round}: {e}"));
        // The holder logged its start before it renewed, but a log is read as a file, with no
        // watch: wait (bounded) for a replica's line, then count every replica that wrote one.
        let logged = || -> Vec<usize> {
            replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.log_text().contains(LEADING))
                .map(|(i, _)| i)
                .collect()
        };
        let deadline = Instant::now() + WAIT;
        while logged().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let leaders = logged();
        assert!(
            !leaders.is_empty(),
            "round {round}: no replica logged {LEADING:?} within {WAIT:?} though the Lease is \
             held (is the operator's log level above info?)"
        );
        assert_eq!(
            leaders.len(),
            1,
            "round {round}: replicas {leaders:?} of 3 logged {LEADING:?}"
        );
    }
}
