//! Meridian benchmark harness: experiment settings, runs on the embedded cluster or against server
//! processes over TCP (whose start-up is `meridian-node`'s), statistics, and reports (`stats.json`
//! and a table).
//!
//! What a run measures (docs/design.md, "Measurement"): closed- or open-loop clients, warm-up
//! discarded; throughput of committed transactions in the measurement window; latency from
//! submission to the client's reply (HDR histogram, µs); aborts by cause; the measured cross-shard
//! fraction; and the one-way delays the receivers saw on every link next to the configured medians.

pub mod ankle;
pub mod experiment;
pub mod faults;
pub mod plots;
pub mod provenance;
pub mod reference;
pub mod report;
pub mod run;
pub mod saved;
pub mod stats;
pub mod study;
pub mod timeline;

pub use experiment::Experiment;
