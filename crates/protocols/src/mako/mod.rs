//! Mako (OSDI'25): speculative OCC with two-phase commit whose replication runs in the
//! background; a transaction is reported committed once its timestamp is covered by every
//! shard's replicated watermark, and a leader failure discards the speculative transactions
//! above the stable watermark of the failed epoch.
//!
//! **Status: the safety core only.** The watermark and epoch rules ([`watermark`]) that
//! decide when a speculative commit is durable and which commits a failover discards, and the
//! replicated state of a shard's stream ([`stream`]: pending commits, durability in timestamp
//! order, epoch end and start) are written and tested here. The leader's speculative
//! participant, the stream's hosting on Raft (snapshots included), the coordinator and the
//! node are not, and `--protocol mako` does not exist yet.
//!
//! The design the module serves:
//! - a shard's Raft leader runs OCC on a speculative in-memory store: it validates, votes and
//!   applies commits at once, and proposes every commit to the shard's Raft log (the stream);
//!   followers keep a durable store plus the committed entries not yet durable;
//! - proposals are Lamport timestamps (above the keys' versions, the shard's last timestamp
//!   and its clock) and a transaction commits at the largest, so a reader's timestamp is above
//!   every writer it read;
//! - each stream entry carries the leader's watermark candidate at proposal time, so the
//!   watermark a shard may advertise is the candidate of its last Raft-committed entry;
//! - a commit is durable once its timestamp is at or below every shard's watermark in its
//!   epoch (every shard, since a reader may depend on writers at shards it never touched);
//! - a Raft leader change closes the epoch: every shard freezes and logs its final watermark,
//!   the stable point is their minimum, commits of the epoch above it are discarded and their
//!   clients told, the rest become durable.

pub mod stream;
pub mod watermark;
