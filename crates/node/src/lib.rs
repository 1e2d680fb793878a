//! Meridian nodes as processes: the cluster file, a server's start-up (log, stores, listeners,
//! metrics, signals), a client-side coordinator node for the client library, and the offline
//! rebuild of a stopped server's data (`meridian verify`). Used by the `meridian` binary, the
//! benchmark harness and the client library, so that a client links neither the harness nor
//! the simulator.

pub mod client;
pub mod cluster_file;
pub mod context;
pub mod control;
pub mod server;
pub mod tls;

pub use client::{probe_servers, start_client_node, ClientNode, SESSION_LEASE_NS_MAX};
pub use server::{rebuild_data_dir, run_server, verify_data_dir, ServeError, ServerSettings};
