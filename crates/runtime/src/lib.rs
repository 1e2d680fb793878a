//! Meridian runtime: drives the same sans-IO nodes as the simulator, in real time, with tokio.
//!
//! - Each node runs in its own task that owns the node, its timers, its outgoing link states
//!   and (for coordinators in a benchmark) its clients. The task obeys the contract in
//!   `meridian_core::node`: one call at a time, then the outbox drained in order.
//! - Nodes in the same process talk over bounded in-process channels; nodes in other processes
//!   over TCP ([`tcp`]): length-delimited postcard frames, one connection per ordered node pair,
//!   a writer task per connection that batches whatever is queued.
//! - WAN delay is injected on the sender side, per directed link, from the same link model the
//!   simulator uses: a message's delivery time is sampled when it is sent, and the process's
//!   delay thread holds it until then ([`delay`]). Zero-delay links skip it.
//! - [`metrics`]: node tasks publish snapshots for an optional Prometheus endpoint.
//! - Every received message carries its sender's wall-clock send time; receivers record the
//!   one-way delay per link so reports can show that the emulation matched the configuration.
//! - Clocks are the wall clock plus the node's configured skew.
//! - [`logstore`]: persist effects go to one storage thread per process, which appends them to
//!   a checksummed log file and syncs once per group of requests (`--durability fsync`), or
//!   complete at once (`memory`).
#![deny(unsafe_code)]

pub mod clock;
pub mod delay;
pub mod inbox;
pub mod incarnation;
pub mod logstore;
pub mod metrics;
pub mod node_task;
pub mod tcp;
pub mod tls;

pub use node_task::{Cluster, LinkDelays, NodeResult};
