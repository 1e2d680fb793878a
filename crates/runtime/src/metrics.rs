//! Prometheus text-format metrics for a running node: node tasks publish a snapshot about once
//! a second ([`METRICS_INTERVAL_NS`]) into a [`MetricsHub`], and a small HTTP listener serves
//! `GET /metrics` from it. Publishing a snapshot, not updating shared counters per message,
//! keeps the hot path free of locks.

use crate::tcp::TcpStats;
use meridian_core::NodeId;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How often a node task publishes its snapshot.
pub const METRICS_INTERVAL_NS: u64 = 1_000_000_000;
/// Largest HTTP request read.
const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a metrics client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Metrics requests served at once; more connections are closed at once.
const REQUESTS_IN_FLIGHT_MAX: usize = 16;

/// One link's one-way delays as a node measured them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkSnapshot {
    /// Messages received.
    pub messages: u64,
    /// Median one-way delay (µs).
    pub p50_us: u64,
    /// 99th percentile (µs).
    pub p99_us: u64,
}

/// What one node publishes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSnapshot {
    /// Per sender: the delays measured.
    pub links: BTreeMap<NodeId, LinkSnapshot>,
    /// The protocol's own counters and gauges (`Node::counters`).
    pub counters: Vec<(&'static str, u64)>,
    /// Each hosted replica's place in its shard's replication (`Node::groups`).
    pub groups: Vec<meridian_core::node::GroupStatus>,
    /// Seconds since the node started.
    pub uptime_s: f64,
}

/// Snapshots of the nodes of this process.
#[derive(Debug, Default)]
pub struct MetricsHub {
    nodes: Mutex<BTreeMap<NodeId, NodeSnapshot>>,
    /// Counters of the whole process (not of one node).
    process: Mutex<Vec<(&'static str, Arc<AtomicU64>)>>,
    tcp: Mutex<Option<Arc<TcpStats>>>,
}

impl MetricsHub {
    /// Replaces `node`'s snapshot.
    pub fn publish(&self, node: NodeId, snapshot: NodeSnapshot) {
        self.nodes.lock().expect("metrics lock").insert(node, snapshot);
    }

    /// Adds a process-wide counter, rendered as `meridian_{name}`.
    pub fn add_process_counter(&self, name: &'static str, counter: Arc<AtomicU64>) {
        self.process.lock().expect("metrics lock").push((name, counter));
    }

    /// Renders the process's TCP transport counters.
    pub fn set_tcp_stats(&self, stats: Arc<TcpStats>) {
        *self.tcp.lock().expect("metrics lock") = Some(stats);
    }

    /// The Prometheus text exposition of every snapshot.
    pub fn render(&self) -> String {
        let nodes = self.nodes.lock().expect("metrics lock").clone();
        let mut text = String::new();
        let mut process: Vec<(&'static str, u64)> = self
            .process
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|(name, c)| (*name, c.load(Ordering::Relaxed)))
            .collect();
        if let Some(tcp) = self.tcp.lock().expect("metrics lock").as_ref() {
            process.extend(tcp.counters());
        }
        for (name, value) in process {
            let _ = writeln!(text, "# TYPE meridian_{name} counter");
            let _ = writeln!(text, "meridian_{name} {value}");
        }
        let _ = writeln!(text, "# HELP meridian_build_info The running version.");
        let _ = writeln!(text, "# TYPE meridian_build_info gauge");
        let _ =
            writeln!(text, "meridian_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        let _ = writeln!(text, "# HELP meridian_uptime_seconds Seconds since the node started.");
        let _ = writeln!(text, "# TYPE meridian_uptime_seconds gauge");
        for (id, n) in &nodes {
            let _ =
                writeln!(text, "meridian_uptime_seconds{{node=\"{}\"}} {:.3}", id.0, n.uptime_s);
        }
        let _ =
            writeln!(text, "# HELP meridian_messages_received_total Messages received, by sender.");
        let _ = writeln!(text, "# TYPE meridian_messages_received_total counter");
        for (id, n) in &nodes {
            for (from, link) in &n.links {
                let _ = writeln!(
                    text,
                    "meridian_messages_received_total{{node=\"{}\",from=\"{}\"}} {}",
                    id.0, from.0, link.messages
                );
            }
        }
        let _ = writeln!(
            text,
            "# HELP meridian_one_way_delay_seconds One-way delay measured by the receiver."
        );
        let _ = writeln!(text, "# TYPE meridian_one_way_delay_seconds summary");
        for (id, n) in &nodes {
            for (from, link) in &n.links {
                for (q, us) in [("0.5", link.p50_us), ("0.99", link.p99_us)] {
                    let _ = writeln!(
                        text,
                        "meridian_one_way_delay_seconds{{node=\"{}\",from=\"{}\",quantile=\"{q}\"}} {:.6}",
                        id.0,
                        from.0,
                        us as f64 / 1e6
                    );
                }
                let _ = writeln!(
                    text,
                    "meridian_one_way_delay_seconds_count{{node=\"{}\",from=\"{}\"}} {}",
                    id.0, from.0, link.messages
                );
            }
        }
        let mut names: Vec<&'static str> =
            nodes.values().flat_map(|n| n.counters.iter().map(|(name, _)| *name)).collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let _ = writeln!(
                text,
                "# TYPE meridian_{name} {}",
                if name.ends_with("_total") { "counter" } else { "gauge" }
            );
            for (id, n) in &nodes {
                for (_, value) in n.counters.iter().filter(|(c, _)| *c == name) {
                    let _ = writeln!(text, "meridian_{name}{{node=\"{}\"}} {value}", id.0);
                }
            }
        }
        if nodes.values().any(|n| !n.groups.is_empty()) {
            let _ =
                writeln!(text, "# HELP meridian_group_leader 1 where the node leads the shard.");
            let _ = writeln!(text, "# TYPE meridian_group_leader gauge");
            let _ = writeln!(
                text,
                "# HELP meridian_group_applied_index Entries of the shard's log applied here."
            );
            let _ = writeln!(text, "# TYPE meridian_group_applied_index gauge");
            for (id, n) in &nodes {
                for g in &n.groups {
                    let labels = format!("node=\"{}\",shard=\"{}\"", id.0, g.shard.0);
                    let _ =
                        writeln!(text, "meridian_group_leader{{{labels}}} {}", u8::from(g.leader));
                    let _ = writeln!(
                        text,
                        "meridian_group_applied_index{{{labels}}} {}",
                        g.applied_index
                    );
                }
            }
        }
        text
    }
}

/// Serves `GET /metrics` from `hub` on `addr` until the task is aborted. Other paths get 404;
/// a request over 8 KiB or one that is not HTTP closes the connection.
pub async fn serve(addr: SocketAddr, hub: Arc<MetricsHub>) -> std::io::Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    let in_flight = Arc::new(tokio::sync::Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
    Ok(tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            let Ok(permit) = in_flight.clone().try_acquire_owned() else { continue };
            let hub = hub.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let mut request = Vec::with_capacity(1024);
                let mut buf = [0u8; 1024];
                let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
                while !request.windows(4).any(|w| w == b"\r\n\r\n")
                    && request.len() < REQUEST_BYTES_MAX
                {
                    match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                        Ok(Ok(n)) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
                let (status, body) = if line.starts_with(b"GET /metrics ") {
                    ("200 OK", hub.render())
                } else {
                    ("404 Not Found", "only GET /metrics is served\n".to_string())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    }))
}
