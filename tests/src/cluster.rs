//! A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver (Node,RBAC authorization),
//! kube-controller-manager and kube-scheduler, with generated certificates and a kubeconfig.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::pki::{self, PkiFiles};
use crate::process::{Proc, free_port, reaper, wait_for, wait_tcp};
use crate::{Error, Result, Watched, paths};

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Also run kube-controller-manager and kube-scheduler (Deployments and DaemonSets then
    /// create and place Pods).
    pub controllers: bool,
    /// Start a watchdog that stops everything when this process exits (for harnesses that live
    /// in a `static`). `cargo xtask cluster up` runs without one.
    pub reaper: bool,
    /// The address the API server advertises (the `kubernetes` Service's endpoint) and listens
    /// on besides loopback: the node bridge's host address when real nodes join. `None`:
    /// loopback only.
    pub advertise: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controllers: true,
            reaper: true,
            advertise: None,
        }
    }
}

/// A running control plane. Dropping it stops every process.
pub struct ControlPlane {
    /// Its working directory (certificates, etcd data, logs, kubeconfig).
    pub dir: PathBuf,
    /// A kubeconfig with the admin client certificate (`system:masters`).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    pub pki: PkiFiles,
    /// The API server's audit log (JSON lines): every write by a service account.
    pub audit_log: PathBuf,
    ca: pki::Ca,
    procs: Vec<Proc>,
    reaper: Option<Child>,
}

const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The API server's audit policy, at `Metadata` level: every call of the operator's account
/// (what `tests/tests/rbac_audit.rs` holds its grants against), every write of a role or a role
/// binding (when an uninstall took the operator's rights away) and the writes of the other
/// service accounts.
fn audit_policy() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [\"{}\"]
  - level: Metadata
    resources: [{{group: rbac.authorization.k8s.io, resources: [clusterroles, roles, clusterrolebindings, rolebindings]}}]
    verbs: [create, update, patch, delete]
  - level: Metadata
    userGroups: [\"system:serviceaccounts\"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
",
        crate::audit::OPERATOR_ACCOUNT
    )
}

/// Where `tests/tests/rbac_audit.rs` finds the audit logs of a whole run: `cargo xtask test`
/// sets it to an empty folder and each control plane logs into a folder of its own there.
pub const ENV_AUDIT_DIR: &str = "KVCACHE_AUDIT_DIR";

/// Starts a single-member etcd on loopback with its data in `dir/etcd` (`bin` holds the
/// binary) and waits until it accepts connections; the process and its client port.
pub fn start_etcd(bin: &Path, dir: &Path) -> Result<(Proc, u16)> {
    let client = free_port()?;
    let peer = free_port()?;
    let mut etcd = Command::new(bin.join("etcd"));
    etcd.arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
        .arg("--unsafe-no-fsync")
        .arg("--log-level=warn");
    let mut etcd = Proc::spawn("etcd", etcd, &dir.join("etcd.log"))?;
    wait_tcp(
        &mut etcd,
        SocketAddr::from(([127, 0, 0, 1], client)),
        READY_TIMEOUT,
    )?;
    Ok((etcd, client))
}

/// The API server's command line (audited, serving on `port`, storing in etcd at
/// `etcd_client`) and where its audit log goes.
fn apiserver(
    bin: &Path,
    dir: &Path,
    options: &Options,
    pki: &pki::PkiFiles,
    etcd_client: u16,
    port: u16,
) -> Result<(Command, PathBuf)> {
    // Writes by service accounts are audited (who, from which address): what a Pod of
    // the operator wrote can be told from what its standby did not.
    let policy_file = dir.join("audit-policy.yaml");
    std::fs::write(&policy_file, audit_policy()).map_err(crate::io("writing the audit policy"))?;
    let audit_log = match std::env::var_os(ENV_AUDIT_DIR) {
        Some(runs) => {
            let own = PathBuf::from(runs).join(dir.file_name().unwrap_or_default());
            std::fs::create_dir_all(&own)
                .map_err(crate::io(format!("creating {}", own.display())))?;
            own.join("audit.log")
        }
        None => dir.join("audit.log"),
    };
    let mut api = Command::new(bin.join("kube-apiserver"));
    api.arg(format!("--audit-policy-file={}", policy_file.display()))
        .arg(format!("--audit-log-path={}", audit_log.display()))
        .arg("--audit-log-format=json")
        .arg("--audit-log-maxsize=200")
        // Rotated files are kept: the RBAC audit reads a whole run.
        .arg("--audit-log-maxbackup=50");
    api.arg(format!("--etcd-servers=http://127.0.0.1:{etcd_client}"))
        .arg(match options.advertise {
            Some(_) => "--bind-address=0.0.0.0",
            None => "--bind-address=127.0.0.1",
        })
        .arg(format!(
            "--advertise-address={}",
            options.advertise.as_deref().unwrap_or("127.0.0.1")
        ))
        .arg(format!("--secure-port={port}"))
        .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
        .arg(format!(
            "--tls-private-key-file={}",
            pki.serving_key.display()
        ))
        .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
        // Logs and exec reach the kubelets as the admin (the kubelets trust this CA).
        .arg(format!(
            "--kubelet-client-certificate={}",
            pki.admin_cert.display()
        ))
        .arg(format!("--kubelet-client-key={}", pki.admin_key.display()))
        .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
        .arg(format!(
            "--service-account-key-file={}",
            pki.sa_pub.display()
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            pki.sa_key.display()
        ))
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg("--authorization-mode=Node,RBAC")
        // As on clusters that enable it (OpenShift does): an owner reference that blocks its
        // owner's deletion needs `update` on the owner's `finalizers`, which the operator's
        // ClusterRole grants for the kinds that own what it renders.
        .arg("--enable-admission-plugins=OwnerReferencesPermissionEnforcement")
        .arg("--service-cluster-ip-range=10.96.0.0/16")
        .arg(format!(
            "--cert-dir={}",
            dir.join("apiserver-certs").display()
        ))
        .arg("--enable-priority-and-fairness=false")
        // Webhook Services are dialled at a ready endpoint (the Pod's address, which the
        // host routes to the nodes) rather than at the ClusterIP, which only the nodes'
        // kube-proxy knows.
        .arg("--enable-aggregator-routing=true")
        .arg("--v=1");
    Ok((api, audit_log))
}

impl ControlPlane {
    /// Starts etcd and the control plane in `dir` and waits until the API server is ready.
    /// Must not be called from inside a tokio runtime (it runs its own for the readiness check).
    pub fn start(dir: &Path, options: &Options) -> Result<ControlPlane> {
        let bin = paths::k8s_bin()?;
        std::fs::create_dir_all(dir).map_err(crate::io(format!("creating {}", dir.display())))?;
        let (ca, pki) = pki::control_plane(dir, options.advertise.as_deref())?;
        let mut procs = Vec::new();

        let (etcd, etcd_client) = start_etcd(&bin, dir)?;
        procs.push(etcd);

        let port = free_port()?;
        let server = format!("https://127.0.0.1:{port}");
        let (api, audit_log) = apiserver(&bin, dir, options, &pki, etcd_client, port)?;
        let mut api = Proc::spawn("kube-apiserver", api, &dir.join("kube-apiserver.log"))?;
        wait_tcp(
            &mut api,
            SocketAddr::from(([127, 0, 0, 1], port)),
            READY_TIMEOUT,
        )?;

        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &pki)?;
        wait_ready(&mut api, &kubeconfig)?;
        procs.push(api);

        if options.controllers {
            let mut kcm = controller(&bin, "kube-controller-manager", &kubeconfig, dir)?;
            kcm
                .arg(format!("--service-account-private-key-file={}", pki.sa_key.display()))
                .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
                .arg("--use-service-account-credentials=false")
                // With real nodes the node lifecycle controller lifts the `not-ready` taint a
                // node registers with once its kubelet reports Ready; without nodes (hand-made
                // Node objects that never heartbeat) it would taint them and evict their Pods.
                .arg(if options.advertise.is_some() {
                    "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route"
                } else {
                    "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service-lb-controller,-route"
                });
            procs.push(Proc::spawn(
                "kube-controller-manager",
                kcm,
                &dir.join("kube-controller-manager.log"),
            )?);
            let sched = controller(&bin, "kube-scheduler", &kubeconfig, dir)?;
            procs.push(Proc::spawn(
                "kube-scheduler",
                sched,
                &dir.join("kube-scheduler.log"),
            )?);
        }

        let reaper = if options.reaper {
            let pids: Vec<u32> = procs.iter().map(Proc::pid).collect();
            Some(reaper(&pids)?)
        } else {
            None
        };
        Ok(ControlPlane {
            audit_log,
            dir: dir.to_owned(),
            kubeconfig,
            server,
            pki,
            ca,
            procs,
            reaper,
        })
    }

    /// A kubeconfig for user `name` in group `group` (no rights until RBAC grants some).
    pub fn user_kubeconfig(&self, name: &str, group: &str) -> Result<PathBuf> {
        let (cert, key) = self.ca.client(name, group)?;
        let dir = self.dir.join("users");
        std::fs::create_dir_all(&dir).map_err(crate::io(format!("creating {}", dir.display())))?;
        // `:` separates paths in KUBECONFIG (ServiceAccount user names are full of them).
        let file = name.replace([':', '/'], "_");
        let cert_path = dir.join(format!("{file}.crt"));
        let key_path = dir.join(format!("{file}.key"));
        std::fs::write(&cert_path, cert).map_err(crate::io("writing a user certificate"))?;
        std::fs::write(&key_path, key).map_err(crate::io("writing a user key"))?;
        let files = PkiFiles {
            admin_cert: cert_path,
            admin_key: key_path,
            ..self.pki.clone()
        };
        let path = dir.join(format!("{file}.kubeconfig"));
        write_kubeconfig(&path, &self.server, &files)?;
        Ok(path)
    }

    /// The process ids, in start order (etcd, kube-apiserver, then the controllers).
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Proc::pid).collect()
    }

    /// Whether the controller manager and scheduler are still running (they exit on bad flags).
    pub fn controllers_running(&mut self) -> bool {
        self.procs.iter_mut().skip(2).all(|p| !p.exited())
    }

    /// A client for the admin user, on the caller's runtime.
    pub async fn client(&self) -> Result<Client> {
        client_from(&self.kubeconfig).await
    }

    /// Leaves every process running after this handle is gone; returns their pids (etcd first).
    pub fn detach(mut self) -> Vec<u32> {
        if let Some(mut r) = self.reaper.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
        std::mem::take(&mut self.procs)
            .into_iter()
            .map(Proc::detach)
            .collect()
    }

    /// Stops every process (controllers first, etcd last).
    pub fn stop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            p.stop(Duration::from_secs(5));
        }
        if let Some(mut r) = self.reaper.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A controller process (manager or scheduler) talking to the API server as the admin, serving
/// its own endpoints on a free loopback port.
fn controller(bin: &Path, name: &str, kubeconfig: &Path, dir: &Path) -> Result<Command> {
    let mut cmd = Command::new(bin.join(name));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--authentication-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!(
            "--authorization-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg("--leader-elect=false")
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={}", free_port()?))
        .arg(format!(
            "--cert-dir={}",
            dir.join(format!("{name}-certs")).display()
        ))
        .arg("--v=1");
    Ok(cmd)
}

/// A client built from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    Ok(Client::try_from(config_from(kubeconfig).await?)?)
}

/// The client configuration the kubeconfig at `kubeconfig` gives.
async fn config_from(kubeconfig: &Path) -> Result<Config> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    Ok(Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
}

/// As [`client_from`], with kube's default retry of 429, 503 and 504 answers off, for a caller
/// that must see a refusal: an eviction a disruption budget refuses answers 429, which the
/// default client retries (15 times, backing off) until the budget allows it, so a refused
/// eviction reads as granted once the Pod evicted before came back Ready.
pub async fn client_without_retry(kubeconfig: &Path) -> Result<Client> {
    let mut config = config_from(kubeconfig).await?;
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

fn write_kubeconfig(path: &Path, server: &str, pki: &PkiFiles) -> Result<()> {
    let read = |p: &Path| -> Result<String> {
        let bytes = std::fs::read(p).map_err(crate::io(format!("reading {}", p.display())))?;
        Ok(B64.encode(bytes))
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kvcache-e2e\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: kvcache-e2e\n  context:\n    cluster: kvcache-e2e\n    user: admin\ncurrent-context: kvcache-e2e\n",
        ca = read(&pki.ca_cert)?,
        cert = read(&pki.admin_cert)?,
        key = read(&pki.admin_key)?,
    );
    std::fs::write(path, text).map_err(crate::io(format!("writing {}", path.display())))
}

/// Runs `f` on a private runtime on its own thread (so it works from sync and async callers).
pub fn block_on<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(crate::io("starting a runtime"))?;
        rt.block_on(f)
    })
    .join()
    .unwrap_or_else(|_| Err(Error::Panicked))
}

fn wait_ready(api: &mut Proc, kubeconfig: &Path) -> Result<()> {
    let kubeconfig = kubeconfig.to_owned();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let kc = kubeconfig.clone();
        let ready = block_on(async move {
            let client = client_from(&kc).await?;
            let req = http_get("/readyz")?;
            Ok(client
                .request_text(req)
                .await
                .is_ok_and(|t| t.trim() == "ok"))
        })
        .unwrap_or(false);
        if ready {
            return Ok(());
        }
        wait_for(api, Duration::from_millis(300), || false).or_else(|e| {
            if api.exited() || Instant::now() >= deadline {
                Err(e)
            } else {
                Ok(())
            }
        })?;
    }
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>> {
    http::Request::get(path)
        .body(Vec::new())
        .map_err(|source| Error::Request {
            path: path.to_owned(),
            source,
        })
}

/// Waits on a watch until the object `name` satisfies `ok`; fails naming the object, `what` was
/// awaited, and the last state seen.
pub async fn wait_object<K: Watched>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&K) -> bool,
) -> Result<K> {
    wait_object_shown(api, name, what, within, ok, |last| format!("{last:#?}")).await
}

/// Waits on a watch until the object `name` whose uid is `uid` is gone (deleted, or replaced by
/// one with another uid); fails naming the object and what was awaited.
pub async fn wait_deleted<K: Watched>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    what: &str,
    within: Duration,
) -> Result<()> {
    let outcome = tokio::time::timeout(
        within,
        kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::wait::conditions::is_deleted(uid),
        ),
    )
    .await;
    let reason = match outcome {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "still there".to_owned(),
    };
    Err(Error::Wait {
        what: format!("{name}: {what} (within {within:?})"),
        reason,
    })
}

/// As [`wait_object`], `show` writing the last state seen when the wait runs out.
pub(crate) async fn wait_object_shown<K: Watched>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&K) -> bool,
    show: impl Fn(Option<&K>) -> String,
) -> Result<K> {
    let cond = |o: Option<&K>| o.is_some_and(&ok);
    let outcome = tokio::time::timeout(
        within,
        kube::runtime::wait::await_condition(api.clone(), name, cond),
    )
    .await;
    if let Ok(Ok(Some(o))) = outcome {
        return Ok(o);
    }
    let last = api.get_opt(name).await.ok().flatten();
    Err(Error::Wait {
        what: format!("{name}: {what} (within {within:?})"),
        reason: format!("{outcome:?}; last seen: {}", show(last.as_ref())),
    })
}

/// Applies the CRDs in `dir` (every `*.yaml`) with server-side apply and waits until each is
/// Established. Returns their names.
pub async fn install_crds(client: &Client, dir: &Path) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(crate::io(format!("reading {}", dir.display())))?
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).map_err(crate::io(format!("reading {}", f.display())))?;
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).map_err(|e| Error::Invalid {
                path: f.display().to_string(),
                what: "CustomResourceDefinition",
                reason: e.to_string(),
            })?;
        crds.push(crd);
    }
    apply_crds(client, &crds).await
}

/// Applies CRD objects and waits until each is Established.
pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("kvcache-e2e").force(),
            &Patch::Apply(crd),
        )
        .await?;
        names.push(name);
    }
    for name in &names {
        let cond = kube::runtime::conditions::is_crd_established();
        kube::runtime::wait::await_condition(api.clone(), name, cond)
            .await
            .map_err(|e| Error::Wait {
                what: format!("CRD {name} to be Established"),
                reason: e.to_string(),
            })?;
    }
    Ok(names)
}

/// A control plane shared by every test of one test binary, with the CRDs from `deploy/crds/`
/// installed. Each test makes its own client and its own namespace.
pub struct TestCluster {
    pub control_plane: ControlPlane,
}

static SHARED: OnceLock<std::result::Result<TestCluster, String>> = OnceLock::new();

/// The repository's `deploy/crds/`.
pub fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

/// The shared cluster of this test binary, started on first use.
pub fn shared() -> &'static TestCluster {
    let result = SHARED.get_or_init(|| {
        let start = || -> Result<TestCluster> {
            let dir = paths::scratch("cluster")?;
            let control_plane = ControlPlane::start(&dir, &Options::default())?;
            let kubeconfig = control_plane.kubeconfig.clone();
            block_on(async move {
                let client = client_from(&kubeconfig).await?;
                install_crds(&client, &crds_dir()).await
            })?;
            Ok(TestCluster { control_plane })
        };
        start().map_err(|e| e.to_string())
    });
    match result {
        Ok(cluster) => cluster,
        Err(e) => panic!("the end-to-end control plane could not start: {e}"),
    }
}

impl TestCluster {
    /// A client on the caller's runtime.
    pub async fn client(&self) -> Result<Client> {
        self.control_plane.client().await
    }

    /// A fresh namespace named after `prefix`.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<String> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed));
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(name)
    }
}
