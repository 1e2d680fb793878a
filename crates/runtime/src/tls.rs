//! Mutual TLS for the TCP transport (rustls): every connection is a TLS session in which both
//! ends show a certificate signed by the cluster's CA, and a node's certificate names it
//! (`node-N.meridian`, [`node_name`]).
//!
//! - The listener requires a client certificate that chains to the CA; a connection without
//!   one, with an expired or foreign one, fails the handshake and no frame of it is decoded.
//! - The hello that follows names the sending node; the listener then checks that the
//!   certificate the connection showed names that node ([`Tls::check_peer`]), so a node holding
//!   node 3's key cannot speak as node 5.
//! - The dialer checks that the server's certificate names the node it dialled.
//!
//! A process holds one key pair per node it runs ([`NodeKeys`]); files and their checks live
//! with the cluster file (`meridian_node`).

use meridian_core::NodeId;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The name a node's certificate carries (a DNS subject alternative name).
pub fn node_name(node: NodeId) -> String {
    format!("node-{}.meridian", node.0)
}

/// One node's certificate chain and key.
pub struct NodeKeys {
    /// The node's certificate first, then any intermediates.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

/// The TLS side of one process's transport: an acceptor and a connector per node it runs.
pub struct Tls {
    acceptors: BTreeMap<NodeId, TlsAcceptor>,
    connectors: BTreeMap<NodeId, TlsConnector>,
    roots: Arc<RootCertStore>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("nodes", &self.acceptors.keys().collect::<Vec<_>>()).finish()
    }
}

/// ring's provider: rustls deprecates it for lacking post-quantum key exchange, but its
/// alternative (aws-lc-rs) needs cmake and a C toolchain in every build, and the clusters this
/// protects are test clusters whose traffic need not outlive a quantum computer.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Sessions for the nodes of `keys`, trusting certificates the CA `ca` signed.
    pub fn new(
        ca: &[CertificateDer<'static>],
        keys: BTreeMap<NodeId, NodeKeys>,
    ) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots.add(cert.clone()).map_err(|e| format!("the CA certificate: {e}"))?;
        }
        let roots = Arc::new(roots);
        let mut acceptors = BTreeMap::new();
        let mut connectors = BTreeMap::new();
        for (node, NodeKeys { chain, key }) in keys {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| format!("node {node}: {e}"))?;
            let server = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain.clone(), key.clone_key())
                .map_err(|e| format!("node {node}'s certificate and key: {e}"))?;
            let client = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots.clone())
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("node {node}'s certificate and key: {e}"))?;
            acceptors.insert(node, TlsAcceptor::from(Arc::new(server)));
            connectors.insert(node, TlsConnector::from(Arc::new(client)));
        }
        Ok(Self { acceptors, connectors, roots })
    }

    /// The acceptor of `node`'s listener.
    pub fn acceptor(&self, node: NodeId) -> Option<&TlsAcceptor> {
        self.acceptors.get(&node)
    }

    /// The connector `node` dials with.
    pub fn connector(&self, node: NodeId) -> Option<&TlsConnector> {
        self.connectors.get(&node)
    }

    /// Checks that `cert` (the certificate a connection showed) names `claimed`, the node its
    /// hello says it is. The chain was checked against the CA in the handshake.
    pub fn check_peer(cert: &CertificateDer<'_>, claimed: NodeId) -> Result<(), String> {
        let entity = webpki::EndEntityCert::try_from(cert)
            .map_err(|e| format!("the connection's certificate does not parse: {e}"))?;
        let name =
            ServerName::try_from(node_name(claimed)).map_err(|e| format!("node name: {e}"))?;
        entity.verify_is_valid_for_subject_name(&name).map_err(|_| {
            format!(
                "the connection's certificate is not node {claimed}'s, yet its hello says it is"
            )
        })
    }

    /// Checks a node's own certificate before it serves: it chains to the CA, is valid now and
    /// names `node` (an expired, foreign or another node's certificate is refused at start,
    /// not at the first handshake).
    pub fn check_own(&self, node: NodeId, keys: &NodeKeys) -> Result<(), String> {
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| e.to_string())?;
        let (end, intermediates) = keys.chain.split_first().ok_or("no certificate")?;
        let name = ServerName::try_from(node_name(node)).map_err(|e| e.to_string())?;
        rustls::client::danger::ServerCertVerifier::verify_server_cert(
            verifier.as_ref(),
            end,
            intermediates,
            &name,
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| format!("node {node}'s certificate: {e}"))
    }
}
