//! The cluster the operator benches share: two real nodes, the CRDs, the store namespace and
//! one operator process as from a Pod.

use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::paths;

/// A bench's cluster: two real nodes with the CRDs, the store namespace and one operator (as
/// from a Pod). The operator stops first when it is dropped, then the nodes.
pub struct WithOperator {
    /// The operator process (its `Drop` stops it; `bench planned-changes` restarts it).
    pub(crate) operator: kvcache_e2e::operator::Operator,
    /// The nodes and their control plane.
    pub nodes: kvcache_e2e::nodes::NodeCluster,
}

/// Starts [`WithOperator`] in the scratch folder `name`,
/// the operator's store namespace `namespace`.
pub fn with_operator(name: &str, namespace: &str) -> anyhow::Result<WithOperator> {
    start(name, namespace, false)
}

/// As [`with_operator`], the nodes enforcing NetworkPolicy (the harness's kube-router
/// firewall).
pub fn with_operator_enforced(name: &str, namespace: &str) -> anyhow::Result<WithOperator> {
    start(name, namespace, true)
}

fn start(name: &str, namespace: &str, enforce: bool) -> anyhow::Result<WithOperator> {
    use kvcache_e2e::{cluster, images, walkthrough};
    let dir = paths::scratch(name)?;
    let mut nodes = kvcache_e2e::nodes::NodeCluster::start(&dir, 2, images::NODE_DEFAULT)?;
    if enforce {
        nodes.nodes.enforce_network_policy()?;
    }
    let kc = nodes.control_plane.kubeconfig.clone();
    let ns = namespace.to_owned();
    block_on(async move {
        let client = client_from(&kc).await?;
        cluster::install_crds(&client, &cluster::crds_dir()).await?;
        walkthrough::ensure_namespace(&client, &ns).await
    })?;
    let operator = kvcache_e2e::operator::Operator::builder(&nodes.nodes.kubeconfig, namespace)
        .on_nodes(&nodes.nodes)
        .start(&dir)?;
    Ok(WithOperator { operator, nodes })
}
