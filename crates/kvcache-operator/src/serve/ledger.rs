//! The connections and memory held per source and in all: a slot per connection, permits per
//! request.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bounds::{Bounds, Rate, Refused, admit_connection};

/// The connections and memory held per source, and in all.
pub struct Ledger {
    bounds: Bounds,
    /// The sources served; empty: every source.
    allowed: Vec<ipnet::IpNet>,
    memory: Arc<Semaphore>,
    state: Mutex<State>,
    /// New connections per source (sources it no longer tells apart from new ones are
    /// forgotten once it remembers [`SOURCES_REMEMBERED`]).
    rate: governor::DefaultKeyedRateLimiter<IpAddr>,
}

/// Sources the connection rate remembers before it forgets those back at a full burst.
const SOURCES_REMEMBERED: usize = 4096;

/// `governor`'s quota for a [`Rate`] (a zero reads as one).
fn quota(rate: Rate) -> governor::Quota {
    let at_least_one = |n: u32| std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
    governor::Quota::per_second(at_least_one(rate.per_second)).allow_burst(at_least_one(rate.burst))
}

#[derive(Default)]
struct State {
    open: usize,
    sources: HashMap<IpAddr, Source>,
}

struct Source {
    open: usize,
    memory: Arc<Semaphore>,
}

/// A served connection's place in the [`Ledger`], given back when dropped.
pub struct Slot {
    ledger: Arc<Ledger>,
    source: IpAddr,
    memory: Arc<Semaphore>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.ledger.lock();
        state.open = state.open.saturating_sub(1);
        if let Some(s) = state.sources.get_mut(&self.source) {
            s.open = s.open.saturating_sub(1);
            if s.open == 0 {
                state.sources.remove(&self.source);
            }
        }
    }
}

/// Memory a request holds while it is read and answered.
pub struct Held {
    _all: OwnedSemaphorePermit,
    _source: OwnedSemaphorePermit,
}

impl Ledger {
    /// An empty ledger for a server with `bounds` serving every source.
    pub fn new(bounds: Bounds) -> Arc<Self> {
        Self::serving(bounds, Vec::new())
    }

    /// An empty ledger for a server with `bounds` serving only the sources in `allowed` (every
    /// source when it is empty).
    pub fn serving(bounds: Bounds, allowed: Vec<ipnet::IpNet>) -> Arc<Self> {
        Arc::new(Ledger {
            bounds,
            allowed,
            memory: Arc::new(Semaphore::new(kib(bounds.memory))),
            state: Mutex::new(State::default()),
            rate: governor::RateLimiter::keyed(quota(bounds.source_rate)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection from `source`, or why there is none.
    pub fn enter(self: &Arc<Self>, source: IpAddr) -> Result<Slot, Refused> {
        let mut state = self.lock();
        let from_source = state.sources.get(&source).map_or(0, |s| s.open);
        let allowed = self.allowed.is_empty() || self.allowed.iter().any(|n| n.contains(&source));
        admit_connection(&self.bounds, state.open, from_source, allowed)?;
        // Last, so that only a connection the caps admit spends its source's rate.
        if self.rate.len() > SOURCES_REMEMBERED {
            self.rate.retain_recent();
        }
        if self.rate.check_key(&source).is_err() {
            return Err(Refused::TooFast);
        }
        state.open += 1;
        let share = kib(self.bounds.source_memory());
        let entry = state.sources.entry(source).or_insert_with(|| Source {
            open: 0,
            memory: Arc::new(Semaphore::new(share)),
        });
        entry.open += 1;
        let memory = entry.memory.clone();
        Ok(Slot {
            ledger: self.clone(),
            source,
            memory,
        })
    }

    /// The bounds it keeps.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Connections open now, in all.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Reserves `kib` of memory for a request on `slot`: first from its source's share, then
    /// from the budget in all; waits until both are free (a reservation larger than the share
    /// waits until the caller's deadline: [`decoding`](super::decoding) refuses those first).
    pub async fn reserve(&self, slot: &Slot, kib: u32) -> Held {
        let source = acquire(&slot.memory, kib).await;
        let all = acquire(&self.memory, kib).await;
        Held {
            _all: all,
            _source: source,
        }
    }
}

/// `n` permits of `semaphore` (a semaphore is never closed here; the caller bounds the wait).
async fn acquire(semaphore: &Arc<Semaphore>, n: u32) -> OwnedSemaphorePermit {
    loop {
        if let Ok(p) = semaphore.clone().acquire_many_owned(n).await {
            return p;
        }
    }
}

pub(super) fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}
