//! Steps 1 and 2: the store, then the pool and team-a's Binding.

use std::path::Path;
use std::time::Duration;

use kvcache_api::pool::binding_conditions::QUOTA_GRANTED;

use super::kubectl::{Demo, NS, file};

/// The backend, Ready with the capacity both members registered.
pub(super) fn the_store(d: &mut Demo, files: &Path) -> anyhow::Result<()> {
    d.show(&[
        "apply",
        "-f",
        &file(files, "00-namespace.yaml"),
        "-f",
        &file(files, "01-backend.yaml"),
    ])?;
    d.wait(
        "the backend Ready with what both members registered",
        &[
            "get",
            "kvcb",
            "mooncake-dram",
            "-o",
            "jsonpath={.status.phase} {.status.capacity.total}",
        ],
        Duration::from_secs(300),
        |s| s == "Ready 512Mi",
    )?;
    d.show(&["get", "kvcb"])?;
    d.show(&["-n", NS, "get", "pods", "-o", "wide"])?;
    Ok(())
}

/// The pool and team-a's Binding, until the master grants the domain.
pub(super) fn the_pool_and_binding(d: &mut Demo, files: &Path) -> anyhow::Result<()> {
    d.show(&[
        "apply",
        "-f",
        &file(files, "02-pool.yaml"),
        "-f",
        &file(files, "03-binding.yaml"),
    ])?;
    d.wait_condition(
        "team-a",
        "kvcpb/team-a",
        QUOTA_GRANTED,
        "the master granted the domain",
        Duration::from_secs(180),
    )?;
    d.show(&["get", "kvcp"])?;
    d.show(&["-n", "team-a", "get", "kvcpb"])?;
    // The store now takes traffic from team-a (its Binding) and no other namespace.
    d.show(&["-n", NS, "get", "networkpolicy"])?;
    d.show(&[
        "-n",
        NS,
        "get",
        "networkpolicy",
        "mooncake-dram-leader",
        "-o",
        "jsonpath={.spec.ingress[0].from[*].namespaceSelector.matchExpressions[0].values}",
    ])?;
    // jsonpath prints no newline of its own.
    println!();
    Ok(())
}
