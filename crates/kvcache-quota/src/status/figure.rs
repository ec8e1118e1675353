//! How status messages write figures.

use bytesize::ByteSize;

/// A byte figure as users write it (`16Gi`) when exact, else approximately with the exact count.
pub(crate) fn bytes(b: u64) -> String {
    let q = kvcache_api::quantity::format_bytes(b);
    if q.ends_with('i') {
        q
    } else {
        format!("{} ({b} bytes)", ByteSize::b(b).display().iec())
    }
}
