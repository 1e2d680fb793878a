//! The protocol kit: the machinery every protocol stands on, so that protocols differ only in
//! what makes them different. A protocol is one module that uses these pieces:
//!
//! - [`host`]: runs a per-shard [`host::StateMachine`] on the shard's replicated log
//!   (validate then propose, apply in log order, answer from the leader, read-index reads,
//!   snapshots, restart from disk, leadership hand-back, coalesced log messages).
//! - [`coord`]: the coordinator's attempt ids (with the node's incarnation) and attempt
//!   timestamps (unique across coordinators), leader cache, request table with backoff, and a
//!   plan bound to shards and run in waves of pieces.
//! - [`twopc`]: decided attempts with the forgetting rule, inquiries among participants
//!   (termination without a coordinator, settling old commits), and a coordinator's paced
//!   delivery of decisions.
//! - [`exec`]: running pieces over a read source (latest, at a timestamp) with the attempt's
//!   own writes overlaid, checking each piece's contract.
//! - [`locks`]: a lock table with shared, exclusive and range locks, no-wait and wound-wait.
//! - [`timers`]: the node's timer table.
//!
//! `docs/protocols/kit.md` describes them and `docs/protocols/README.md` how to add a protocol
//! with them.

pub mod coord;
pub mod exec;
pub mod host;
pub mod locks;
pub mod timers;
pub mod twopc;
