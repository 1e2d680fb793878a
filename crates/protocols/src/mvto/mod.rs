//! `2pc-mvto`: multi-version timestamp ordering with two-phase commit across shards, each shard
//! a Raft group: the "traditional" system CrossStitch compares against.
//!
//! It shares `occ`'s two-phase commit engine (`crate::occ`: the coordinator's waves of pieces,
//! prepare, decide, deliver; prepare and decision records in each shard's log; termination
//! without a coordinator; the forgetting rule) and differs in the concurrency control:
//!
//! - **Timestamps.** The coordinator gives every attempt a timestamp `ts` when it starts: its
//!   clock, above every timestamp it used or was refused for, unique across coordinators
//!   ([`crate::kit::coord::attempt_ts`]). The attempt reads and writes at `ts` and commits at `ts`.
//! - **Reads** (at the shard leader, in waves; the pieces of one wave run together, so
//!   independent reads overlap) see the newest version strictly below `ts`, even one still
//!   pending: a prepared attempt's writes are pending versions in the store. Reading a pending
//!   version makes the attempt depend on its writer: its prepare on that shard waits at the
//!   leader until the writer is decided, and if the writer aborted, the reader aborts too
//!   (`cascading`). Older committed versions stay readable for the GC retention, so a read
//!   below a newer commit is served from history rather than refused.
//! - **Writes** are buffered at the coordinator and become pending versions at prepare, which
//!   refuses a write of key `k` at `ts` (`timestamp-too-old`) when `k` already has a version at
//!   or above `ts`, or a read at or above `ts` was prepared on `k` (its read stamp), or a
//!   scan over `k`'s range was. A second writer of a key with a pending version is refused
//!   (`lock-denied`): pending versions are the write locks of MVTO.
//! - **Prepare** checks every read again (still the newest version below `ts`, so a failover
//!   that lost the leader's stamps cannot let a smaller write slip under a read), records the
//!   read stamps in the shard's replicated state and votes yes at `ts`. Every participant
//!   proposes the same `ts`, so the commit lands at the attempt's timestamp.
//! - **When reads stamp** (option `2pc-mvto-read-stamps`): `prepare` (the default) stamps a
//!   read when its attempt prepares, so until then a smaller write may still prepare and the
//!   reader fails its check instead (the first to prepare wins, as under OCC). `execution` is
//!   the textbook rule: the leader also stamps a read when it serves it, so a smaller write
//!   arriving before the reader prepared is refused at once (the writer aborts, though the
//!   reader may never commit). Those stamps live only at the leader and are hints; the
//!   replicated stamps decide. Under heavy contention `execution` starves long transactions:
//!   a retry's new timestamp is soon below a newer reader's stamp again (docs/protocols/2pc-mvto.md).
//!
//! The garbage-collection watermark moves only when a command applies (from the clock reading
//! the leader logged with it), so every replica keeps the same history and refuses the same
//! reads below it; a snapshot carries the history, the stamps and the watermark.
//!
//! **Guarantee.** Histories are serializable in timestamp order whatever the clocks do. They are
//! strictly serializable when coordinator clocks are synchronized (an attempt that starts after
//! another finished has a larger timestamp); with skewed clocks a transaction that starts after
//! another committed can be ordered before it. The simulator checks `2pc-mvto` for strict
//! serializability under perfect clocks and for serializability otherwise
//! ([`crate::Guarantee::StrictWithSyncedClocks`]).
//!
//! The reference system keeps each write on one backup server; here every shard is a Raft
//! group like every other protocol's, so a prepare and a decision each cost a log round in the
//! shard's region (docs/protocols/README.md counts the round trips).

pub(crate) mod cc;
pub(crate) mod order;

use crate::engine::{Family, OccNode, Style};
use crate::{Durable, Guarantee, NodeContext, OptionKind, OptionSpec, Protocol, Replayed};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use std::sync::Arc;

/// The `2pc-mvto` protocol.
pub struct Mvto;

/// `2pc-mvto-read-stamps`: when a read raises its key's read timestamp.
pub const OPTION_READ_STAMPS: &str = "2pc-mvto-read-stamps";
/// `2pc-mvto-one-round`: single-shard transactions execute and commit in one round trip.
pub const OPTION_ONE_ROUND: &str = "2pc-mvto-one-round";

impl Protocol for Mvto {
    const NAME: &'static str = "2pc-mvto";
    const SUMMARY: &'static str =
        "multi-version timestamp ordering (cascading aborts) and 2PC across shards over Raft";
    const OPTIONS: &'static [OptionSpec] = &[
        OptionSpec {
            name: OPTION_READ_STAMPS,
            help: "when a read raises its key's read timestamp: prepare (at the reader's \
                   prepare; a smaller write that prepares first wins) or execution (also when \
                   the leader serves the read, the textbook rule; the older writer loses)",
            kind: OptionKind::Choice { values: &["prepare", "execution"], default: "prepare" },
        },
        OptionSpec {
            name: OPTION_ONE_ROUND,
            help: "single-shard transactions are shipped whole to their shard, executed and \
                   committed in one round trip (off: the coordinator relays each wave of \
                   pieces, then commits: the CrossStitch study's traditional system)",
            kind: OptionKind::Choice { values: &["on", "off"], default: "on" },
        },
    ];
    const GUARANTEE: Guarantee = Guarantee::StrictWithSyncedClocks;
    type Node = OccNode;

    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        crate::engine::check_topology(Self::NAME, topology)
    }

    fn may_crash(topology: &Topology, node: NodeId) -> bool {
        crate::engine::may_crash(topology, node)
    }

    fn restore(context: NodeContext, durable: &Durable) -> Result<OccNode, String> {
        OccNode::restore_as(context, durable, family())
    }

    fn replay_committed(node: &mut OccNode) -> Replayed {
        node.replay_committed()
    }
}

/// `2pc-mvto` in the engine: timestamp order, read stamps as the options say.
pub(crate) fn family() -> Family {
    Family {
        name: Mvto::NAME,
        control: Arc::new(|context| {
            let at = context.options.choice(OPTION_READ_STAMPS, Mvto::OPTIONS);
            let stamps_max = context.limits.read_stamps_max;
            Box::new(cc::TimestampOrder::new(stamps_max, at == "execution"))
        }),
        style: Style {
            one_round: (OPTION_ONE_ROUND, Mvto::OPTIONS),
            locks_at_execution: false,
            timestamps: true,
        },
        speculation: None,
    }
}
