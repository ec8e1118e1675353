//! `kvcache-elector`: Lease-based leadership for Mooncake store processes, so that any upstream
//! store image can run with standbys.
//!
//! - `leader` mode campaigns for the Lease `<backend>-leader`. Only while it holds the Lease does
//!   it run the master (the command after `--`) and answer ready; a standby runs nothing, holds no
//!   data and answers not ready. It stops the master at once when it loses the Lease or cannot
//!   renew it in time, releases the Lease on SIGTERM, and exits non-zero if the master exits.
//! - `member` mode follows the Lease holder's published address and (re)starts the member
//!   (the command after `--`) pointed at it, for `memberAddressing: Lease`, once the elector at
//!   that address names itself as the holder of this backend's Lease ([`identity`]).

#![warn(missing_docs)]

pub mod child;
pub mod election;
pub mod identity;
pub mod leader;
pub mod lease;
pub mod member;
pub mod ready;

pub use election::{Election, LeaseRecord, Plan, Timing, TimingError};

/// Why a duration on the command line is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No number.
    #[error("{0:?} is not a duration such as 500ms, 2s or 1m")]
    NotANumber(String),
    /// A unit other than ms, s, m.
    #[error("{0:?}: the unit must be ms, s or m")]
    Unit(String),
    /// Beyond what a `Duration` counts.
    #[error("{0:?} is too large a duration")]
    TooLarge(String),
}

/// `500ms`, `2s`, `1m` or a bare number of seconds, with checked arithmetic (kube's Go-style
/// `Duration` parser panics on a number too large for a `Duration`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, DurationError> {
    let t = text.trim();
    let (number, unit) = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((t, "s"), |i| t.split_at(i));
    let value: f64 = number
        .parse()
        .map_err(|_| DurationError::NotANumber(text.to_owned()))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(DurationError::Unit(text.to_owned())),
    };
    std::time::Duration::try_from_secs_f64(seconds)
        .map_err(|_| DurationError::TooLarge(text.to_owned()))
}

/// The version in a `--version` banner: `mooncake_master version 0.3.13.post1 (git: 7197358)`
/// gives `0.3.13.post1`.
pub fn version_from_banner(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == "version")?;
        let v = words.next()?;
        v.starts_with(|c: char| c.is_ascii_digit())
            .then(|| v.trim_end_matches(',').to_owned())
    })
}

#[cfg(test)]
mod banner_tests {
    #[test]
    fn reads_the_master_banner() {
        assert_eq!(
            super::version_from_banner(
                "mooncake_master version 0.3.13.post1 (git: 7197358)\nDebug build"
            ),
            Some("0.3.13.post1".into())
        );
        assert_eq!(super::version_from_banner("usage: ..."), None);
        assert_eq!(super::version_from_banner("version: unknown"), None);
    }
}

/// What ends an elector.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The election timing is unsafe.
    #[error("configuration: {0}")]
    Timing(#[from] election::TimingError),
    /// Nothing to run after `--`.
    #[error("configuration: no {role} command after --")]
    NoCommand {
        /// `master` or `member`.
        role: &'static str,
    },
    /// A signal handler could not be installed.
    #[error("cannot listen for signals: {0}")]
    Signal(std::io::Error),
    /// The member's Lease watch ended.
    #[error("the watch on Lease {lease} ended")]
    WatchEnded {
        /// Name of the Lease that was watched (`<backend>-leader`).
        lease: String,
    },
    /// No Kubernetes client could be built.
    #[error("cannot reach the API server: {0}")]
    Client(#[from] kube::Error),
    /// The store process could not start.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program that would not start: the first word of the command after `--`.
        program: String,
        /// Why the OS could not start it (not found, not executable, …).
        source: std::io::Error,
    },
    /// The store process exited while leading.
    #[error(
        "the store process exited ({0}) while leading; the Lease was released so a standby takes over"
    )]
    ChildExited(String),
    /// `install` could not deliver this binary.
    #[error("cannot {step} {}: {source}", path.display())]
    Install {
        /// What failed: `read` (this binary), `create`, `copy this binary to`, `make executable`.
        step: &'static str,
        /// The path it failed on.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The readiness server failed.
    #[error("cannot serve readiness on {addr}: {source}")]
    Serve {
        /// The readiness listen address (`host:port`).
        addr: String,
        /// Why it failed: the OS error, or that the server stopped.
        source: std::io::Error,
    },
}
