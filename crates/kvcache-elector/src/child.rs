//! The wrapped store process.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A running store process. Dropping it kills the process.
pub struct StoreProcess {
    child: Child,
    program: String,
}

impl StoreProcess {
    /// Starts `argv` with `env` added; its output goes to the elector's own.
    pub fn start(argv: &[String], env: &[(String, String)]) -> std::io::Result<StoreProcess> {
        let (program, args) = argv.split_first().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command after --")
        })?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        Ok(StoreProcess {
            child,
            program: program.clone(),
        })
    }

    /// The program name, for logs.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// The OS process id, for logs; `None` once the process has been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, at once: used when leadership is lost, so two masters never serve.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
