//! CPU and memory of the store's own Pods (`leader.resources`, `members[].resources`) and the
//! defaults they take: sized so a store Pod keeps serving beside engines that use every core.
//! Why each default: `crates/kvcache-operator/README.md` ("Store Pods' CPU and memory"); the
//! figures behind them: `benches/README.md` ("transfer") and `BENCHMARKS.md`.

use std::borrow::Cow;
use std::fmt;

use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::quantity::Quantity;
use crate::quantity::{QuantityError, parse_millicores};
use crate::rules::BUCKET_BYTES;

/// The leader (master) container's CPU request when `leader.resources` names none: every put
/// and every get of every engine is two RPCs to the master, so its share decides how fast the
/// whole store answers on a busy node.
pub const LEADER_CPU_REQUEST: &str = "1";
/// The leader container's memory request when `leader.resources` names none: the master keeps
/// every key's metadata in memory, measured 55 MiB empty and about 0.7 KiB per key
/// (`docs/store-resources.md`); this holds about 1.4 million keys.
pub const LEADER_MEMORY_REQUEST: &str = "1Gi";
/// A member container's CPU request when its group's `resources` names none: a member's
/// transfer thread serves every engine's gets and puts of the blocks it holds.
pub const MEMBER_CPU_REQUEST: &str = "1";
/// The smallest CPU request a store container is admitted with without a warning, in
/// millicores: below it, beside engines prefilling on every core, the store's transfers fell
/// from hundreds of MB/s to about 1 MB/s and a hit came slower than recomputing (measured
/// with the kernel's CPU weight of a 25m request; `crates/kvcache-operator/README.md`).
pub(crate) const STORE_CPU_FLOOR_MILLICORES: u64 = 250;
/// The etcd container's CPU request (`electionBackend: Etcd`): the masters' election and
/// operation log go through it, and a starved etcd loses the leader's lease.
pub const ETCD_CPU_REQUEST: &str = "100m";

/// A member's staging buffer when `localBufferSize` names none.
pub const DEFAULT_LOCAL_BUFFER: u64 = 16 << 20;
/// The staging buffer of a disk tier (the store's default is 1.25 GiB): two buckets.
pub const TIER_STAGING_BYTES: u64 = 2 * BUCKET_BYTES;

/// A CPU amount as Kubernetes writes it (`500m`, `1`, `2.5`), kept as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CpuQuantity(pub String);

impl CpuQuantity {
    /// The amount as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whole millicores, or an error naming the field that holds the amount.
    pub fn millicores(&self, field: &str) -> Result<u64, Error> {
        parse_millicores(&self.0).map_err(|reason: QuantityError| Error::Cpu {
            field: field.to_owned(),
            value: self.0.clone(),
            reason,
        })
    }
}

impl fmt::Display for CpuQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for CpuQuantity {
    fn from(s: &str) -> Self {
        CpuQuantity(s.to_owned())
    }
}

impl JsonSchema for CpuQuantity {
    fn schema_name() -> Cow<'static, str> {
        "CpuQuantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": 64,
            "x-kubernetes-validations": [{
                "rule": "isQuantity(self)",
                "message": "must be a Kubernetes CPU quantity such as 500m, 1 or 2",
            }],
        })
    }
}

/// A CPU amount and a memory amount, either of which may be left to its default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuMemory {
    /// CPU, e.g. `500m` or `2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuQuantity>,
    /// Memory, e.g. `512Mi` or `4Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// CPU and memory of a store container. Each figure left out takes its default: the leader
/// requests 1 CPU and 1Gi, a member 1 CPU and its segment plus staging buffers; no limits.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = crate::rules::limits_not_under_requests())]
pub struct StoreResources {
    /// What the container is guaranteed and weighted by on a busy node. A CPU request below
    /// 250m is admitted with a warning: beside busy engines the store's transfers starve. A
    /// member's memory request cannot be below its segment plus staging buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<CpuMemory>,
    /// Ceilings. Unset: none. A CPU limit throttles transfers even on an idle node; a memory
    /// limit below the request is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<CpuMemory>,
}

impl StoreResources {
    /// The requested CPU, if written.
    pub fn cpu_request(&self) -> Option<&CpuQuantity> {
        self.requests.as_ref().and_then(|r| r.cpu.as_ref())
    }

    /// The requested memory, if written.
    pub fn memory_request(&self) -> Option<&Quantity> {
        self.requests.as_ref().and_then(|r| r.memory.as_ref())
    }

    /// The CPU limit, if written.
    pub fn cpu_limit(&self) -> Option<&CpuQuantity> {
        self.limits.as_ref().and_then(|r| r.cpu.as_ref())
    }

    /// The memory limit, if written.
    pub fn memory_limit(&self) -> Option<&Quantity> {
        self.limits.as_ref().and_then(|r| r.memory.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_clear_the_floor() {
        for cpu in [LEADER_CPU_REQUEST, MEMBER_CPU_REQUEST] {
            let m = CpuQuantity::from(cpu).millicores("x").expect("parses");
            assert!(m >= STORE_CPU_FLOOR_MILLICORES, "{cpu} is below the floor");
        }
        assert_eq!(
            CpuQuantity::from("250m").millicores("x").expect("parses"),
            250
        );
        assert_eq!(
            CpuQuantity::from("1.5").millicores("x").expect("parses"),
            1500
        );
        assert!(CpuQuantity::from("fast").millicores("x").is_err());
        assert!(Quantity::from(LEADER_MEMORY_REQUEST).bytes("x").is_ok());
    }

    #[test]
    fn accessors_read_what_is_written() {
        let r: StoreResources = serde_json::from_value(serde_json::json!({
            "requests": {"cpu": "500m"}, "limits": {"memory": "2Gi"}
        }))
        .expect("resources");
        assert_eq!(r.cpu_request().map(CpuQuantity::as_str), Some("500m"));
        assert_eq!(r.memory_request(), None);
        assert_eq!(r.memory_limit().map(Quantity::as_str), Some("2Gi"));
        assert_eq!(r.cpu_limit(), None);
    }
}
