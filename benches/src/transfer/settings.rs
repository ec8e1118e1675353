//! What a transfer run compares: the store client's settings, the object sizes, the rounds.

/// Rounds of every variant per condition, in a rotated order each round; medians reported.
pub(super) const ROUNDS: usize = 3;

/// Object sizes and how many of each a pass puts and gets.
pub(super) const SIZES: [(usize, usize); 4] =
    [(64 << 10, 64), (512 << 10, 32), (1 << 20, 32), (8 << 20, 4)];

/// The client settings compared: a name and the environment the store's client runs with.
/// Mooncake 0.3.13.post1's TCP transport reads these at start (its `tcp_transport.cpp` and the
/// session's chunk size): the connection pool (on unless `0`), its lanes per peer (4), the chunk
/// each socket read and write moves (64 KiB), and the per-peer queue (1024 slices; past it and
/// its 1024-entry overflow a burst is refused as queue-full). `PASS_API=batch` is the pass's own:
/// the engines' way of calling the client (below) instead of one copying call per object.
/// `MC_TCP_PROGRESS_TIMEOUT_SEC` (30 s) is how long a connection may make no progress before
/// its transfer fails: shorter turns a stall into a failure (a recompute in an engine) sooner.
/// `MC_RPC_TIMEOUT_MS` and `MC_RPC_CONNECT_TIMEOUT_MS` (30 s each) bound each call to the
/// master: the render's 2 s for members, tried on an engine's client under load.
pub(super) const VARIANTS: [Variant; 8] = [
    Variant::plain("0.3.13 defaults", &[]),
    Variant::plain("pool off", &[("MC_TCP_ENABLE_CONNECTION_POOL", "0")]),
    Variant::plain("8 lanes", &[("MC_TCP_LANES_PER_PEER", "8")]),
    Variant::plain("1 MiB chunks", &[("MC_TCP_SLICE_SIZE", "1048576")]),
    Variant::rendered(RENDERED, &[]),
    Variant::rendered("rendered, engines' batches", &[("PASS_API", "batch")]),
    Variant::rendered(
        "rendered, progress timeout 5 s",
        &[("MC_TCP_PROGRESS_TIMEOUT_SEC", "5")],
    ),
    Variant::rendered(
        "rendered, RPC timeouts 2 s",
        &[
            // What the render gives members (crates/kvcache-render/src/objects/backend/member.rs),
            // given to a client: 30 s by default.
            ("MC_RPC_TIMEOUT_MS", "2000"),
            ("MC_RPC_CONNECT_TIMEOUT_MS", "2000"),
        ],
    ),
];

/// The setting the render and the injection give every client, as [`VARIANTS`] names it.
pub(super) const RENDERED: &str = "rendered (queue 65535)";

/// One client setting of [`VARIANTS`].
pub(super) struct Variant {
    pub(super) name: &'static str,
    /// Whether it starts from what the render and the injection give every client
    /// (`kvcache_inject::transport::TCP_TUNING`) rather than the store's defaults.
    rendered: bool,
    /// Its own variables on top.
    extra: &'static [(&'static str, &'static str)],
}

impl Variant {
    const fn plain(name: &'static str, extra: &'static [(&'static str, &'static str)]) -> Self {
        Variant {
            name,
            rendered: false,
            extra,
        }
    }

    pub(super) const fn rendered(
        name: &'static str,
        extra: &'static [(&'static str, &'static str)],
    ) -> Self {
        Variant {
            name,
            rendered: true,
            extra,
        }
    }

    /// The environment the store's client runs with.
    pub(super) fn env(&self) -> Vec<(&'static str, &'static str)> {
        let tuning = kvcache_inject::transport::TCP_TUNING
            .iter()
            .filter(|_| self.rendered)
            .map(|t| (t.name, t.value));
        tuning.chain(self.extra.iter().copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendered_settings_are_the_injections_and_the_defaults_are_not() {
        let tuning: Vec<(&str, &str)> = kvcache_inject::transport::TCP_TUNING
            .iter()
            .map(|t| (t.name, t.value))
            .collect();
        assert!(!tuning.is_empty());
        for v in &VARIANTS {
            let env = v.env();
            let has_tuning = tuning.iter().all(|t| env.contains(t));
            assert_eq!(has_tuning, v.name.starts_with("rendered"), "{}", v.name);
            assert!(v.extra.iter().all(|e| env.contains(e)), "{}", v.name);
        }
        assert_eq!(VARIANTS.iter().filter(|v| v.name == RENDERED).count(), 1);
    }
}
