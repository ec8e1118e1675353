//! KVCachePool and KVCachePoolBinding admission.

use super::verdict::{Admission, Verdict};
use crate::names::domain_name_problem;
use crate::pool::{DEFAULT_DOMAIN, KVCachePool, KVCachePoolBinding};
use crate::quantity::Quantity;
use crate::settings::Settings;

/// The largest quota the store accepts, in bytes.
pub const MAX_QUOTA_BYTES: u64 = i64::MAX as u64;

fn quota_bytes(field: &str, q: &Quantity, v: &mut Verdict) -> Option<u64> {
    match q.bytes(field) {
        Ok(0) => {
            v.refuse(field, "must be above zero: the store refuses a zero quota");
            None
        }
        Ok(b) if b > MAX_QUOTA_BYTES => {
            v.refuse(
                field,
                "must be at most 8Ei (the store counts quota in signed 64-bit bytes)",
            );
            None
        }
        Ok(b) => Some(b),
        Err(e) => {
            v.refuse(field, e.to_string());
            None
        }
    }
}

impl Admission for KVCachePool {
    fn validate_create(&self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        if self.spec.backends.len() != 1 {
            v.refuse(
                "spec.backends",
                format!(
                    "must name exactly one KVCacheBackend; it names {}",
                    self.spec.backends.len()
                ),
            );
        }
        quota_bytes("spec.quota.total", &self.spec.quota.total, &mut v);
        v
    }

    fn validate_update(&self, old: &Self, settings: &Settings) -> Verdict {
        let mut v = self.validate_create(settings);
        if self.spec.backends != old.spec.backends {
            v.refuse(
                "spec.backends",
                "a pool cannot be re-pointed to another backend; create a new pool for it",
            );
        }
        v
    }
}

// ---------------------------------------------------------------------------------------------
// KVCachePoolBinding

impl Admission for KVCachePoolBinding {
    fn validate_create(&self, settings: &Settings) -> Verdict {
        let mut v = Verdict::default();
        binding_static(self, &mut v);
        if settings.kv_cache_dtype_owned && self.spec.domain.dtype == "auto" {
            v.refuse(
                "spec.domain.dtype",
                "auto is refused on a new Binding: the dtype is handed to engines as --kv-cache-dtype, and auto lets each engine pick, so two workloads could share blocks of different dtypes; name the dtype (e.g. bfloat16)",
            );
        }
        v
    }

    fn validate_update(&self, old: &Self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        binding_static(self, &mut v);
        if self.spec.pool_ref != old.spec.pool_ref {
            v.refuse(
                "spec.poolRef",
                "is immutable: create a new Binding for another pool",
            );
        }
        let (n, o) = (&self.spec.domain, &old.spec.domain);
        for (field, changed) in [
            ("name", n.name != o.name),
            ("blockSize", n.block_size != o.block_size),
            ("dtype", n.dtype != o.dtype),
        ] {
            if changed {
                v.refuse(
                    format!("spec.domain.{field}"),
                    "is immutable: a domain is the cache's compatibility key, so running workloads would read blocks another configuration wrote; create a new Binding instead",
                );
            }
        }
        v
    }
}

fn binding_static(b: &KVCachePoolBinding, v: &mut Verdict) {
    if b.spec.pool_ref.name.is_empty() {
        v.refuse("spec.poolRef.name", "must name a KVCachePool");
    }
    quota_bytes("spec.quota.ceiling", &b.spec.quota.ceiling, v);
    if let Some(problem) = domain_name_problem(&b.spec.domain.name) {
        v.refuse("spec.domain.name", problem);
    }
    if b.spec.domain.block_size < 1 {
        v.refuse("spec.domain.blockSize", "must be at least 1");
    }
    if b.spec.domain.dtype.trim().is_empty() {
        v.refuse(
            "spec.domain.dtype",
            "must name the KV cache dtype engines use, e.g. bfloat16",
        );
    }
}

/// The tenant id a Binding's domain stands for.
pub fn tenant_of(binding: &KVCachePoolBinding) -> &str {
    if binding.spec.domain.name.is_empty() {
        DEFAULT_DOMAIN
    } else {
        &binding.spec.domain.name
    }
}
