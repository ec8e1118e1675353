//! What dials the store's leader in `bench failover`: a stand-in for the leader's Service and
//! the engine stand-in behind it, and how soon the engine writes again after a loss.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use kvcache_e2e::paths;
use kvcache_e2e::process::{Proc, free_port};

/// Where an engine reaches the store: a stand-in for the leader's Service, a loopback TCP
/// forwarder that sends each new connection to the current leader's master (as kube-proxy sends a
/// new connection to a Ready endpoint) and leaves open connections alone.
pub(super) struct ServiceStandIn {
    pub(super) port: u16,
    target: Arc<Mutex<String>>,
    /// When set, a connection whose master went away is not closed towards the client: the
    /// client's requests go unanswered, as when a leader Pod's address vanishes with its node
    /// (no FIN, no RST reaches the client).
    pub(super) vanish: Arc<AtomicBool>,
}

impl ServiceStandIn {
    pub(super) fn start(target: String) -> anyhow::Result<ServiceStandIn> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the Service stand-in")?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(Mutex::new(target));
        let vanish = Arc::new(AtomicBool::new(false));
        let (t, v) = (target.clone(), vanish.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let to = t.lock().map(|g| g.clone()).unwrap_or_default();
                let v = v.clone();
                std::thread::spawn(move || {
                    let Ok(upstream) = TcpStream::connect(&to) else {
                        return;
                    };
                    pipe(client, upstream, &v);
                });
            }
        });
        Ok(ServiceStandIn {
            port,
            target,
            vanish,
        })
    }

    /// The endpoint switch: new connections go to `to`.
    pub(super) fn point_at(&self, to: String) {
        if let Ok(mut g) = self.target.lock() {
            *g = to;
        }
    }
}

/// Copies both ways until either side closes, then closes both; with `vanish` set when the
/// master's side ends, the client's side is held open and what it sends is dropped until it
/// gives up.
fn pipe(client: TcpStream, upstream: TcpStream, vanish: &Arc<AtomicBool>) {
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let v = vanish.clone();
    let back = std::thread::spawn(move || {
        let (mut from, mut to) = (u2, c2);
        let _ = std::io::copy(&mut from, &mut to);
        let _ = from.shutdown(Shutdown::Both);
        if !v.load(Ordering::Relaxed) {
            let _ = to.shutdown(Shutdown::Both);
        }
    });
    let (mut from, mut to) = (client, upstream);
    let _ = std::io::copy(&mut from, &mut to);
    if vanish.load(Ordering::Relaxed) {
        let _ = std::io::copy(&mut from, &mut std::io::sink());
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    let _ = back.join();
}

/// The engine stand-in (`images/engine/standin.py` as SGLang, the real Mooncake client) dialling
/// the Service stand-in.
pub(super) struct Engine {
    _proc: Proc,
    pub(super) port: u16,
}

impl Engine {
    pub(super) fn start(
        dir: &std::path::Path,
        name: &str,
        master: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Engine> {
        let port = free_port()?;
        let standin = paths::workspace_root().join("images/engine");
        let mut cmd = std::process::Command::new(paths::mooncake_venv()?.join("bin/python"));
        cmd.current_dir(dir).args([
            "-c",
            &format!(
                "import sys; sys.path.insert(0, {:?}); import standin; standin.main('sglang', ['--hicache-storage-backend', 'mooncake', '--port', '{port}'])",
                standin.display().to_string()
            ),
        ]);
        kvcache_e2e::store::loopback_env(&mut cmd);
        cmd.env("MOONCAKE_MASTER", master)
            .env("STANDIN_BLOCK_BYTES", "4096")
            .envs(env.iter().copied());
        let log = dir.join(format!("{name}.log"));
        let proc = Proc::spawn(name, cmd, &log)?;
        let engine = Engine { _proc: proc, port };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !engine.put("boot-check") {
            anyhow::ensure!(
                Instant::now() < deadline,
                "waited 90s for the engine stand-in's first successful /put (log: {})",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(engine)
    }

    /// One 4 KiB put through the store; whether the store took it.
    pub(super) fn put(&self, key: &str) -> bool {
        put_rc(self.port, key) == Some(0)
    }
}

/// The store's answer to one 4 KiB put through the engine stand-in on `port` (`None` when the
/// stand-in did not answer within 5 s).
fn put_rc(port: u16, key: &str) -> Option<i64> {
    kvcache_e2e::store::http_get(&format!("http://127.0.0.1:{port}/put?key={key}&size=4096"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["rc"].as_i64())
}

/// Mooncake's `RPC_FAIL`: the client did not reach a master.
const RPC_FAIL: i64 = -900;

/// What the engine saw after the leader was lost, each time from the loss.
pub(super) struct Reattach {
    /// The first put a master answered (with anything but `RPC_FAIL`): the client reconnected.
    pub(super) answered: Duration,
    /// The first put the store took.
    pub(super) wrote: Duration,
    /// The member that dials the Service stand-in (`memberAddressing: Service`, the default)
    /// mounted on the new master.
    pub(super) service_member: Duration,
}

/// Polls the engine's `/put` every 200 ms from the leader's loss `t` until one succeeds.
pub(super) fn engine_writes(port: u16, t: Instant, within: Duration) -> anyhow::Result<Reattach> {
    let mut n = 0u64;
    let mut answered = None;
    loop {
        n += 1;
        let rc = put_rc(port, &format!("reattach-{}-{n}", t.elapsed().as_millis()));
        if rc.is_some_and(|rc| rc != RPC_FAIL) && answered.is_none() {
            answered = Some(t.elapsed());
        }
        if rc == Some(0) {
            let wrote = t.elapsed();
            return Ok(Reattach {
                answered: answered.unwrap_or(wrote),
                wrote,
                service_member: Duration::ZERO,
            });
        }
        anyhow::ensure!(
            t.elapsed() < within,
            "waited {within:?} for the engine stand-in's first successful /put after the leader was lost (last answer {rc:?})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
