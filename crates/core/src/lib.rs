//! Meridian core: the vocabulary every other crate speaks.
//!
//! This crate is sans-IO and deterministic. It never reads a clock, draws OS randomness, spawns a
//! task or touches a file (`clippy.toml` beside this crate forbids it). It holds:
//!
//! - [`ids`] and [`time`]: node, shard, region and transaction ids; nanosecond time and MVCC
//!   timestamps.
//! - [`key`]: the order-preserving key encoding for composite keys.
//! - [`txn`]: the transaction model (procedures made of pieces bound to shards), partitioners and
//!   the procedure registry.
//! - [`node`]: **the state-machine contract** every protocol node implements and every driver
//!   (simulator, tokio runtime) obeys. Read its module documentation before writing either side.
//! - [`topology`]: regions, nodes and their roles, as every node sees them.
//! - [`netmodel`] and [`clock`]: the link model (delay, jitter, loss, FIFO) and the clock model
//!   (offset, drift) shared by the simulator and the runtime, with the named presets.
//! - [`wire`]: length-delimited frames with a maximum size and a sans-IO decoder.
//! - [`fault`]: the fault vocabulary (crash, isolate, partition, clock, disk) the simulator and
//!   real-time runs share: a schedule parsed and checked against a layout, compiled to actions.
//! - [`rng`]: seeded random streams and the few distributions the models need.
//! - [`testing`]: seeded input mutations for bounded property tests of parsers.
#![deny(unsafe_code)]

pub mod clock;
pub mod error;
pub mod fault;
pub mod hash;
pub mod ids;
pub mod key;
pub mod netmodel;
pub mod node;
pub mod rng;
pub mod testing;
pub mod time;
pub mod topology;
pub mod txn;
pub mod wire;

pub use error::ConfigError;
pub use ids::{NodeId, RegionId, RequestId, ShardId, TxnId};
pub use time::{Time, Timestamp};
