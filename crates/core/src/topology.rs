//! The cluster layout every node knows: regions, nodes, which node hosts which replica of which
//! shard, and which nodes coordinate. Node ids are dense (`0..nodes.len()`), so a node's info is
//! `nodes[id]`.

use crate::error::ConfigError;
use crate::ids::{NodeId, RegionId, ShardId};
use serde::{Deserialize, Serialize};

/// Most nodes a cluster may have.
pub const NODES_MAX: usize = 1_024;
/// Most shards a cluster may have.
pub const SHARDS_MAX: u32 = 256;
/// Most replicas per shard.
pub const REPLICAS_MAX: u32 = 9;

/// Where a shard's replicas go among the server regions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Placement {
    /// Replica `r` of shard `s` in server region `(s + r) mod n`: a shard survives the loss
    /// of a region, and its log crosses the wide area.
    #[default]
    Spread,
    /// Every replica of shard `s` in server region `s mod n`, beside its leader: its log
    /// stays local (one datacenter per shard, as in CrossStitch's setting).
    Local,
}

impl Placement {
    /// Parses `spread` or `local`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        match text {
            "spread" => Ok(Self::Spread),
            "local" => Ok(Self::Local),
            other => Err(ConfigError::new(format!(
                "--replica-placement: '{other}' is not spread or local"
            ))),
        }
    }

    /// Its name, as `parse` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spread => "spread",
            Self::Local => "local",
        }
    }
}

/// One replica of one shard hosted by a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReplicaSlot {
    /// The shard.
    pub shard: ShardId,
    /// Its replica index (`0..replicas`); replica 0 is the initial leader.
    pub replica: u32,
}

/// A node's place and duties.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Its region.
    pub region: RegionId,
    /// Replicas it hosts (empty for a pure coordinator).
    pub replicas: Vec<ReplicaSlot>,
    /// True when clients submit transactions here.
    pub coordinator: bool,
}

/// The whole layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Region names; `RegionId(i)` is `regions[i]`.
    pub regions: Vec<String>,
    /// Nodes; `NodeId(i)` is `nodes[i]`.
    pub nodes: Vec<NodeInfo>,
    /// Number of shards.
    pub shards: u32,
    /// Replicas per shard.
    pub replicas: u32,
}

impl Topology {
    /// Checks the layout: every replica of every shard is hosted exactly once, regions exist,
    /// limits hold, and at least one node coordinates.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shards == 0 || self.shards > SHARDS_MAX {
            return Err(ConfigError::new(format!(
                "shards must be in 1..={SHARDS_MAX}, got {}",
                self.shards
            )));
        }
        if self.replicas == 0 || self.replicas > REPLICAS_MAX {
            return Err(ConfigError::new(format!(
                "replicas must be in 1..={REPLICAS_MAX}, got {}",
                self.replicas
            )));
        }
        if self.nodes.is_empty() || self.nodes.len() > NODES_MAX {
            return Err(ConfigError::new(format!(
                "nodes must be in 1..={NODES_MAX}, got {}",
                self.nodes.len()
            )));
        }
        let mut hosted = vec![0u32; (self.shards * self.replicas) as usize];
        for (index, node) in self.nodes.iter().enumerate() {
            if node.region.0 as usize >= self.regions.len() {
                return Err(ConfigError::new(format!(
                    "node {index} is in unknown region {}",
                    node.region.0
                )));
            }
            for slot in &node.replicas {
                if slot.shard.0 >= self.shards || slot.replica >= self.replicas {
                    return Err(ConfigError::new(format!(
                        "node {index} hosts shard {} replica {}, outside {} shards x {} replicas",
                        slot.shard.0, slot.replica, self.shards, self.replicas
                    )));
                }
                hosted[(slot.shard.0 * self.replicas + slot.replica) as usize] += 1;
            }
        }
        if let Some(slot) = hosted.iter().position(|&count| count != 1) {
            let (shard, replica) = (slot as u32 / self.replicas, slot as u32 % self.replicas);
            return Err(ConfigError::new(format!(
                "shard {shard} replica {replica} is hosted by {} nodes; it must be hosted by exactly one",
                hosted[slot]
            )));
        }
        if !self.nodes.iter().any(|n| n.coordinator) {
            return Err(ConfigError::new("no node is a coordinator"));
        }
        Ok(())
    }

    /// The node hosting `replica` of `shard`.
    pub fn replica_node(&self, shard: ShardId, replica: u32) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.replicas.iter().any(|s| s.shard == shard && s.replica == replica))
            .map(|i| NodeId(i as u32))
    }

    /// The nodes hosting `shard`, by replica index.
    pub fn shard_nodes(&self, shard: ShardId) -> Vec<NodeId> {
        (0..self.replicas).filter_map(|r| self.replica_node(shard, r)).collect()
    }

    /// The coordinator nodes.
    pub fn coordinators(&self) -> Vec<NodeId> {
        self.node_ids().filter(|id| self.nodes[id.0 as usize].coordinator).collect()
    }

    /// The coordinators in `regions` (every coordinator when `regions` is empty).
    pub fn coordinators_in(&self, regions: &[RegionId]) -> Vec<NodeId> {
        self.coordinators()
            .into_iter()
            .filter(|&n| regions.is_empty() || regions.contains(&self.region_of(n)))
            .collect()
    }

    /// All node ids in order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// The region of `node`.
    pub fn region_of(&self, node: NodeId) -> RegionId {
        self.nodes[node.0 as usize].region
    }

    /// Builds the standard layout: shard `s` replica `r` on its own node in region
    /// `(s + r) % regions`, and one coordinator node per region (listed after the servers).
    pub fn standard(regions: Vec<String>, shards: u32, replicas: u32) -> Result<Self, ConfigError> {
        let all: Vec<RegionId> = (0..regions.len() as u32).map(RegionId).collect();
        Self::placed(regions, &all, shards, replicas)
    }

    /// The standard layout with replicas only in `server_regions` (replica `r` of shard `s` in
    /// `server_regions[(s + r) % len]`) and a coordinator in every region: the other regions
    /// hold coordinators only (Tiga's remote client region, CrossStitch's remote clients).
    pub fn placed(
        regions: Vec<String>,
        server_regions: &[RegionId],
        shards: u32,
        replicas: u32,
    ) -> Result<Self, ConfigError> {
        Self::placed_with(regions, server_regions, shards, replicas, Placement::Spread)
    }

    /// [`Topology::placed`] with the replicas of each shard placed by `placement`.
    pub fn placed_with(
        regions: Vec<String>,
        server_regions: &[RegionId],
        shards: u32,
        replicas: u32,
        placement: Placement,
    ) -> Result<Self, ConfigError> {
        if regions.is_empty() {
            return Err(ConfigError::new("at least one region is needed"));
        }
        if server_regions.is_empty() || server_regions.iter().any(|r| r.0 as usize >= regions.len())
        {
            return Err(ConfigError::new("the server regions must be regions of the layout"));
        }
        let server_count = server_regions.len() as u32;
        let region_count = regions.len() as u32;
        let mut nodes = Vec::new();
        for shard in 0..shards {
            for replica in 0..replicas {
                nodes.push(NodeInfo {
                    region: match placement {
                        Placement::Spread => {
                            server_regions[((shard + replica) % server_count) as usize]
                        }
                        Placement::Local => server_regions[(shard % server_count) as usize],
                    },
                    replicas: vec![ReplicaSlot { shard: ShardId(shard), replica }],
                    coordinator: false,
                });
            }
        }
        for region in 0..region_count {
            nodes.push(NodeInfo {
                region: RegionId(region),
                replicas: Vec::new(),
                coordinator: true,
            });
        }
        let topology = Self { regions, nodes, shards, replicas };
        topology.validate()?;
        Ok(topology)
    }
}

/// The ids of the regions `names` among `regions`, for `flag` (every name known, none twice);
/// empty for no names.
pub fn region_ids(
    regions: &[String],
    names: &[String],
    flag: &str,
) -> Result<Vec<RegionId>, ConfigError> {
    let mut ids = Vec::with_capacity(names.len());
    for name in names {
        let Some(index) = regions.iter().position(|r| r == name) else {
            return Err(ConfigError::new(format!(
                "{flag}: no region '{name}' in this network; its regions: {}",
                regions.join(", ")
            )));
        };
        let id = RegionId(index as u32);
        if ids.contains(&id) {
            return Err(ConfigError::new(format!("{flag}: region '{name}' is named twice")));
        }
        ids.push(id);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("r{i}")).collect()
    }

    #[test]
    fn standard_layout_hosts_every_replica_once() {
        let t = Topology::standard(names(3), 2, 3).unwrap();
        assert_eq!(t.nodes.len(), 2 * 3 + 3);
        assert_eq!(t.shard_nodes(ShardId(1)).len(), 3);
        assert_eq!(t.coordinators().len(), 3);
        // Replicas of one shard sit in different regions.
        let regions: Vec<RegionId> =
            t.shard_nodes(ShardId(0)).iter().map(|&n| t.region_of(n)).collect();
        assert_eq!(regions, vec![RegionId(0), RegionId(1), RegionId(2)]);
    }

    #[test]
    fn placed_layouts_keep_replicas_in_the_server_regions_and_coordinators_everywhere() {
        let t = Topology::placed(names(4), &[RegionId(0), RegionId(1), RegionId(2)], 3, 3).unwrap();
        for shard in 0..3 {
            let mut regions: Vec<RegionId> =
                t.shard_nodes(ShardId(shard)).iter().map(|&n| t.region_of(n)).collect();
            regions.sort();
            assert_eq!(regions, vec![RegionId(0), RegionId(1), RegionId(2)], "shard {shard}");
        }
        assert_eq!(t.coordinators().len(), 4);
        assert_eq!(t.coordinators_in(&[RegionId(3)]).len(), 1);
        assert_eq!(t.coordinators_in(&[]).len(), 4);
        assert!(Topology::placed(names(2), &[RegionId(2)], 1, 1).is_err());
        assert!(Topology::placed(names(2), &[], 1, 1).is_err());
    }

    #[test]
    fn local_placement_keeps_a_shards_replicas_in_one_region() {
        let servers = [RegionId(0), RegionId(1)];
        let t = Topology::placed_with(names(3), &servers, 3, 3, Placement::Local).unwrap();
        for shard in 0..3 {
            let regions: Vec<RegionId> =
                t.shard_nodes(ShardId(shard)).iter().map(|&n| t.region_of(n)).collect();
            assert_eq!(regions, vec![RegionId(shard % 2); 3], "shard {shard}");
        }
        assert_eq!(Placement::parse("local").unwrap(), Placement::Local);
        assert_eq!(Placement::parse(Placement::Spread.name()).unwrap(), Placement::Spread);
        assert!(Placement::parse("near").is_err());
    }

    #[test]
    fn bad_layouts_are_rejected() {
        assert!(Topology::standard(names(3), 0, 1).is_err());
        assert!(Topology::standard(names(3), 1, 0).is_err());
        assert!(Topology::standard(Vec::new(), 1, 1).is_err());
        let mut t = Topology::standard(names(1), 1, 1).unwrap();
        t.nodes[0].replicas.clear();
        assert!(t.validate().unwrap_err().0.contains("hosted by 0 nodes"));
    }
}
