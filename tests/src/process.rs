//! Child processes that never outlive the harness.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{Error, Result};

/// A free TCP port on 127.0.0.1 (taken by binding port 0 and releasing it).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(crate::io("binding a loopback port"))?;
    Ok(l.local_addr()
        .map_err(crate::io("reading a loopback port"))?
        .port())
}

/// A running process with its log file. Dropping it kills the process.
#[derive(Debug)]
pub struct Proc {
    /// A short name for messages.
    pub name: String,
    /// Where stdout and stderr go.
    pub log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(crate::io(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(crate::io(format!("opening {}", log.display())))?;
        // Its own process group: a Ctrl-C at the terminal reaches the harness, which stops it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                what: name.to_owned(),
                source,
            })?;
        Ok(Proc {
            name: name.to_owned(),
            log: log.to_owned(),
            child: Some(child),
        })
    }

    /// The OS process id; 0 once the process was stopped, killed or detached.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether the process has exited (reaped without waiting; true once it was stopped,
    /// killed or detached).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Whether the process has exited, through a shared reference (for searches).
    pub fn exited_now(&self) -> bool {
        !alive(self.pid())
    }

    /// Sends a signal (SIGTERM for a graceful stop, SIGKILL for a crash).
    pub fn signal(&self, signal: Signal) {
        send(self.pid(), signal);
    }

    /// Sends SIGTERM and waits up to `grace` for the exit, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        send(child.id(), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_group(child.id());
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Lets the process run on after this handle is gone (for `cargo xtask cluster up`); returns
    /// its pid.
    pub fn detach(mut self) -> u32 {
        let pid = self.pid();
        self.child = None;
        pid
    }

    /// SIGKILL the process and everything it started (its process group), and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until the log holds a line containing `needle`; fails naming the line awaited and
    /// the log's tail if the process exits or `timeout` passes first.
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let log = self.log.clone();
        let seen = || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.lines().any(|l| l.contains(needle)))
        };
        wait_for(self, timeout, seen).map_err(|_| Error::NotReady {
            what: format!(
                "the log line {needle:?} from {} (last log lines:\n{})",
                self.name,
                self.log_tail(15)
            ),
            seconds: timeout.as_secs(),
            log: self.log.display().to_string(),
        })
    }

    /// Waits until the process exits; fails naming it if it still runs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.exited() {
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    what: format!("{} to exit", self.name),
                    seconds: timeout.as_secs(),
                    log: self.log.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `signal` to one process (a pid that no longer fits or exists is ignored).
fn send(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// SIGKILL a whole process group (every harness process leads its own).
fn kill_group(pgid: u32) {
    if let Ok(p) = i32::try_from(pgid) {
        let _ = nix::sys::signal::killpg(Pid::from_raw(p), Signal::SIGKILL);
    }
}

/// A watchdog process that kills `pids` once this test process is gone, so that a harness kept
/// in a `static` (never dropped) still leaves nothing behind.
pub fn reaper(pids: &[u32]) -> Result<Child> {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null; do sleep 0.5; done; kill -TERM {list} 2>/dev/null; sleep 2; kill -s KILL -- {groups} 2>/dev/null; kill -s KILL {list} 2>/dev/null; exit 0",
        parent = std::process::id(),
        list = list.join(" "),
        groups = list
            .iter()
            .map(|p| format!("-{p}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn().map_err(|source| Error::Spawn {
        what: "the reaper".into(),
        source,
    })
}

/// Whether a process with this pid is alive.
pub fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| kill(Pid::from_raw(p), None).is_ok())
}

/// Stops detached processes by pid: SIGTERM, up to `grace` to exit, then SIGKILL.
pub fn stop_pids(pids: &[u32], grace: Duration) {
    let signal_all = |signal: Signal| {
        for pid in pids {
            send(*pid, signal);
        }
    };
    signal_all(Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && pids.iter().any(|p| alive(*p)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal_all(Signal::SIGKILL);
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_tcp(proc: &mut Proc, addr: SocketAddr, timeout: Duration) -> Result<()> {
    wait_for(proc, timeout, || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    })
}

/// Polls `ready` every 50 ms until it holds, the process exits, or `timeout` passes.
pub fn wait_for(proc: &mut Proc, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        if proc.exited() || Instant::now() >= deadline {
            return Err(Error::NotReady {
                what: format!("{} (last log lines:\n{})", proc.name, proc.log_tail(15)),
                seconds: timeout.as_secs(),
                log: proc.log.display().to_string(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process's resident memory (`VmRSS` of `/proc/<pid>/status`) in KiB; `None` when it is gone
/// or the kernel reports none (a kernel thread).
pub fn resident_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}
