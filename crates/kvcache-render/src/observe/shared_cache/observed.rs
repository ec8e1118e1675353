//! `SharedCacheObserved`: what a deployment's engines can tell ([`Engines`]) and whether every
//! ready engine was read this pass.

use kvcache_api::condition::Cond;
use kvcache_api::model::EngineName;
use kvcache_api::model::conditions::SHARED_CACHE_OBSERVED;

use super::counters::EngineReading;
use crate::observe::read::RoleObservation;
use crate::world::Resolution;

/// What the deployment's engines are, for the condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engines {
    /// No `kvCache`: nothing to observe.
    NotAttached,
    /// An engine that does not count store hits per Pod.
    Uncounted(EngineName),
    /// Engines that count; how many replicas are ready.
    Counted {
        /// Ready engine Pods (more than a pass reads when [`crate::observe::read::ENGINE_PODS_PER_PASS`]
        /// left some out).
        ready: usize,
    },
}

/// What a deployment's engines can tell about the shared cache: nothing without `kvCache` (or
/// while it does not resolve), a note for an engine that does not count store hits, otherwise
/// how many replicas of its managed roles are ready (take-over roles run what they like).
pub fn engines(engine: EngineName, resolution: &Resolution, roles: &[RoleObservation]) -> Engines {
    match resolution {
        Resolution::Resolved { .. } if engine == EngineName::Vllm => Engines::Counted {
            ready: roles
                .iter()
                .filter(|r| !r.unmanaged)
                .map(|r| usize::try_from(r.ready).unwrap_or(0))
                .sum(),
        },
        Resolution::Resolved { .. } => Engines::Uncounted(engine),
        _ => Engines::NotAttached,
    }
}

/// `SharedCacheObserved`: whether every ready engine's counters were read this pass; a Pod that
/// could not be read is named with why, never counted as zero.
pub fn condition(engines: Engines, readings: &[EngineReading]) -> Cond {
    match engines {
        Engines::NotAttached => Cond::yes(
            SHARED_CACHE_OBSERVED,
            "NotApplicable",
            "no kvCache: the replicas use no shared cache",
        ),
        Engines::Uncounted(name) => Cond::unknown(
            SHARED_CACHE_OBSERVED,
            "NotCountedByEngine",
            format!(
                "{} publishes no per-engine count of shared-cache hits: status.sharedCache stays empty; the store's own figures (the Binding's status.usage) still show the domain's data",
                name.as_str()
            ),
        ),
        Engines::Counted { ready: 0 } => Cond::unknown(
            SHARED_CACHE_OBSERVED,
            "NoEngineReady",
            "no engine replica is ready: nothing to read",
        ),
        Engines::Counted { ready } => {
            let failed: Vec<String> = readings
                .iter()
                .filter_map(|r| r.counters.as_ref().err().map(|e| format!("{}: {e}", r.pod)))
                .collect();
            // More ready than read: the pass's cap left the rest out.
            let capped = if ready > readings.len() {
                format!(
                    " (of {ready}: a pass reads at most {})",
                    crate::observe::read::ENGINE_PODS_PER_PASS
                )
            } else {
                String::new()
            };
            if failed.is_empty() {
                Cond::yes(
                    SHARED_CACHE_OBSERVED,
                    "EnginesRead",
                    format!(
                        "read the shared-cache counters of {} ready engine Pod(s){capped}",
                        readings.len()
                    ),
                )
            } else {
                Cond::no(
                    SHARED_CACHE_OBSERVED,
                    "EngineMetricsUnreadable",
                    format!(
                        "{} of {} ready engine Pod(s){capped} could not be read and are left out of status.sharedCache: {}",
                        failed.len(),
                        readings.len(),
                        failed.join("; ")
                    ),
                )
            }
        }
    }
}
