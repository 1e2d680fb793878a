//! What the nemesis checks once the servers have stopped: each server's state rebuilt
//! offline from its data directory (as a restart would rebuild it), then
//!
//! - **lost**: the writes of acknowledged commits that no replica of their shard holds (for a
//!   workload that can tell: `list-append`);
//! - **replicas equal**: the replicas of each shard hold the same latest value for every key;
//! - **store checks**: the workload's checks of the final state (`bank`'s money), on each
//!   replica index's copy of every shard.

use meridian_core::key::Key;
use meridian_core::{ConfigError, NodeId, ShardId};
use meridian_node::cluster_file::ClusterFile;
use meridian_storage::MvccStore;
use meridian_workloads::{CheckResult, InvariantCheck};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Most differing shards a report lists.
const EXAMPLES_MAX: usize = 5;

/// One shard replica's final state: key → latest value (deleted keys absent).
pub(super) type Image = BTreeMap<Key, Vec<u8>>;

/// The findings.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Acknowledged writes no replica holds; `None` when the workload cannot tell.
    pub lost: Option<Vec<String>>,
    /// Acknowledged writes a replica lacks while another of its shard holds them, per node.
    pub lagging: BTreeMap<NodeId, usize>,
    /// Shards whose replicas differ, with the first difference.
    pub unequal: Vec<String>,
    /// The workload's store checks, per replica index.
    pub checks: Vec<(u32, CheckResult)>,
    /// Log index each node's rebuild reached.
    pub rebuilt: BTreeMap<NodeId, u64>,
}

impl Verdict {
    /// True when nothing was lost, the replicas agree and every store check passed.
    pub fn passed(&self) -> bool {
        self.lost.as_ref().is_none_or(Vec::is_empty)
            && self.unequal.is_empty()
            && self.checks.iter().all(|(_, c)| c.passed)
    }
}

/// Rebuilds every server of `file` from `data_dirs` and judges the result with `checker`
/// (which saw the run's requests).
pub fn judge(
    file: &ClusterFile,
    data_dirs: &[(NodeId, PathBuf)],
    checker: &dyn InvariantCheck,
) -> Result<Verdict, ConfigError> {
    let topology = &file.topology;
    let mut images: BTreeMap<(ShardId, u32), (NodeId, Image)> = BTreeMap::new();
    let mut verdict = Verdict::default();
    for (node, dir) in data_dirs {
        let slots = &topology.nodes[node.0 as usize].replicas;
        let replayed = meridian_node::rebuild_data_dir(file, node.0, dir, &mut |stores| {
            for (shard, store) in stores {
                let replica = slots.iter().find(|s| s.shard == *shard).map_or(0, |s| s.replica);
                let image: Image = store
                    .latest_values()
                    .filter_map(|(k, v)| v.value.clone().map(|value| (k.clone(), value)))
                    .collect();
                images.insert((*shard, replica), (*node, image));
            }
        })?;
        verdict.rebuilt.insert(*node, replayed.log_index);
    }
    let stores: BTreeMap<(ShardId, u32), (NodeId, MvccStore)> = images
        .iter()
        .map(|(slot, (node, image))| {
            let mut store = MvccStore::new();
            for (key, value) in image {
                store.load(key.clone(), value.clone());
            }
            (*slot, (*node, store))
        })
        .collect();
    verdict.lost = lost(&stores, checker, &mut verdict.lagging);
    verdict.unequal = unequal(&images, topology.shards, topology.replicas);
    if checker.needs_stores() {
        for replica in 0..topology.replicas {
            let copy: Vec<(ShardId, &MvccStore)> = stores
                .iter()
                .filter(|((_, r), _)| *r == replica)
                .map(|((shard, _), (_, store))| (*shard, store))
                .collect();
            for check in checker.check(&copy) {
                verdict.checks.push((replica, check));
            }
        }
    }
    Ok(verdict)
}

/// The acknowledged writes missing from every replica of their shard; counts, per node, those
/// missing from it while another replica of its shard holds them.
pub(super) fn lost(
    stores: &BTreeMap<(ShardId, u32), (NodeId, MvccStore)>,
    checker: &dyn InvariantCheck,
    lagging: &mut BTreeMap<NodeId, usize>,
) -> Option<Vec<String>> {
    let mut missing: Vec<(ShardId, NodeId, BTreeSet<String>)> = Vec::new();
    for ((shard, _), (node, store)) in stores {
        let set = checker.acknowledged_missing(&[(*shard, store)])?.into_iter().collect();
        missing.push((*shard, *node, set));
    }
    let mut lost: BTreeSet<String> = BTreeSet::new();
    let shards: BTreeSet<ShardId> = missing.iter().map(|(s, _, _)| *s).collect();
    for shard in shards {
        let mut sets = missing.iter().filter(|(s, _, _)| *s == shard).map(|(_, _, set)| set);
        let Some(first) = sets.next() else { continue };
        let mut everywhere = first.clone();
        for set in sets {
            everywhere.retain(|item| set.contains(item));
        }
        lost.extend(everywhere);
    }
    for (_, node, set) in &missing {
        let behind = set.iter().filter(|item| !lost.contains(*item)).count();
        if behind > 0 {
            *lagging.entry(*node).or_default() += behind;
        }
    }
    Some(lost.into_iter().collect())
}

/// Shards whose replicas' images differ, each with its first differing key.
pub(super) fn unequal(
    images: &BTreeMap<(ShardId, u32), (NodeId, Image)>,
    shards: u32,
    replicas: u32,
) -> Vec<String> {
    let mut found = Vec::new();
    for shard in (0..shards).map(ShardId) {
        let Some((first_node, first)) = images.get(&(shard, 0)) else {
            found.push(format!("shard {shard}: replica 0 was not rebuilt"));
            continue;
        };
        for replica in 1..replicas {
            let Some((node, image)) = images.get(&(shard, replica)) else {
                found.push(format!("shard {shard}: replica {replica} was not rebuilt"));
                continue;
            };
            if image == first {
                continue;
            }
            let keys: BTreeSet<&Key> = first.keys().chain(image.keys()).collect();
            let differing: Vec<&&Key> =
                keys.iter().filter(|k| first.get(**k) != image.get(**k)).collect();
            let example = differing.first().map_or(String::new(), |k| {
                let len = |i: &Image| i.get(**k).map_or(0, Vec::len);
                format!(
                    "; first at {k:?}: {} bytes on {first_node}, {} on {node}",
                    len(first),
                    len(image)
                )
            });
            found.push(format!(
                "shard {shard}: {first_node} and {node} differ at {} of {} keys{example}",
                differing.len(),
                keys.len()
            ));
            if found.len() >= EXAMPLES_MAX {
                return found;
            }
        }
    }
    found
}
