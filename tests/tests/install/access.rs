//! Who reaches the operator's Pods, under the harness's NetworkPolicy enforcer: the installation
//! names this cluster's control plane (`controlPlaneCIDRs`), so a tenant's Pod connects to
//! neither the webhook port nor the metrics port, directly or through the Service, while the
//! API server still calls the webhook and reads `/metrics` through its Pod proxy, a Pod of the
//! `monitoring` namespace reads `/metrics`, and the kubelet's probes keep both replicas Ready.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams};
use kvcache_e2e::cluster::block_on;
use kvcache_e2e::pods::{self, exec, ip_of, name_of};
use kvcache_e2e::reach;
use kvcache_e2e::{Error, walkthrough};

use super::support::*;

/// The tenant namespace of the walkthrough (a Binding on the store), and the monitoring one.
const TENANT: &str = "team-a";
const MONITORING: &str = kvcache_render::install::DEFAULT_METRICS_NAMESPACE;
const PROBER: &str = "operator-prober";

/// Waits until `pod` reads the operator's series from `address`; fails naming what it last saw.
async fn wait_metrics(api: &Api<Pod>, pod: &str, address: &str) -> Result<(), Error> {
    let deadline = Instant::now() + WAIT;
    loop {
        let out = exec(api, pod, None, &["python3", "-c", GET_METRICS, address]).await?;
        if out.success && out.stdout.contains("kvcache_operator_") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Wait {
                what: format!("{pod} reading /metrics at {address}"),
                reason: pods::last_lines(&out.stderr, 3).join(" | "),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn a_tenant_pod_reaches_neither_operator_port_while_the_api_server_and_monitoring_do() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        // Ready: the kubelet's probes of /readyz and /healthz (port 8080, from the Pod's own
        // node) pass under the policy.
        let operators = wait_replicas(&client, 2).await?;
        let addresses: Vec<String> = operators
            .iter()
            .map(|p| ip_of(p).expect("an operator Pod's address").to_owned())
            .collect();
        let service = Api::<Service>::namespaced(client.clone(), NS)
            .get("kvcache-operator")
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .expect("the operator Service's address");

        walkthrough::ensure_namespace(&client, MONITORING).await?;
        let watcher = prober(&client, MONITORING, PROBER).await?;
        let tenant = prober(&client, TENANT, PROBER).await?;
        let monitoring_pods: Api<Pod> = Api::namespaced(client.clone(), MONITORING);
        let tenant_pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);

        // The monitoring namespace reads /metrics from each replica: once it does, the
        // enforcer has seen both new Pods.
        for ip in &addresses {
            wait_metrics(&monitoring_pods, name_of(&watcher), &format!("{ip}:8080")).await?;
        }

        // The tenant's Pod reaches its store's master (its Binding admits it): the probe runs
        // and the network carries it, so what follows is the operator's policy.
        let store: Api<Pod> = Api::namespaced(client.clone(), NS);
        let leader = pods::wait_ready(
            &store,
            &walkthrough::backend_pods("mooncake-dram", "leader"),
            1,
            WAIT,
        )
        .await?;
        let master = format!("{}:50051", ip_of(&leader[0]).expect("the master's address"));
        reach::wait_reach(
            &tenant_pods,
            name_of(&tenant),
            std::slice::from_ref(&master),
            true,
            WAIT,
            "the tenant's Pod reaching its store's master",
        )
        .await?;
        // Neither operator port, on either replica or through the Service: no AdmissionReview
        // of its own making reaches the webhook, and /metrics tells it nothing of the other
        // tenants.
        let mut targets: Vec<String> = addresses
            .iter()
            .flat_map(|ip| [format!("{ip}:9443"), format!("{ip}:8080")])
            .collect();
        targets.extend([format!("{service}:443"), format!("{service}:8080")]);
        let seen = reach::probe(&tenant_pods, name_of(&tenant), &targets).await?;
        let open: Vec<_> = seen.iter().filter(|(_, r)| r.open()).collect();
        assert!(
            open.is_empty(),
            "a Pod of tenant namespace {TENANT} connects to the operator: {open:?} (all: {seen:?})"
        );

        // The API server still calls the webhook: an engine Pod opted in to injection is
        // admitted with the store settings (dry run) ...
        injected_dry_run(&client, TENANT, "engine-behind-policy").await?;
        // ... and its Pod proxy reads each replica's /metrics (the control plane is admitted on
        // the metrics port too).
        for p in &operators {
            assert!(
                scrape(&client, name_of(p))
                    .await?
                    .contains("kvcache_operator_")
            );
        }
        println!(
            "the operator's ports from {TENANT}: {seen:?}; control plane {}",
            control_plane_address()
        );

        for api in [&tenant_pods, &monitoring_pods] {
            api.delete(PROBER, &DeleteParams::default()).await?;
        }
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
