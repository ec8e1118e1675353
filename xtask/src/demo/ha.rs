//! Step 4: high availability, standbys and then the serving leader deleted.

use std::time::{Duration, Instant};

use anyhow::bail;

use super::engine::{ask, counters, engine_pods};
use super::kubectl::{Demo, NS};
use super::leader::{master_keys, ready_leaders};

/// Standbys, then the serving leader deleted: a new one serves, the members remount, and the
/// new master starts empty (an earlier prompt is a miss).
pub(super) fn high_availability(d: &mut Demo) -> anyhow::Result<()> {
    d.show(&[
        "patch",
        "kvcb",
        "mooncake-dram",
        "--type=merge",
        "-p",
        r#"{"spec":{"connection":{"managed":{"leader":{"replicas":3}}}}}"#,
    ])?;
    d.wait(
        "3 leader Pods running, 1 of them Ready (the one serving)",
        &[
            "-n",
            NS,
            "get",
            "deployment",
            "mooncake-dram-leader",
            "-o",
            "jsonpath={.status.replicas} {.status.readyReplicas}",
        ],
        Duration::from_secs(300),
        |s| s == "3 1",
    )?;
    d.show(&["-n", NS, "get", "deployment", "mooncake-dram-leader"])?;
    // A prompt only replica A has seen, its blocks in the store before the failover.
    let pods = engine_pods(d)?;
    let [a, b] = pods.as_slice() else {
        bail!("qwen-chat runs {} engine Pods, not 2: {pods:?}", pods.len());
    };
    println!("replica A ({a}) gets a second prompt, which replica B has never seen:");
    ask(d, a, 2)?;
    println!("the master before the failover: {}", master_keys(d)?);
    let leaders = ready_leaders(d)?;
    let leader = leaders.first().cloned().unwrap_or_default();
    anyhow::ensure!(!leader.is_empty(), "no Ready leader Pod to delete");
    let t = Instant::now();
    d.show(&["-n", NS, "delete", "pod", &leader, "--wait=false"])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = ready_leaders(d)?;
        if now.iter().any(|p| *p != leader) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "waited 120s for another leader Pod to serve after deleting {leader}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let serving = Instant::now();
    println!(
        "a new leader serves {:.1}s after the delete",
        t.elapsed().as_secs_f64()
    );
    d.wait(
        "the members remounted on the new leader (CAPACITY back to 512Mi)",
        &[
            "get",
            "kvcb",
            "mooncake-dram",
            "-o",
            "jsonpath={.status.phase} {.status.capacity.total}",
        ],
        Duration::from_secs(120),
        |s| s == "Ready 512Mi",
    )?;
    println!(
        "full capacity again {:.1}s after the delete",
        t.elapsed().as_secs_f64()
    );
    println!("the new master started empty: {}", master_keys(d)?);
    let before = counters(d, b)?;
    println!("the same prompt to replica B: a cold cache, its store hits do not move:");
    ask(d, b, 2)?;
    let after = counters(d, b)?;
    anyhow::ensure!(
        after.hit_tokens == before.hit_tokens,
        "replica B found the prompt after the failover: {before:?} -> {after:?}"
    );
    println!(
        "replica B: {} more tokens looked up, {} found",
        after.queried_tokens - before.queried_tokens,
        after.hit_tokens - before.hit_tokens
    );
    writes_again(d, b, serving)?;
    d.show(&["get", "kvcb"])?;
    d.show(&["-n", NS, "get", "pods", "-o", "wide"])?;
    Ok(())
}

/// Replica B writes to the new master: fresh prompts until the master's key count is above
/// zero; prints how long after the new leader served that was seen.
fn writes_again(d: &Demo, b: &str, serving: Instant) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seed = 100u32;
    loop {
        let keys = master_keys(d)?;
        // An unreadable figure is an error, not zero keys.
        let count: f64 = keys
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("the master's key count is unreadable: {keys:?}"))?;
        if count > 0.0 {
            println!(
                "replica B writes to the new master: {keys}, seen {:.1}s after the new leader served",
                serving.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "waited 120s for replica B to write to the new master (its key count: {keys})"
        );
        ask(d, b, seed)?;
        seed += 1;
    }
}
