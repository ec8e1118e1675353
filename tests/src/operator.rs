//! The operator binary (`kvcache-operator run`) as a process against the harness's control
//! plane: on this machine, reading loopback stores through `--store-address-override`, or as if
//! in a Pod on the nodes, reading each store through its leader Service ([`Operator::builder`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::nodes::Nodes;
use crate::process::{Proc, free_port, wait_for};
use crate::store::http_get;
use crate::{Result, paths};

/// The label a test puts on the backends its operator reconciles (value: the operator's
/// namespace).
pub const SELECTOR_LABEL: &str = "kvcache-e2e/operator";

/// The operator binary run by the harness, on the host or in a node's network namespace;
/// dropping it kills it.
pub struct Operator {
    pub proc: Proc,
    /// The address its `/metrics` and health port listens on.
    pub host: String,
    /// Its `/metrics` and health port.
    pub metrics_port: u16,
    /// `https://HOST:PORT` of its admission webhook, when it serves one.
    pub webhook: Option<String>,
    args: Vec<String>,
    launcher: Launch,
    kubeconfig: PathBuf,
    log: PathBuf,
}

/// How to start an operator: [`Operator::builder`], then [`OperatorBuilder::start`].
#[must_use = "an operator starts only with `start`"]
pub struct OperatorBuilder<'a> {
    kubeconfig: &'a Path,
    namespace: &'a str,
    scoped: bool,
    overrides: &'a [String],
    extra: &'a [String],
    nodes: Option<&'a Nodes>,
    account: bool,
}

impl<'a> OperatorBuilder<'a> {
    /// With `true`, it reconciles only the backends labelled for its namespace
    /// ([`SELECTOR_LABEL`]), so that several operators share one control plane; by default it
    /// reconciles every backend and the pools and Bindings (one such operator per control plane).
    pub fn scoped(mut self, scoped: bool) -> Self {
        self.scoped = scoped;
        self
    }

    /// Reads these stores at these addresses (`BACKEND=HOST:PORT`, each a
    /// `--store-address-override`) instead of through their leader Service.
    pub fn overrides(mut self, overrides: &'a [String]) -> Self {
        self.overrides = overrides;
        self
    }

    /// More arguments of `kvcache-operator run` (the webhook's, the leader election's), after
    /// the harness's own. A `--webhook-addr=HOST:PORT` among them is where [`Operator::webhook`]
    /// points.
    pub fn extra(mut self, extra: &'a [String]) -> Self {
        self.extra = extra;
        self
    }

    /// Runs it as if in a Pod on the cluster's nodes: in the first node's network namespace,
    /// where Services and Pod addresses are reached as from a Pod, with a resolver configuration
    /// naming the cluster DNS (its own mount namespace), so it reads each store through its
    /// leader Service's DNS name, and as the installation's account with its rights alone
    /// (its ServiceAccount, roles and bindings applied, a token issued). Its metrics port and
    /// its webhook listen on that node's address. The builder's kubeconfig must then be [`Nodes::kubeconfig`], the one that
    /// reaches the API server from inside the nodes' network.
    pub fn on_nodes(mut self, nodes: &'a Nodes) -> Self {
        self.nodes = Some(nodes);
        self
    }

    /// Runs it under the installation's account with its rights alone (its ServiceAccount,
    /// roles and bindings applied, a token issued), as a Pod of the installation runs; on the
    /// nodes it always does. The namespace must be the installation's, `gpustack-system`, for
    /// `tests/tests/rbac_audit.rs` to count its calls.
    pub fn as_installation_account(mut self) -> Self {
        self.account = true;
        self
    }

    /// Starts it (its log, and on the nodes its resolver configuration, in `dir`) and waits for
    /// `/readyz`.
    pub fn start(self, dir: &Path) -> Result<Operator> {
        let namespace = self.namespace;
        let (host, metrics_port, launcher, mut args, mut webhook) = match self.nodes {
            None => {
                let metrics_port = free_port()?;
                let args = vec![
                    "run".to_owned(),
                    format!("--namespace={namespace}"),
                    format!("--metrics-addr=127.0.0.1:{metrics_port}"),
                ];
                (
                    "127.0.0.1".to_owned(),
                    metrics_port,
                    Launch::Host,
                    args,
                    None,
                )
            }
            Some(nodes) => {
                let setup = |message: String| crate::Error::NodeSetup {
                    step: "starting the operator on the nodes".into(),
                    message,
                };
                if nodes.kubeconfig != self.kubeconfig {
                    return Err(setup(format!(
                        "{} does not reach the API server from the nodes' network; use the nodes' kubeconfig {}",
                        self.kubeconfig.display(),
                        nodes.kubeconfig.display()
                    )));
                }
                let node = nodes
                    .nodes
                    .first()
                    .ok_or_else(|| setup("no nodes".into()))?;
                let resolv = dir.join("operator-resolv.conf");
                std::fs::write(
                    &resolv,
                    format!(
                        "nameserver {}\nsearch {namespace}.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
                        nodes.dns
                    ),
                )
                .map_err(crate::io("writing the operator's resolv.conf"))?;
                let metrics_port = free_port()?;
                let webhook_port = free_port()?;
                // The webhook listens on the node's address, which the API server reaches over
                // the bridge; the serving certificate names that address.
                let args = vec![
                    "run".to_owned(),
                    format!("--namespace={namespace}"),
                    format!("--metrics-addr={}:{metrics_port}", node.ip),
                    format!("--webhook-addr={}:{webhook_port}", node.ip),
                    format!("--webhook-name={}", node.ip),
                    // Not in a Pod: the stores' admin port admits this node's address, as a
                    // user running the operator on a host would set it (docs/isolation.md).
                    format!("--store-admin-from={}/32", node.ip),
                ];
                let launcher = Launch::OnNode {
                    netns: node.name.clone(),
                    resolv,
                };
                let webhook = Some(format!("https://{}:{webhook_port}", node.ip));
                (node.ip.clone(), metrics_port, launcher, args, webhook)
            }
        };
        if self.scoped {
            args.push(format!("--backend-selector={SELECTOR_LABEL}={namespace}"));
        }
        args.extend(
            self.overrides
                .iter()
                .map(|o| format!("--store-address-override={o}")),
        );
        args.extend(self.extra.iter().cloned());
        if let Some(addr) = self
            .extra
            .iter()
            .find_map(|a| a.strip_prefix("--webhook-addr="))
        {
            webhook = Some(format!("https://{addr}"));
        }
        let log = dir.join(format!("operator-{metrics_port}.log"));
        let kubeconfig = if self.account || self.nodes.is_some() {
            account_kubeconfig(self.kubeconfig, namespace, dir)?
        } else {
            self.kubeconfig.to_owned()
        };
        let proc = spawn(&launcher, &kubeconfig, &args, &log)?;
        let mut op = Operator {
            proc,
            host,
            metrics_port,
            webhook,
            args,
            launcher,
            kubeconfig,
            log,
        };
        op.wait_ready()?;
        Ok(op)
    }
}

impl Operator {
    /// An operator (`kvcache-operator run`) in `namespace` against the API server that
    /// `kubeconfig` reaches: on this machine, every controller, reading stores through their
    /// leader Services, until the builder says otherwise.
    pub fn builder<'a>(kubeconfig: &'a Path, namespace: &'a str) -> OperatorBuilder<'a> {
        OperatorBuilder {
            kubeconfig,
            namespace,
            scoped: false,
            overrides: &[],
            extra: &[],
            nodes: None,
            account: false,
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let url = format!("http://{}:{}/readyz", self.host, self.metrics_port);
        wait_for(&mut self.proc, Duration::from_secs(60), || {
            http_get(&url).is_ok()
        })
    }

    /// Stops the process (SIGTERM, then SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        self.proc.stop(grace);
    }

    /// Starts it again with the same arguments.
    pub fn restart(&mut self) -> Result<()> {
        self.proc.stop(Duration::from_secs(5));
        self.proc = spawn(&self.launcher, &self.kubeconfig, &self.args, &self.log)?;
        self.wait_ready()
    }

    /// What it has logged so far (empty when the log cannot be read yet).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The operator's `/metrics` text.
    pub fn metrics(&self) -> Result<String> {
        http_get(&self.metrics_url())
    }

    fn metrics_url(&self) -> String {
        format!("http://{}:{}/metrics", self.host, self.metrics_port)
    }

    /// Waits until the operator's `/metrics` text satisfies `ok`, and returns that text. A
    /// scrape that fails is read again, never taken as a verdict. A wait that runs out, or an
    /// operator that exits first, fails naming `what` was awaited and the last scrape (its
    /// samples, or why it failed).
    ///
    /// What the operator counts at the end of a reconcile or a request moves after its effect
    /// (a status written, an answer sent) can be seen: wait for it, do not read it once.
    pub fn wait_metrics(
        &mut self,
        what: &str,
        within: Duration,
        mut ok: impl FnMut(&str) -> bool,
    ) -> Result<String> {
        let url = self.metrics_url();
        let deadline = Instant::now() + within;
        loop {
            let last = http_get(&url);
            if let Ok(text) = &last
                && ok(text)
            {
                return last;
            }
            let exited = self.proc.exited();
            if exited || Instant::now() >= deadline {
                let scrape = match last {
                    Ok(text) => format!(
                        "its last scrape did not show it:\n{}",
                        text.lines()
                            .filter(|l| !l.starts_with('#') && !l.contains("_bucket{"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    ),
                    Err(e) => format!("its last scrape failed: {e}"),
                };
                let ended = if exited {
                    format!(
                        "the operator exited (last log lines:\n{}); ",
                        self.proc.log_tail(15)
                    )
                } else {
                    String::new()
                };
                return Err(crate::Error::Wait {
                    what: format!("{what} in {url} (within {within:?})"),
                    reason: format!("{ended}{scrape}"),
                });
            }
            // The exposition has no watch: scrape again shortly.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Where the process runs.
#[derive(Clone, Debug)]
enum Launch {
    /// On the machine itself.
    Host,
    /// In a node's network namespace, with its own resolver configuration.
    OnNode { netns: String, resolv: PathBuf },
}

/// The kinds of the installation that give the operator its account and rights.
const ACCOUNT_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// Applies the installation's account and RBAC for `namespace` (`kvcache_render::install`)
/// with the admin `kubeconfig`, and writes into `dir` a kubeconfig that reaches the API server
/// the same way with a token of that account: the operator on the nodes then holds exactly the
/// rights a Pod of the installation holds, so a call they do not cover is refused here as on a
/// cluster, and the audit log shows which grant each call used (`crate::audit`).
fn account_kubeconfig(kubeconfig: &Path, namespace: &str, dir: &Path) -> Result<PathBuf> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::{Api, DynamicObject, PostParams};
    let invalid = |reason: String| crate::Error::Invalid {
        path: "kvcache_render::install::operator".into(),
        what: "installation",
        reason,
    };
    let mut objects = Vec::new();
    let mut account = None;
    for doc in kvcache_render::install::operator(namespace, "unused")
        .map_err(|e| invalid(e.to_string()))?
    {
        if !ACCOUNT_KINDS.contains(&doc["kind"].as_str().unwrap_or_default()) {
            continue;
        }
        if doc["kind"] == "ServiceAccount" {
            account = doc["metadata"]["name"].as_str().map(str::to_owned);
        }
        let v = serde_json::to_value(&doc).map_err(|e| invalid(e.to_string()))?;
        objects
            .push(serde_json::from_value::<DynamicObject>(v).map_err(|e| invalid(e.to_string()))?);
    }
    let account = account.ok_or_else(|| invalid("no ServiceAccount".into()))?;
    let (admin, ns, name) = (kubeconfig.to_owned(), namespace.to_owned(), account.clone());
    let token = crate::cluster::block_on(async move {
        let client = crate::cluster::client_from(&admin).await?;
        crate::walkthrough::apply(&client, &objects).await?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                // Longer than any run; the API server may shorten it (then the operator's
                // client rereads the file, which does not change: a run that long fails).
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(client, &ns)
            .create_token_request(&name, &PostParams::default(), &request)
            .await?;
        issued
            .status
            .map(|s| s.token)
            .ok_or_else(|| crate::Error::Invalid {
                path: format!("serviceaccounts/{ns}/{name}/token"),
                what: "TokenRequest",
                reason: "no token in its status".into(),
            })
    })?;
    let text = std::fs::read_to_string(kubeconfig)
        .map_err(crate::io(format!("reading {}", kubeconfig.display())))?;
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| crate::Error::Invalid {
            path: kubeconfig.display().to_string(),
            what: "kubeconfig",
            reason: e.to_string(),
        })?;
    let users = config["users"]
        .as_sequence_mut()
        .ok_or_else(|| crate::Error::Invalid {
            path: kubeconfig.display().to_string(),
            what: "kubeconfig",
            reason: "no users".into(),
        })?;
    for user in users {
        user["user"] =
            serde_yaml::to_value(std::collections::BTreeMap::from([("token", token.clone())]))
                .map_err(|e| invalid(e.to_string()))?;
    }
    let path = dir.join(format!("operator-{account}.kubeconfig"));
    let text = serde_yaml::to_string(&config).map_err(|e| invalid(e.to_string()))?;
    std::fs::write(&path, text).map_err(crate::io(format!("writing {}", path.display())))?;
    Ok(path)
}

fn spawn(launch: &Launch, kubeconfig: &Path, args: &[String], log: &Path) -> Result<Proc> {
    let bin = paths::operator_bin()?;
    let mut cmd = match launch {
        Launch::Host => Command::new(bin),
        Launch::OnNode { netns, resolv } => {
            // unshare and nsenter exec in place: the process held is the operator itself.
            let mut c = Command::new("unshare");
            c.args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg(r#"mount --bind "$1" /etc/resolv.conf && ns="$2" && shift 2 && exec nsenter --net="/var/run/netns/$ns" "$@""#)
                .arg("sh")
                .arg(resolv)
                .arg(netns)
                .arg(&bin);
            c
        }
    };
    cmd.args(args).env("KUBECONFIG", kubeconfig).env(
        "RUST_LOG",
        std::env::var("KVCACHE_E2E_OPERATOR_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
    );
    let proc = Proc::spawn("kvcache-operator", cmd, log)?;
    // An operator kept in a `static` is never dropped: a watchdog stops it once this test
    // process is gone (one was seen still running, without its nodes, after its test binary).
    crate::process::reaper(&[proc.pid()])?;
    Ok(proc)
}

/// Waits until the operator wrote its CA into every webhook of both configurations that
/// [`register_webhooks`] registered: until then the API server cannot call them, and a
/// `Fail` webhook refuses the writes it judges.
pub async fn wait_webhooks_trusted(client: &kube::Client, namespace: &str) -> Result<()> {
    /// Whether a webhook's client configuration carries a CA.
    fn trusted(c: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig) -> bool {
        c.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty())
    }
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use kube::api::Api;
    let (mutating, _) = kvcache_render::install::webhooks(namespace);
    let name = mutating.metadata.name.unwrap_or_default();
    let within = Duration::from_secs(120);
    crate::cluster::wait_object(
        &Api::<MutatingWebhookConfiguration>::all(client.clone()),
        &name,
        "the operator's CA in every mutating webhook",
        within,
        |c| {
            c.webhooks
                .iter()
                .flatten()
                .all(|w| trusted(&w.client_config))
        },
    )
    .await?;
    crate::cluster::wait_object(
        &Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        &name,
        "the operator's CA in every validating webhook",
        within,
        |c| {
            c.webhooks
                .iter()
                .flatten()
                .all(|w| trusted(&w.client_config))
        },
    )
    .await?;
    Ok(())
}

/// Registers the installation's webhook configurations (`kvcache-render::install::webhooks`)
/// with `base` (`https://HOST:PORT`, the operator's [`Operator::webhook`]) as their address
/// instead of the Service; without `our_kinds`, only the Pod webhooks (injection and freeze).
/// The operator writes their `caBundle`.
pub async fn register_webhooks(
    client: &kube::Client,
    namespace: &str,
    base: &str,
    our_kinds: bool,
) -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use kube::api::{Api, Patch, PatchParams};
    let (mut mutating, mut validating) = kvcache_render::install::webhooks(namespace);
    let to_url = |c: &mut k8s_openapi::api::admissionregistration::v1::WebhookClientConfig| {
        let path = c.service.take().and_then(|s| s.path).unwrap_or_default();
        c.url = Some(format!("{base}{path}"));
    };
    for w in mutating.webhooks.iter_mut().flatten() {
        to_url(&mut w.client_config);
    }
    let hooks = validating.webhooks.get_or_insert_with(Vec::new);
    if !our_kinds {
        hooks.retain(|w| w.name != "validate.kvcache.gpustack.ai");
    }
    for w in hooks.iter_mut() {
        to_url(&mut w.client_config);
    }
    let pp = PatchParams::apply("kvcache-e2e").force();
    let name = mutating.metadata.name.clone().unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&mutating))
        .await?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&validating))
        .await?;
    Ok(())
}
