//! The operator binary (`kvcache-operator run`) as a process against the harness's control
//! plane, reading stores on loopback through `--store-address-override` until real nodes run
//! the store Pods.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Proc, free_port, wait_for};
use crate::store::http_get;
use crate::{Result, paths};

/// The label a test puts on the backends its operator reconciles (value: the operator's
/// namespace).
pub const SELECTOR_LABEL: &str = "kvcache-e2e/operator";

/// A running operator.
pub struct Operator {
    /// The process.
    pub proc: Proc,
    /// Its `/metrics` and health port on 127.0.0.1.
    pub metrics_port: u16,
    args: Vec<String>,
    kubeconfig: PathBuf,
    log: PathBuf,
}

impl Operator {
    /// Starts `kvcache-operator run` in `namespace` with the given store overrides
    /// (`BACKEND=HOST:PORT`), reconciling only the backends labelled for `namespace`
    /// ([`SELECTOR_LABEL`]), and waits for `/readyz`.
    pub fn start(
        kubeconfig: &Path,
        namespace: &str,
        overrides: &[String],
        dir: &Path,
    ) -> Result<Operator> {
        Self::start_with(kubeconfig, namespace, true, overrides, dir)
    }

    /// Like [`Operator::start`], reconciling every backend and the pools and Bindings (one such
    /// operator per control plane).
    pub fn start_unscoped(
        kubeconfig: &Path,
        namespace: &str,
        overrides: &[String],
        dir: &Path,
    ) -> Result<Operator> {
        Self::start_with(kubeconfig, namespace, false, overrides, dir)
    }

    fn start_with(
        kubeconfig: &Path,
        namespace: &str,
        scoped: bool,
        overrides: &[String],
        dir: &Path,
    ) -> Result<Operator> {
        let metrics_port = free_port()?;
        // Several operators share the test binary's cluster: each reconciles only the backends
        // labelled for its namespace.
        let mut args = vec![
            "run".to_owned(),
            format!("--namespace={namespace}"),
            format!("--metrics-addr=127.0.0.1:{metrics_port}"),
        ];
        if scoped {
            args.push(format!("--backend-selector={SELECTOR_LABEL}={namespace}"));
        }
        args.extend(
            overrides
                .iter()
                .map(|o| format!("--store-address-override={o}")),
        );
        let log = dir.join(format!("operator-{metrics_port}.log"));
        let proc = spawn(kubeconfig, &args, &log)?;
        let mut op = Operator {
            proc,
            metrics_port,
            args,
            kubeconfig: kubeconfig.to_owned(),
            log,
        };
        op.wait_ready()?;
        Ok(op)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let url = format!("http://127.0.0.1:{}/readyz", self.metrics_port);
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
        self.proc = spawn(&self.kubeconfig, &self.args, &self.log)?;
        self.wait_ready()
    }

    /// The operator's `/metrics` text.
    pub fn metrics(&self) -> Result<String> {
        http_get(&format!("http://127.0.0.1:{}/metrics", self.metrics_port))
    }
}

fn spawn(kubeconfig: &Path, args: &[String], log: &Path) -> Result<Proc> {
    let mut cmd = Command::new(paths::operator_bin()?);
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn");
    Proc::spawn("kvcache-operator", cmd, log)
}
