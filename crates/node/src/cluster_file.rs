//! The cluster file (TOML): what a multi-process cluster runs and where each node listens.
//! `docs/cluster.md` documents the format. Both `meridian server` and `meridian bench --cluster`
//! read the same file; its hash (with the procedure registry) is the fingerprint every TCP
//! connection checks, so processes started from different files refuse to talk.

use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::rng::{fnv1a, FNV_OFFSET};
use meridian_core::topology::{NodeInfo, ReplicaSlot, Topology};
use meridian_core::{ConfigError, RegionId, ShardId};
use meridian_protocols::{ProtocolKind, ProtocolOptions};
use meridian_workloads::WorkloadOptions;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNode {
    id: u32,
    region: toml::Spanned<String>,
    addr: toml::Spanned<String>,
    #[serde(default)]
    replicas: Vec<(u32, u32)>,
    #[serde(default)]
    coordinator: bool,
    /// Where the node's server serves Prometheus metrics (`meridian server` and `cluster up`
    /// use it unless `--metrics-addr` says otherwise).
    #[serde(default)]
    metrics_addr: Option<toml::Spanned<String>>,
    /// The node's certificate (PEM), signed by `tls_ca`.
    #[serde(default)]
    tls_cert: Option<String>,
    /// Its private key (PEM).
    #[serde(default)]
    tls_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    protocol: String,
    workload: String,
    shards: u32,
    replicas: toml::Spanned<u32>,
    network: String,
    #[serde(default)]
    regions: Option<usize>,
    clock: Option<String>,
    seed: Option<u64>,
    keys_per_shard: Option<u64>,
    zipf: Option<f64>,
    #[serde(default)]
    ops_max: Option<u32>,
    #[serde(default)]
    distribution: Option<String>,
    #[serde(default)]
    region_groups: Option<u32>,
    #[serde(default)]
    warehouses_per_shard: Option<u64>,
    #[serde(default)]
    remote_item_pct: Option<u64>,
    #[serde(default)]
    remote_payment_pct: Option<u64>,
    #[serde(default)]
    tpcc_mode: Option<String>,
    #[serde(default)]
    tpcc_scale: Option<String>,
    #[serde(default)]
    snapshot_interval: Option<toml::Spanned<u64>>,
    #[serde(default)]
    log_store: Option<toml::Spanned<String>>,
    /// `[protocol_options]`: name = value (strings, numbers or booleans).
    #[serde(default)]
    protocol_options: Option<toml::Spanned<toml::Table>>,
    /// The CA certificate (PEM) every node's certificate must chain to.
    #[serde(default)]
    tls_ca: Option<String>,
    /// Plain TCP, said explicitly (benchmarks on loopback).
    #[serde(default)]
    insecure: Option<toml::Spanned<bool>>,
    #[serde(default)]
    node: Vec<FileNode>,
}

/// How the file's nodes talk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Security {
    /// Plain TCP (`insecure = true`).
    Insecure,
    /// Mutual TLS: the CA and, per node, its certificate and key (paths resolved against the
    /// file's folder).
    Tls {
        /// The CA certificate.
        ca: std::path::PathBuf,
        /// `(certificate, key)` per node, by node id.
        nodes: Vec<(std::path::PathBuf, std::path::PathBuf)>,
    },
}

/// A parsed, checked cluster file.
#[derive(Clone, Debug)]
pub struct ClusterFile {
    /// The protocol.
    pub protocol: ProtocolKind,
    /// The protocol's options (`[protocol_options]`).
    pub protocol_options: ProtocolOptions,
    /// Workload name.
    pub workload: String,
    /// Workload options.
    pub workload_options: WorkloadOptions,
    /// The layout.
    pub topology: Topology,
    /// The link model.
    pub network: NetworkModel,
    /// The clock model.
    pub clock: ClockModel,
    /// Master seed.
    pub seed: u64,
    /// Commands each shard replica applies between snapshots (`snapshot_interval`).
    pub snapshot_interval_entries: u64,
    /// The servers' durable store (`log_store`: file, the default, or fjall).
    pub log_store: meridian_runtime::logstore::LogStoreKind,
    /// Listening address per node.
    pub addrs: Vec<SocketAddr>,
    /// Metrics address per node, where the file gives one.
    pub metrics_addrs: Vec<Option<SocketAddr>>,
    /// Hash of the file's text.
    pub text_hash: u64,
    /// Plain TCP or mutual TLS.
    pub security: Security,
}

impl ClusterFile {
    /// Reads and checks a cluster file; a relative network file is resolved next to it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        Self::parse(&path.display().to_string(), &text, path.parent())
    }

    /// Parses and checks cluster file text.
    pub fn parse(name: &str, text: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        let file: File = toml::from_str(text)
            .map_err(|e| ConfigError::new(format!("{name}: {}", e.to_string().trim())))?;
        let errors = FileErrors { name, text };
        let bad = |message: String| errors.bad(message);
        let replicas = *file.replicas.get_ref();
        if replicas > 0 && replicas.is_multiple_of(2) {
            return Err(errors.bad_at(
                file.replicas.span(),
                format!(
                    "replicas = {replicas} is even: it tolerates no more failed replicas than {} would, and a split can leave no majority; use an odd count",
                    replicas - 1
                ),
            ));
        }
        let protocol = ProtocolKind::parse(&file.protocol).map_err(|e| bad(e.0))?;
        let protocol_options = protocol_options(protocol, file.protocol_options.as_ref(), &errors)?;
        let network =
            load_network(&file.network, file.regions.unwrap_or(1), base).map_err(|e| bad(e.0))?;
        let clock =
            ClockModel::preset(file.clock.as_deref().unwrap_or("perfect")).map_err(|e| bad(e.0))?;
        let (nodes, (addrs, metrics_addrs)) = nodes(&file.node, &network, &errors)?;
        let topology =
            Topology { regions: network.regions.clone(), nodes, shards: file.shards, replicas };
        topology.validate().map_err(|e| bad(e.0))?;
        protocol.check_topology(&topology).map_err(|e| bad(e.0))?;
        let workload_options = workload_options(&file, &errors)?;
        let workload =
            meridian_workloads::build(&file.workload, &workload_options).map_err(|e| bad(e.0))?;
        protocol
            .check_workload(&meridian_workloads::sample(workload.as_ref()), &topology)
            .map_err(|e| bad(e.0))?;
        let snapshot_interval_entries = match &file.snapshot_interval {
            Some(spanned) => {
                check_snapshot_interval(*spanned.get_ref()).map_err(|e| {
                    errors.bad_at(spanned.span(), format!("snapshot_interval: {e}"))
                })?;
                *spanned.get_ref()
            }
            None => meridian_protocols::SNAPSHOT_INTERVAL_ENTRIES,
        };
        let log_store = match &file.log_store {
            Some(spanned) => meridian_runtime::logstore::LogStoreKind::parse(spanned.get_ref())
                .map_err(|e| errors.bad_at(spanned.span(), format!("log_store: {e}")))?,
            None => meridian_runtime::logstore::LogStoreKind::File,
        };
        let security = security(&file, base, &errors)?;
        Ok(Self {
            security,
            protocol,
            protocol_options,
            workload: file.workload,
            workload_options,
            topology,
            network,
            clock,
            seed: file.seed.unwrap_or(1),
            snapshot_interval_entries,
            log_store,
            addrs,
            metrics_addrs,
            text_hash: fnv1a(FNV_OFFSET, text.as_bytes()),
        })
    }
}

/// The file's `insecure` or TLS settings, checked for consistency (files are read when a node
/// starts: [`crate::tls::load`]).
fn security(
    file: &File,
    base: Option<&Path>,
    errors: &FileErrors<'_>,
) -> Result<Security, ConfigError> {
    let with_cert: Vec<u32> = file
        .node
        .iter()
        .filter(|n| n.tls_cert.is_some() || n.tls_key.is_some())
        .map(|n| n.id)
        .collect();
    let any_tls = file.tls_ca.is_some() || !with_cert.is_empty();
    match &file.insecure {
        Some(insecure) if *insecure.get_ref() && any_tls => {
            return Err(errors.bad_at(
                insecure.span(),
                "insecure = true and TLS certificates are both given: choose one".into(),
            ))
        }
        Some(insecure) if *insecure.get_ref() => return Ok(Security::Insecure),
        _ => {}
    }
    let resolve = |path: &str| base.map_or_else(|| Path::new(path).to_path_buf(), |b| b.join(path));
    let Some(ca) = &file.tls_ca else {
        return Err(errors.bad(if with_cert.is_empty() {
            "nodes talk over TLS unless the file says insecure = true: give tls_ca and each \
             node's tls_cert and tls_key (`meridian cert --config FILE` makes them), or set \
             insecure = true for plain TCP"
                .into()
        } else {
            "nodes have certificates but tls_ca (the CA certificate) is missing".into()
        }));
    };
    let mut nodes = Vec::with_capacity(file.node.len());
    for node in &file.node {
        match (&node.tls_cert, &node.tls_key) {
            (Some(cert), Some(key)) => nodes.push((resolve(cert), resolve(key))),
            (None, None) => {
                return Err(errors.bad(format!(
                    "node {} has no tls_cert and tls_key while the file gives tls_ca: a \
                     cluster cannot mix TLS and plain nodes",
                    node.id
                )))
            }
            _ => {
                return Err(errors.bad(format!("node {} needs both tls_cert and tls_key", node.id)))
            }
        }
    }
    Ok(Security::Tls { ca: resolve(ca), nodes })
}

/// Errors about a cluster file named `name`, whose text is `text`.
struct FileErrors<'a> {
    name: &'a str,
    text: &'a str,
}

impl FileErrors<'_> {
    /// An error about the file.
    fn bad(&self, message: String) -> ConfigError {
        ConfigError::new(format!("{}: {message}", self.name))
    }

    /// An error about one value, naming the line it is on (`span` is its place in the text).
    fn bad_at(&self, span: std::ops::Range<usize>, message: String) -> ConfigError {
        let line = self.text[..span.start.min(self.text.len())].matches('\n').count() + 1;
        ConfigError::new(format!("{} line {line}: {message}", self.name))
    }
}

/// The protocol's options from `[protocol_options]` (strings as they are, booleans as on and
/// off, numbers as written), or its defaults without the table.
fn protocol_options(
    protocol: ProtocolKind,
    table: Option<&toml::Spanned<toml::Table>>,
    errors: &FileErrors<'_>,
) -> Result<ProtocolOptions, ConfigError> {
    match table {
        Some(table) => {
            let given: Vec<(String, String)> = table
                .get_ref()
                .iter()
                .map(|(name, value)| {
                    let text = match value {
                        toml::Value::String(s) => s.clone(),
                        toml::Value::Boolean(true) => "on".into(),
                        toml::Value::Boolean(false) => "off".into(),
                        other => other.to_string(),
                    };
                    (name.clone(), text)
                })
                .collect();
            protocol
                .options(&given)
                .map_err(|e| errors.bad_at(table.span(), format!("[protocol_options]: {e}")))
        }
        None => protocol.options(&[]).map_err(|e| errors.bad(e.0)),
    }
}

/// Each node's listening address and metrics address, if any.
type NodeAddrs = (Vec<SocketAddr>, Vec<Option<SocketAddr>>);

/// The `[[node]]` entries as the topology's nodes, with their listening and metrics
/// addresses: ids in order from 0, regions of `network`, every address distinct.
fn nodes(
    file_nodes: &[FileNode],
    network: &NetworkModel,
    errors: &FileErrors<'_>,
) -> Result<(Vec<NodeInfo>, NodeAddrs), ConfigError> {
    let mut nodes = Vec::with_capacity(file_nodes.len());
    let mut addrs: Vec<SocketAddr> = Vec::with_capacity(file_nodes.len());
    let mut metrics_addrs: Vec<Option<SocketAddr>> = Vec::with_capacity(file_nodes.len());
    for (index, node) in file_nodes.iter().enumerate() {
        if node.id as usize != index {
            return Err(errors.bad(format!(
                "node ids must be 0, 1, 2, ... in order; entry {index} has id {}",
                node.id
            )));
        }
        let region_name = node.region.get_ref();
        let region = network.regions.iter().position(|r| r == region_name).ok_or_else(|| {
            errors.bad_at(
                node.region.span(),
                format!(
                    "node {} is in unknown region '{region_name}'; regions: {}",
                    node.id,
                    network.regions.join(", ")
                ),
            )
        })?;
        let addr_text = node.addr.get_ref();
        let addr: SocketAddr = addr_text.parse().map_err(|e| {
            errors.bad_at(node.addr.span(), format!("node {}: address '{addr_text}': {e}", node.id))
        })?;
        if let Some(other) = addrs.iter().position(|a| *a == addr) {
            return Err(errors.bad_at(
                node.addr.span(),
                format!("nodes {other} and {} share the address {addr}", node.id),
            ));
        }
        addrs.push(addr);
        metrics_addrs.push(match &node.metrics_addr {
            None => None,
            Some(text) => {
                let metrics: SocketAddr = text.get_ref().parse().map_err(|e| {
                    let what =
                        format!("node {}: metrics address '{}': {e}", node.id, text.get_ref());
                    errors.bad_at(text.span(), what)
                })?;
                Some(metrics)
            }
        });
        nodes.push(NodeInfo {
            region: RegionId(region as u32),
            replicas: node
                .replicas
                .iter()
                .map(|&(shard, replica)| ReplicaSlot { shard: ShardId(shard), replica })
                .collect(),
            coordinator: node.coordinator,
        });
    }
    // A metrics address may be no node's address and no other node's metrics address.
    for (node, metrics_addr) in metrics_addrs.iter().enumerate() {
        let Some(metrics_addr) = metrics_addr else { continue };
        let clash = addrs.iter().position(|a| a == metrics_addr).or_else(|| {
            metrics_addrs
                .iter()
                .position(|m| m.as_ref() == Some(metrics_addr))
                .filter(|&m| m != node)
        });
        if let Some(other) = clash {
            return Err(errors.bad(format!(
                "node {node}'s metrics address {metrics_addr} is also node {other}'s address"
            )));
        }
    }
    Ok((nodes, (addrs, metrics_addrs)))
}

/// The workload's options from the file's keys (defaults where it has none).
fn workload_options(file: &File, errors: &FileErrors<'_>) -> Result<WorkloadOptions, ConfigError> {
    Ok(WorkloadOptions {
        shards: file.shards,
        keys_per_shard: file.keys_per_shard.unwrap_or(100_000),
        zipf_theta: file.zipf,
        ops_max: file.ops_max,
        distribution: file.distribution.clone(),
        region_groups: file.region_groups,
        tpcc: meridian_workloads::tpcc::TpccOptions::from_flags(
            file.warehouses_per_shard,
            file.remote_item_pct,
            file.remote_payment_pct,
            file.tpcc_mode.as_deref(),
            file.tpcc_scale.as_deref(),
        )
        .map_err(|e| errors.bad(e.0))?,
    })
}

/// A network preset name, or a matrix file path (relative to `base`).
pub fn load_network(
    spec: &str,
    regions: usize,
    base: Option<&Path>,
) -> Result<NetworkModel, ConfigError> {
    if meridian_core::netmodel::PRESETS.contains(&spec) {
        return NetworkModel::preset(spec, regions);
    }
    let looks_like_file = spec.ends_with(".toml") || spec.contains('/');
    if !looks_like_file {
        return NetworkModel::preset(spec, regions); // Names the accepted presets.
    }
    let path = match base {
        Some(dir) if Path::new(spec).is_relative() => dir.join(spec),
        _ => Path::new(spec).to_path_buf(),
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError::new(format!("network file {}: {e}", path.display())))?;
    NetworkModel::from_toml(&path.display().to_string(), &text)
}

/// Checks a snapshot interval (commands between snapshots).
pub fn check_snapshot_interval(entries: u64) -> Result<(), String> {
    let min = meridian_protocols::SNAPSHOT_INTERVAL_ENTRIES_MIN;
    if entries < min {
        return Err(format!("{entries} commands between snapshots; at least {min}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        protocol = "occ"
        workload = "micro-luigi"
        shards = 1
        replicas = 1
        network = "lan"
        insecure = true
        [[node]]
        id = 0
        region = "r0"
        addr = "127.0.0.1:7100"
        replicas = [[0, 0]]
        [[node]]
        id = 1
        region = "r0"
        addr = "127.0.0.1:7101"
        coordinator = true
    "#;

    #[test]
    fn a_good_file_parses() {
        let file = ClusterFile::parse("c.toml", GOOD, None).unwrap();
        assert_eq!(file.topology.nodes.len(), 2);
        assert_eq!(file.topology.coordinators(), vec![meridian_core::NodeId(1)]);
        assert_eq!(file.addrs[1].port(), 7101);
        assert_eq!(file.snapshot_interval_entries, meridian_protocols::SNAPSHOT_INTERVAL_ENTRIES);
        let tuned = GOOD.replace("network = \"lan\"", "network = \"lan\"\nsnapshot_interval = 64");
        let file = ClusterFile::parse("c.toml", &tuned, None).unwrap();
        assert_eq!(file.snapshot_interval_entries, 64);
        assert_eq!(file.security, Security::Insecure);
        // TLS: paths resolve against the file's folder.
        let tls = GOOD.replace("insecure = true", "tls_ca = \"certs/ca.pem\"").replace(
            "region = \"r0\"\n",
            "region = \"r0\"\ntls_cert = \"certs/n.pem\"\ntls_key = \"certs/n.key\"\n",
        );
        let file = ClusterFile::parse("c.toml", &tls, Some(Path::new("/etc/m"))).unwrap();
        let Security::Tls { ca, nodes } = &file.security else { panic!("TLS") };
        assert_eq!(ca, Path::new("/etc/m/certs/ca.pem"));
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].1, Path::new("/etc/m/certs/n.key"));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            (GOOD.replace("7101", "7100"), "line 16: nodes 0 and 1 share the address"),
            (
                GOOD.replace(
                    "region = \"r0\"\n        addr = \"127.0.0.1:7101\"",
                    "region = \"mars\"\n        addr = \"127.0.0.1:7101\"",
                ),
                "line 15: node 1 is in unknown region 'mars'",
            ),
            (GOOD.replace("\"occ\"", "\"paxos\""), "unknown protocol 'paxos'"),
            (GOOD.replace("micro-luigi", "tpcx"), "unknown workload 'tpcx'"),
            (GOOD.replace("replicas = [[0, 0]]", ""), "hosted by 0 nodes"),
            (GOOD.replace("id = 1", "id = 5"), "in order"),
            (GOOD.replace("127.0.0.1:7101", "localhost"), "address 'localhost'"),
            (GOOD.replace("shards = 1", "shards = \"one\""), "invalid type"),
            (GOOD.replace("network = \"lan\"", "network = \"moon\""), "unknown network preset"),
            (GOOD.replace("replicas = 1", "replicas = 3"), "replica 1 is hosted by 0 nodes"),
            (GOOD.replace("replicas = 1\n", "replicas = 2\n"), "line 5: replicas = 2 is even"),
            (
                GOOD.replace("network = \"lan\"", "network = \"lan\"\nsnapshot_interval = 3"),
                "line 7: snapshot_interval: 3 commands between snapshots; at least 8",
            ),
            (
                GOOD.replace("network = \"lan\"", "network = \"lan\"\nlog_store = \"rocks\""),
                "line 7: log_store: unknown log store 'rocks'; accepted: file, fjall",
            ),
            (GOOD.replace("insecure = true\n", ""), "nodes talk over TLS unless the file says insecure = true"),
            (
                GOOD.replace("insecure = true", "insecure = true\ntls_ca = \"ca.pem\""),
                "line 7: insecure = true and TLS certificates are both given",
            ),
            (
                GOOD.replace("insecure = true", "tls_ca = \"ca.pem\"").replacen(
                    "replicas = [[0, 0]]",
                    "replicas = [[0, 0]]\ntls_cert = \"n0.pem\"\ntls_key = \"n0.key\"",
                    1,
                ),
                "node 1 has no tls_cert and tls_key while the file gives tls_ca: a cluster cannot mix TLS and plain nodes",
            ),
            (
                GOOD.replace("insecure = true", "tls_ca = \"ca.pem\"").replacen(
                    "replicas = [[0, 0]]",
                    "replicas = [[0, 0]]\ntls_cert = \"n0.pem\"",
                    1,
                ),
                "node 0 needs both tls_cert and tls_key",
            ),
            (
                GOOD.replace("insecure = true\n", "").replacen(
                    "replicas = [[0, 0]]",
                    "replicas = [[0, 0]]\ntls_cert = \"n0.pem\"\ntls_key = \"n0.key\"",
                    1,
                ),
                "nodes have certificates but tls_ca (the CA certificate) is missing",
            ),
        ];
        for (text, expected) in cases {
            let err = ClusterFile::parse("c.toml", &text, None).unwrap_err();
            assert!(err.0.contains(expected), "expected '{expected}' in: {err}");
            assert!(err.0.starts_with("c.toml"), "{err}");
        }
    }

    #[test]
    fn mutated_files_are_refused_or_parsed_never_panic() {
        // Bounded property test (the `cluster_file` fuzz target runs it unbounded).
        let mut rng = meridian_core::rng::child_rng(3, "cluster-file-property", 0);
        let alphabet = b"[]{}=,.\"#0123456789 \nabcdefghijklmnopqrstuvwxyz_";
        for _ in 0..3_000 {
            let bytes = meridian_core::testing::mutate(&mut rng, GOOD.as_bytes(), alphabet, 4);
            let Ok(text) = String::from_utf8(bytes) else { continue };
            if let Err(e) = ClusterFile::parse("c.toml", &text, None) {
                assert!(e.0.starts_with("c.toml"), "{e}");
            }
        }
    }
}
