//! A store under our elector on loopback: N leader electors each wrapping a real
//! `mooncake_master` on its own ports, and members in `member` mode following the Lease. Shared by
//! the end-to-end tests and `cargo xtask bench failover`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::{Proc, free_port};
use crate::store::{http_get, loopback_env, metric_value};
use crate::{Error, Result, paths};

/// Lease timing handed to every elector.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    /// `--lease-duration`.
    pub duration: Duration,
    /// `--renew-deadline`.
    pub renew_deadline: Duration,
    /// `--retry-period`.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            duration: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            retry_period: Duration::from_millis(500),
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Where one leader slot's master and elector listen: a loopback address of its own (as each
/// leader Pod has its own IP) and three ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotAddress {
    /// `127.0.0.<n>`.
    pub host: String,
    /// The master's RPC port.
    pub rpc_port: u16,
    /// The master's admin port.
    pub metrics_port: u16,
    /// The elector's readiness port (on 127.0.0.1).
    pub ready_port: u16,
}

/// One leader elector and the master it may run.
pub struct LeaderSlot {
    pub proc: Proc,
    /// The elector's `--identity`, written as the Lease's holder while it leads; also its log's
    /// name.
    pub identity: String,
    /// The master's loopback address.
    pub host: String,
    /// The master's RPC port (published on the Lease as `127.0.0.1:<port>`).
    pub rpc_port: u16,
    /// The master's admin port.
    pub metrics_port: u16,
    /// The elector's readiness port.
    pub ready_port: u16,
}

impl LeaderSlot {
    /// Whether this elector answers ready (it leads and its master serves).
    pub fn ready(&self) -> bool {
        http_get(&format!("http://127.0.0.1:{}/readyz", self.ready_port)).is_ok()
    }

    /// Whether a master answers as serving on this slot's admin port.
    pub fn master_serving(&self) -> bool {
        http_get(&format!(
            "http://{}:{}/health",
            self.host, self.metrics_port
        ))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|h| h["service_ready"] == true)
    }

    /// `master_total_capacity_bytes` of this slot's master, if it answers.
    pub fn capacity(&self) -> Option<u64> {
        let text = http_get(&format!(
            "http://{}:{}/metrics",
            self.host, self.metrics_port
        ))
        .ok()?;
        metric_value(&text, "master_total_capacity_bytes").map(|v| v as u64)
    }

    /// The master's RPC address, `host:rpc_port`: what members and clients dial.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.rpc_port)
    }

    /// Where it listens, to restart it in the same place.
    pub fn slot_address(&self) -> SlotAddress {
        SlotAddress {
            host: self.host.clone(),
            rpc_port: self.rpc_port,
            metrics_port: self.metrics_port,
            ready_port: self.ready_port,
        }
    }
}

/// The failover rig: leader electors, member electors and the Lease timing they share.
pub struct Rig {
    /// Leader electors, by index.
    pub leaders: Vec<Option<LeaderSlot>>,
    /// Member electors.
    pub members: Vec<Proc>,
    /// Segment per member.
    pub segment_bytes: u64,
    /// The timing in force.
    pub timing: LeaseTiming,
    hosts: AtomicUsize,
    dir: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    lease: String,
}

impl Rig {
    /// Starts `leaders` electors and `members` member electors against the Lease `lease` in
    /// `namespace`.
    pub fn start(
        kubeconfig: &Path,
        namespace: &str,
        lease: &str,
        leaders: usize,
        members: usize,
        segment_bytes: u64,
        timing: LeaseTiming,
    ) -> Result<Rig> {
        let dir = paths::scratch("failover")?;
        let mut rig = Rig {
            leaders: Vec::new(),
            members: Vec::new(),
            segment_bytes,
            timing,
            hosts: AtomicUsize::new(0),
            dir,
            kubeconfig: kubeconfig.to_owned(),
            namespace: namespace.to_owned(),
            lease: lease.to_owned(),
        };
        for i in 0..leaders {
            let slot = rig.start_leader(&format!("leader-{i}"), None)?;
            rig.leaders.push(Some(slot));
        }
        for i in 0..members {
            rig.start_member(i)?;
        }
        Ok(rig)
    }

    /// Starts (or restarts, in the same place) a leader elector. A new slot gets a loopback
    /// address of its own, `127.0.0.10` upwards.
    pub fn start_leader(&self, identity: &str, at: Option<SlotAddress>) -> Result<LeaderSlot> {
        let SlotAddress {
            host,
            rpc_port,
            metrics_port,
            ready_port,
        } = match at {
            Some(a) => a,
            None => SlotAddress {
                host: format!(
                    "127.0.0.{}",
                    10 + self.hosts.fetch_add(1, Ordering::Relaxed) % 240
                ),
                rpc_port: free_port()?,
                metrics_port: free_port()?,
                ready_port: free_port()?,
            },
        };
        let mut cmd = Command::new(paths::elector_bin()?);
        cmd.current_dir(&self.dir)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .args([
                "leader",
                "--lease",
                &self.lease,
                "--namespace",
                &self.namespace,
            ])
            .args(["--identity", identity])
            .arg(format!("--address={host}:{rpc_port}"))
            .arg(format!("--lease-duration={}", ms(self.timing.duration)))
            .arg(format!(
                "--renew-deadline={}",
                ms(self.timing.renew_deadline)
            ))
            .arg(format!("--retry-period={}", ms(self.timing.retry_period)))
            .arg(format!(
                "--child-health-url=http://{host}:{metrics_port}/health"
            ))
            .arg(format!("--ready-addr=127.0.0.1:{ready_port}"))
            .arg("--")
            .arg(paths::mooncake_master()?)
            .arg(format!("--rpc_address={host}"))
            .arg(format!("--rpc_port={rpc_port}"))
            .arg(format!("--metrics_host={host}"))
            .arg(format!("--metrics_port={metrics_port}"))
            .args(["--client_ttl=3", "--default_kv_lease_ttl=500"]);
        loopback_env(&mut cmd);
        let proc = Proc::spawn(identity, cmd, &self.dir.join(format!("{identity}.log")))?;
        Ok(LeaderSlot {
            proc,
            identity: identity.to_owned(),
            host,
            rpc_port,
            metrics_port,
            ready_port,
        })
    }

    fn start_member(&mut self, i: usize) -> Result<()> {
        let venv = paths::mooncake_venv()?;
        let port = free_port()?;
        let mut cmd = Command::new(paths::elector_bin()?);
        cmd.current_dir(&self.dir)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .args([
                "member",
                "--lease",
                &self.lease,
                "--namespace",
                &self.namespace,
            ])
            .arg(format!("--retry-period={}", ms(self.timing.retry_period)))
            .arg("--stop-grace=3s")
            .arg("--")
            .arg(venv.join("bin/python"))
            .args([
                "-m",
                "mooncake.mooncake_store_service",
                "--port",
                &port.to_string(),
            ])
            .env(
                "MOONCAKE_GLOBAL_SEGMENT_SIZE",
                self.segment_bytes.to_string(),
            )
            .env("MOONCAKE_LOCAL_BUFFER_SIZE", (16u64 << 20).to_string());
        loopback_env(&mut cmd);
        self.members.push(Proc::spawn(
            &format!("member-{i}"),
            cmd,
            &self.dir.join(format!("member-{i}.log")),
        )?);
        Ok(())
    }

    /// The index of the ready leader, if exactly one is ready.
    pub fn leader(&self) -> Option<usize> {
        let ready: Vec<usize> = self
            .leaders
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(LeaderSlot::ready))
            .map(|(i, _)| i)
            .collect();
        (ready.len() == 1).then(|| ready[0])
    }

    /// Waits for a ready leader other than `not`.
    pub fn wait_leader(&self, not: Option<usize>, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(i) = self.leader().filter(|i| Some(*i) != not) {
                return Ok(i);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Error::NotReady {
            what: "a leader elector".into(),
            seconds: timeout.as_secs(),
            log: self.dir.display().to_string(),
        })
    }

    /// Waits until leader `i`'s master reports `want` capacity.
    pub fn wait_capacity(&self, i: usize, want: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.leaders[i].as_ref().and_then(LeaderSlot::capacity) == Some(want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Error::NotReady {
            what: format!("capacity {want} on leader {i}"),
            seconds: timeout.as_secs(),
            log: self.dir.display().to_string(),
        })
    }

    /// Stops leader `i`: SIGTERM (a graceful handover) or SIGKILL of the elector and its master.
    pub fn stop_leader(&mut self, i: usize, hard: bool) {
        let Some(mut slot) = self.leaders[i].take() else {
            return;
        };
        if hard {
            let children = children_of(slot.proc.pid());
            slot.proc.signal(Signal::SIGKILL);
            for c in children {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c), Signal::SIGKILL);
            }
            slot.proc.kill();
        } else {
            slot.proc.stop(Duration::from_secs(15));
        }
    }

    /// Sends `signal` to leader `i`'s master, then to its elector (SIGSTOP and SIGCONT: a node
    /// that stalls, a process starved of CPU). Returns the master's process id, if it runs one.
    pub fn signal_leader(&self, i: usize, signal: Signal, master_too: bool) -> Option<i32> {
        let slot = self.leaders[i].as_ref()?;
        let master = children_of(slot.proc.pid()).first().copied();
        if master_too && let Some(m) = master {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(m), signal);
        }
        slot.proc.signal(signal);
        master
    }

    /// The process id of leader `i`'s master, if it runs one.
    pub fn master_pid(&self, i: usize) -> Option<i32> {
        let slot = self.leaders[i].as_ref()?;
        children_of(slot.proc.pid()).first().copied()
    }

    /// A watchdog that polls every master's `/health` every 50 ms and counts the samples where
    /// two or more answered as serving at once.
    pub fn watch_for_split_brain(&self) -> SplitBrainWatch {
        let ports: Vec<(String, u16)> = self
            .leaders
            .iter()
            .flatten()
            .map(|s| (s.host.clone(), s.metrics_port))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(AtomicUsize::new(0));
        let (s, v, n) = (stop.clone(), violations.clone(), samples.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let serving = ports
                    .iter()
                    .filter(|p| {
                        http_get(&format!("http://{}:{}/health", p.0, p.1))
                            .ok()
                            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                            .is_some_and(|h| h["service_ready"] == true)
                    })
                    .count();
                if serving > 1 {
                    v.fetch_add(1, Ordering::Relaxed);
                }
                n.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        SplitBrainWatch {
            stop,
            violations,
            samples,
            handle: Some(handle),
        }
    }

    /// Where the logs are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// See [`Rig::watch_for_split_brain`].
pub struct SplitBrainWatch {
    stop: Arc<AtomicBool>,
    violations: Arc<AtomicUsize>,
    samples: Arc<AtomicUsize>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl SplitBrainWatch {
    /// Stops watching; returns (samples taken, samples with two serving masters).
    pub fn finish(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        (
            self.samples.load(Ordering::Relaxed),
            self.violations.load(Ordering::Relaxed),
        )
    }
}

/// The direct children of a process (from /proc).
pub fn children_of(pid: u32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
