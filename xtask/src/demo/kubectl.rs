//! How the demo talks to its cluster: `kubectl` from the same Kubernetes module, echoed as a
//! user would see it, quiet, or polled until an answer holds; and the timed steps.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::setup;

pub(super) const NS: &str = "gpustack-system";

/// The operator's Pods, by label.
pub(super) const OPERATOR_PODS: &str = "app.kubernetes.io/name=kvcache-operator";

pub(super) struct Demo {
    pub(super) kubeconfig: PathBuf,
    pub(super) steps: Vec<(String, Duration)>,
}

impl Demo {
    fn kubectl(&self) -> Command {
        let mut c = Command::new(setup::k8s_bin_dir().join("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// Runs kubectl, echoing the command and its output as a user would see them.
    pub(super) fn show(&self, args: &[&str]) -> anyhow::Result<String> {
        println!("$ kubectl {}", args.join(" "));
        let out = self
            .kubectl()
            .args(args)
            .output()
            .context("running kubectl")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(text)
    }

    /// Runs kubectl quietly (waits); fails with what it printed.
    pub(super) fn quiet(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Polls `kubectl get ... -o jsonpath=...` until `ok` holds; fails naming what it waited for.
    pub(super) fn wait(
        &self,
        what: &str,
        args: &[&str],
        within: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + within;
        let mut last = String::new();
        loop {
            if let Ok(out) = self.quiet(args) {
                if ok(out.trim()) {
                    return Ok(out);
                }
                last = out;
            }
            if Instant::now() > deadline {
                bail!(
                    "waited {within:?} for {what} (kubectl {}); last answer: {last:?}",
                    args.join(" ")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until the condition `kind` of `object` (`kind/name`, in `namespace`) is True.
    pub(super) fn wait_condition(
        &self,
        namespace: &str,
        object: &str,
        kind: &str,
        why: &str,
        within: Duration,
    ) -> anyhow::Result<String> {
        let path = format!("jsonpath={{.status.conditions[?(@.type==\"{kind}\")].status}}");
        self.wait(
            &format!("{kind}=True on {object} ({why})"),
            &["-n", namespace, "get", object, "-o", &path],
            within,
            |s| s == "True",
        )
    }

    pub(super) fn step(
        &mut self,
        title: &str,
        f: impl FnOnce(&mut Demo) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        println!();
        println!("==> {title}");
        let t = Instant::now();
        f(self)?;
        let took = t.elapsed();
        println!("--- {title}: {:.1}s", took.as_secs_f64());
        self.steps.push((title.to_owned(), took));
        Ok(())
    }
}

/// A step's manifest, `name` in the walkthrough's folder, as kubectl takes it.
pub(super) fn file(files: &Path, name: &str) -> String {
    files.join(name).display().to_string()
}
