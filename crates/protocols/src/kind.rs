//! The registry: the one place that lists the protocols ([`ProtocolKind`]), and the way
//! the simulator, the runtime, `bench` and `verify` reach a protocol's type from its name at
//! run time ([`ProtocolKind::visit`]). The protocols depend on the contract in the crate root
//! ([`crate::Protocol`], [`crate::NodeContext`]); only this file depends on the protocols.

use crate::options::ProtocolOptions;
use crate::{chain, luigi, mako, mvto, occ, tiga, twopl};
use crate::{Guarantee, OptionSpec, Protocol};
use meridian_core::error::unknown_name;
use meridian_core::topology::Topology;
use meridian_core::txn::WorkloadSample;
use meridian_core::{ConfigError, NodeId, ShardId};

/// Something to do with a protocol type, chosen at run time by [`ProtocolKind::visit`].
pub trait ProtocolVisitor {
    /// What it returns.
    type Output;
    /// Does it with protocol `P`.
    fn visit<P: Protocol>(self) -> Self::Output;
}

macro_rules! protocols {
    ($($variant:ident => $protocol:ty),* $(,)?) => {
        /// A selectable protocol.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
        pub enum ProtocolKind {
            $(
                #[doc = concat!("`", stringify!($variant), "`")]
                $variant
            ),*
        }

        /// Protocol names `--protocol` accepts, in order.
        pub const PROTOCOLS: &[&str] = &[$(<$protocol as Protocol>::NAME),*];

        impl ProtocolKind {
            /// Every protocol, in order.
            pub const ALL: &[ProtocolKind] = &[$(ProtocolKind::$variant),*];

            /// Runs `visitor` with this protocol's type.
            pub fn visit<V: ProtocolVisitor>(self, visitor: V) -> V::Output {
                match self {
                    $(Self::$variant => visitor.visit::<$protocol>()),*
                }
            }
        }
    };
}

protocols! {
    Occ => occ::Occ,
    TwoPl => twopl::TwoPl,
    Mvto => mvto::Mvto,
    Mako => mako::Mako,
    Tiga => tiga::Tiga,
    Luigi => luigi::Luigi,
    Chain => chain::Chain,
}

/// A protocol's static facts, as plain values.
#[derive(Clone, Copy)]
pub struct ProtocolInfo {
    /// Its name.
    pub name: &'static str,
    /// One line about it.
    pub summary: &'static str,
    /// Its options.
    pub options: &'static [OptionSpec],
    /// The option settings a comparison runs it with.
    pub compare: &'static [&'static [(&'static str, &'static str)]],
    /// What its histories promise with its default options.
    pub guarantee: Guarantee,
    guarantee_with: fn(&ProtocolOptions) -> Guarantee,
    check_topology: fn(&Topology) -> Result<(), ConfigError>,
    check_workload: fn(&WorkloadSample, &Topology) -> Result<(), ConfigError>,
    may_crash: fn(&Topology, NodeId) -> bool,
    latency_bound_ns: LatencyBound,
    initial_leader: fn(&Topology, &ProtocolOptions, ShardId) -> Option<NodeId>,
}

/// [`Protocol::latency_bound_ns`].
type LatencyBound = fn(
    &Topology,
    &meridian_core::netmodel::NetworkModel,
    &ProtocolOptions,
    meridian_core::RegionId,
) -> Option<u64>;

struct InfoOf;

impl ProtocolVisitor for InfoOf {
    type Output = ProtocolInfo;
    fn visit<P: Protocol>(self) -> ProtocolInfo {
        ProtocolInfo {
            name: P::NAME,
            summary: P::SUMMARY,
            options: P::OPTIONS,
            compare: P::COMPARE,
            guarantee: P::GUARANTEE,
            guarantee_with: P::guarantee,
            check_topology: P::check_topology,
            check_workload: P::check_workload,
            may_crash: P::may_crash,
            latency_bound_ns: P::latency_bound_ns,
            initial_leader: P::initial_leader,
        }
    }
}

impl ProtocolKind {
    /// Parses a `--protocol` value.
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .iter()
            .copied()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| unknown_name("protocol", name, PROTOCOLS))
    }

    /// Its static facts.
    pub fn info(self) -> ProtocolInfo {
        self.visit(InfoOf)
    }

    /// The name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// What its committed histories promise when run with `options`.
    pub fn guarantee(self, options: &ProtocolOptions) -> Guarantee {
        (self.info().guarantee_with)(options)
    }

    /// Checks that this protocol can run on `topology`.
    pub fn check_topology(self, topology: &Topology) -> Result<(), ConfigError> {
        (self.info().check_topology)(topology)
    }

    /// Checks that this protocol can run `workload` on `topology`.
    pub fn check_workload(
        self,
        workload: &WorkloadSample,
        topology: &Topology,
    ) -> Result<(), ConfigError> {
        (self.info().check_workload)(workload, topology)
    }

    /// [`Protocol::latency_bound_ns`] of this protocol.
    pub fn latency_bound_ns(
        self,
        topology: &Topology,
        network: &meridian_core::netmodel::NetworkModel,
        options: &ProtocolOptions,
        region: meridian_core::RegionId,
    ) -> Option<u64> {
        (self.info().latency_bound_ns)(topology, network, options, region)
    }

    /// True when `node` may crash without losing acknowledged data.
    pub fn may_crash(self, topology: &Topology, node: NodeId) -> bool {
        (self.info().may_crash)(topology, node)
    }

    /// The node leading each shard (by shard number) when a run on `topology` with
    /// `options` starts; a shard without one (never in a valid layout) gets replica 0's slot
    /// filled by node 0.
    pub fn initial_leaders(self, topology: &Topology, options: &ProtocolOptions) -> Vec<NodeId> {
        let leader = self.info().initial_leader;
        (0..topology.shards)
            .map(|s| leader(topology, options, ShardId(s)).unwrap_or(NodeId(0)))
            .collect()
    }

    /// Validates `name = value` options for this protocol and fills in its defaults.
    pub fn options(self, given: &[(String, String)]) -> Result<ProtocolOptions, ConfigError> {
        let info = self.info();
        ProtocolOptions::parse(info.name, info.options, given)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_is_named_and_parsed_back() {
        for &kind in ProtocolKind::ALL {
            assert_eq!(ProtocolKind::parse(kind.name()), Ok(kind));
            for spec in kind.info().options {
                assert!(spec.name.starts_with(kind.name()), "{} of {}", spec.name, kind.name());
            }
        }
        let error = ProtocolKind::parse("paxos").unwrap_err().0;
        assert!(error.contains("occ"), "{error}");
        assert_eq!(PROTOCOLS.len(), ProtocolKind::ALL.len());
    }

    #[test]
    fn every_comparison_setting_is_a_valid_option_set() {
        for &kind in ProtocolKind::ALL {
            let info = kind.info();
            assert!(!info.compare.is_empty(), "{} runs at least once", info.name);
            for set in info.compare {
                let pairs: Vec<(String, String)> =
                    set.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
                assert!(kind.options(&pairs).is_ok(), "{}: {pairs:?}", info.name);
            }
        }
    }
}
