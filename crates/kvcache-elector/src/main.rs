//! The `kvcache-elector` binary.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use kvcache_elector::Timing;
use kvcache_elector::leader::{self, LeaderConfig};
use kvcache_elector::member::{self, MemberConfig};

/// Lease-based leadership for Mooncake store processes. Runs the command after `--`.
#[derive(Parser, Debug)]
#[command(name = "kvcache-elector", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Campaign for the Lease; run the master only while holding it.
    Leader(LeaderArgs),
    /// Follow the Lease holder; (re)start the member pointed at it.
    Member(MemberArgs),
    /// Copy this binary into a directory (the init container that delivers it into store Pods).
    Install {
        /// The directory (a shared emptyDir).
        dir: std::path::PathBuf,
    },
}

/// Copies the running binary to `dir/kvcache-elector`, executable.
fn install(dir: &std::path::Path) -> Result<(), kvcache_elector::Error> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |step, path: &std::path::Path| {
        let path = path.to_owned();
        move |source| kvcache_elector::Error::Install { step, path, source }
    };
    let me = std::env::current_exe().map_err(failed("read", "/proc/self/exe".as_ref()))?;
    std::fs::create_dir_all(dir).map_err(failed("create", dir))?;
    let target = dir.join("kvcache-elector");
    std::fs::copy(&me, &target).map_err(failed("copy this binary to", &target))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .map_err(failed("make executable", &target))?;
    Ok(())
}

#[derive(Args, Debug)]
struct Common {
    /// The Lease to hold or follow (`<backend>-leader`).
    #[arg(long, env = "KVCACHE_ELECTOR_LEASE")]
    lease: String,
    /// The Lease's namespace (the Pod's own).
    #[arg(long, env = "KVCACHE_ELECTOR_NAMESPACE")]
    namespace: String,
    /// How often the Lease is read (and renewed by the leader), e.g. `1s`, `500ms`.
    #[arg(long, env = "KVCACHE_ELECTOR_RETRY_PERIOD", default_value = "1s", value_parser = kvcache_elector::parse_duration)]
    retry_period: Duration,
    /// How long the wrapped process gets to exit after SIGTERM before SIGKILL.
    #[arg(long, env = "KVCACHE_ELECTOR_STOP_GRACE", default_value = "10s", value_parser = kvcache_elector::parse_duration)]
    stop_grace: Duration,
}

#[derive(Args, Debug)]
struct LeaderArgs {
    #[command(flatten)]
    common: Common,
    /// This elector's identity in the Lease (the Pod name).
    #[arg(long, env = "KVCACHE_ELECTOR_IDENTITY")]
    identity: String,
    /// The store address members should dial while this elector leads (`<pod IP>:50051`),
    /// published as a Lease annotation.
    #[arg(long, env = "KVCACHE_ELECTOR_ADDRESS")]
    address: Option<String>,
    /// How long the Lease stays valid after its last renewal.
    #[arg(long, env = "KVCACHE_ELECTOR_LEASE_DURATION", default_value = "6s", value_parser = kvcache_elector::parse_duration)]
    lease_duration: Duration,
    /// How long the leader keeps serving without a successful renewal (shorter than the duration).
    #[arg(long, env = "KVCACHE_ELECTOR_RENEW_DEADLINE", default_value = "4s", value_parser = kvcache_elector::parse_duration)]
    renew_deadline: Duration,
    /// The master's `/health` URL (its admin port).
    #[arg(
        long,
        env = "KVCACHE_ELECTOR_CHILD_HEALTH_URL",
        default_value = "http://127.0.0.1:9003/health"
    )]
    child_health_url: String,
    /// Where `/readyz` (200 only on the serving leader) and `/healthz` are served.
    #[arg(
        long,
        env = "KVCACHE_ELECTOR_READY_ADDR",
        default_value = "0.0.0.0:8090"
    )]
    ready_addr: SocketAddr,
    /// The master's command line.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct MemberArgs {
    #[command(flatten)]
    common: Common,
    /// The variable the member reads its master address from.
    #[arg(
        long,
        env = "KVCACHE_ELECTOR_MASTER_ENV",
        default_value = "MOONCAKE_MASTER"
    )]
    master_env: String,
    /// The port where the leader elector answers `/identity` (its `--ready-addr` port): a
    /// member mounts only on a master whose elector names this backend's Lease and holder.
    #[arg(
        long,
        env = "KVCACHE_ELECTOR_LEADER_IDENTITY_PORT",
        default_value_t = 8090
    )]
    leader_identity_port: u16,
    /// The member's command line.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .json()
        .init();
    let result = match Cli::parse().mode {
        Mode::Install { dir } => {
            return match install(&dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            };
        }
        Mode::Leader(a) => {
            leader::run(LeaderConfig {
                lease: a.common.lease,
                namespace: a.common.namespace,
                identity: a.identity,
                address: a.address,
                timing: Timing {
                    lease_duration: a.lease_duration,
                    renew_deadline: a.renew_deadline,
                    retry_period: a.common.retry_period,
                },
                child_health_url: a.child_health_url,
                ready_addr: a.ready_addr,
                stop_grace: a.common.stop_grace,
                command: a.command,
            })
            .await
        }
        Mode::Member(a) => {
            member::run(MemberConfig {
                lease: a.common.lease,
                namespace: a.common.namespace,
                retry_period: a.common.retry_period,
                master_env: a.master_env,
                stop_grace: a.common.stop_grace,
                command: a.command,
                leader_identity_port: a.leader_identity_port,
            })
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use kvcache_elector::parse_duration;
    use std::time::Duration;

    #[test]
    fn install_copies_an_executable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("elector-install-{}", std::process::id()));
        super::install(&dir).expect("installs");
        let mode = std::fs::metadata(dir.join("kvcache-elector"))
            .expect("copied")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("99999999999999999999999999999999s").is_err());
        assert!(parse_duration("184467440737095516160000m").is_err());
        assert!(parse_duration("").is_err());
    }
}
