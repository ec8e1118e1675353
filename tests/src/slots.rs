//! Which node network a cluster of real nodes gets: one of [`SLOTS`] numbered slots, each with
//! its own names (bridge, network namespaces, veths) and address ranges, claimed under a lock
//! so that two clusters on this machine (a kept demo cluster, the suite's test binaries, and a
//! binary whose nodes its watchdog is still tearing down) never take the same one.
//!
//! A slot is taken while its claim names a live process, or while anything of its nodes is
//! still on the machine (a detached `cargo xtask cluster up` outlives its process; a watchdog
//! tears nodes down a moment after theirs is gone). Deriving names from the process id alone
//! let a later binary meet an earlier one's leftovers (`ip netns add kvc801n1: File exists`);
//! a slot counted free while a node's veth outlived its namespace's name did the same
//! (`ip link add kvcv1131 ...: RTNETLINK answers: File exists`).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// How many clusters with nodes this machine can hold at once: every slot's addresses are
/// distinct (`10.220.{20 + slot}.0/24` for the bridge, `10.{100 + slot}.0.0/16` for Pods).
pub const SLOTS: u32 = 100;
/// Where the claims live: one file per slot holding its owner's process id.
const CLAIMS: &str = "/run/kvcache-node-slots";

/// What is on the machine of one slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotState {
    /// Its claim names a process that is running.
    pub owner_alive: bool,
    /// Its bridge, a network namespace, a veth or a run folder of one of its nodes exists.
    pub leftovers: bool,
}

/// The first free slot, starting from `start` and wrapping around; `None` when all are taken.
pub fn choose(start: u32, state: impl Fn(u32) -> SlotState) -> Option<u32> {
    (0..SLOTS).map(|k| (start + k) % SLOTS).find(|&slot| {
        let s = state(slot);
        !s.owner_alive && !s.leftovers
    })
}

/// The names every cluster of `slot` uses: its tag in interface and namespace names.
pub fn tag(slot: u32) -> u32 {
    100 + slot
}

/// Claims a free slot for this process (under a lock on the claims folder) and returns it;
/// the teardown script releases it with [`release_command`].
pub fn claim() -> Result<u32> {
    std::fs::create_dir_all(CLAIMS).map_err(crate::io("the node slot folder"))?;
    let lock =
        File::create(Path::new(CLAIMS).join(".lock")).map_err(crate::io("the node slot lock"))?;
    lock.lock().map_err(crate::io("locking the node slots"))?;
    let states = observe();
    // Claims of processes that are gone and left nothing behind are free: remove them so the
    // folder holds only live claims.
    for (slot, state) in (0..SLOTS).zip(&states) {
        if *state == SlotState::default() {
            let _ = std::fs::remove_file(claim_path(slot));
        }
    }
    let slot =
        choose(std::process::id() % SLOTS, |slot| states[slot as usize]).ok_or_else(|| {
            Error::NodeSetup {
                step: "claiming a node network".into(),
                message: format!(
                    "all {SLOTS} slots are taken (claims in {CLAIMS}); `cargo xtask cluster down` \
                 removes a kept cluster"
                ),
            }
        })?;
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(claim_path(slot))
        .map_err(crate::io("writing a node slot claim"))?;
    write!(f, "{}", std::process::id()).map_err(crate::io("writing a node slot claim"))?;
    Ok(slot)
}

/// The shell line that gives `slot` back (the last line of a teardown script).
pub fn release_command(slot: u32) -> String {
    format!("rm -f {}", claim_path(slot).display())
}

fn claim_path(slot: u32) -> PathBuf {
    Path::new(CLAIMS).join(slot.to_string())
}

/// What of every slot is on this machine now (index = slot), from one listing of the network
/// namespaces and of the nodes' run folder.
fn observe() -> Vec<SlotState> {
    let names = |dir: &str| -> Vec<String> {
        std::fs::read_dir(dir).map_or_else(
            |_| Vec::new(),
            |entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            },
        )
    };
    let nodes: Vec<String> = [names("/run/netns"), names(crate::nodes::RUN_DIR)].concat();
    // A node's veth outlives its namespace's name while a process in it is still exiting.
    let links = names("/sys/class/net");
    (0..SLOTS)
        .map(|slot| {
            let tag = tag(slot);
            let owner_alive = std::fs::read_to_string(claim_path(slot))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .is_some_and(crate::process::alive);
            let node_prefix = format!("kvc{tag}n");
            let veth_prefix = format!("kvcv{tag}");
            let leftovers = Path::new(&format!("/sys/class/net/kvcb{tag}")).exists()
                || links.iter().any(|l| l.starts_with(&veth_prefix))
                || nodes.iter().any(|n| n.starts_with(&node_prefix));
            SlotState {
                owner_alive,
                leftovers,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_with_a_live_owner_or_leftovers_is_skipped() {
        let state = |slot| match slot {
            7 => SlotState {
                owner_alive: true,
                leftovers: false,
            },
            8 => SlotState {
                owner_alive: false,
                leftovers: true,
            },
            _ => SlotState::default(),
        };
        assert_eq!(choose(7, state), Some(9));
        assert_eq!(choose(99, state), Some(99));
        assert_eq!(choose(6, state), Some(6));
    }

    #[test]
    fn the_search_wraps_and_ends() {
        assert_eq!(
            choose(99, |s| SlotState {
                owner_alive: s != 3,
                leftovers: false
            }),
            Some(3)
        );
        assert_eq!(
            choose(0, |_| SlotState {
                owner_alive: true,
                leftovers: true
            }),
            None
        );
    }
}
