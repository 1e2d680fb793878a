//! A cluster file's TLS files, read and checked when a process starts its nodes: the CA
//! certificate, and each local node's certificate and key, which must chain to the CA, be
//! valid now and name that node. Any problem is one line naming the node and the file, before
//! anything listens or is written.

use crate::cluster_file::{ClusterFile, Security};
use meridian_core::{ConfigError, NodeId};
use meridian_runtime::tls::{NodeKeys, Tls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Largest PEM file read (a certificate chain or a key is a few KiB).
pub const PEM_BYTES_MAX: u64 = 1 << 20;

/// The TLS sessions of `local` nodes of `file`, or `None` for an `insecure` file.
pub fn load(file: &ClusterFile, local: &[NodeId]) -> Result<Option<Arc<Tls>>, ConfigError> {
    let Security::Tls { ca, nodes } = &file.security else { return Ok(None) };
    let ca_certs = certificates(ca, "tls_ca")?;
    let mut keys = BTreeMap::new();
    for &node in local {
        let (cert, key) = nodes
            .get(node.0 as usize)
            .ok_or_else(|| ConfigError::new(format!("node {node} is not in the cluster file")))?;
        let chain = certificates(cert, &format!("node {node}'s tls_cert"))?;
        let text = read_bounded(key, &format!("node {node}'s tls_key"))?;
        let key = PrivateKeyDer::from_pem_slice(&text).map_err(|e| {
            ConfigError::new(format!(
                "node {node}'s tls_key {}: no private key: {e}",
                key.display()
            ))
        })?;
        keys.insert(node, NodeKeys { chain, key });
    }
    let checks: Vec<(NodeId, NodeKeys)> = keys
        .iter()
        .map(|(node, k)| (*node, NodeKeys { chain: k.chain.clone(), key: k.key.clone_key() }))
        .collect();
    let tls = Tls::new(&ca_certs, keys).map_err(ConfigError::new)?;
    for (node, keys) in &checks {
        tls.check_own(*node, keys).map_err(ConfigError::new)?;
    }
    Ok(Some(Arc::new(tls)))
}

fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| ConfigError::new(format!("{what} {}: {e}", path.display())))?;
    let mut bytes = Vec::new();
    file.take(PEM_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ConfigError::new(format!("{what} {}: {e}", path.display())))?;
    if bytes.len() as u64 > PEM_BYTES_MAX {
        return Err(ConfigError::new(format!(
            "{what} {}: larger than {PEM_BYTES_MAX} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let text = read_bounded(path, what)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&text).collect();
    let certs =
        certs.map_err(|e| ConfigError::new(format!("{what} {}: not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ConfigError::new(format!("{what} {}: no certificate in it", path.display())));
    }
    Ok(certs)
}
