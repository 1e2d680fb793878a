//! Mutual TLS on the TCP transport: a node with its own certificate is heard; a connection
//! with another node's certificate whose hello claims a different node, one with a
//! certificate of a foreign CA, one without TLS, and one with an expired certificate are
//! refused and counted, and nothing they send reaches the node.

use meridian_core::wire::Envelope;
use meridian_core::NodeId;
use meridian_runtime::inbox::Inbound;
use meridian_runtime::tcp::{self, TcpConfig};
use meridian_runtime::tls::{node_name, NodeKeys, Tls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A CA and certificates for nodes 0..4, valid for `days` (0: already expired).
struct Authority {
    ca: CertificateDer<'static>,
    nodes: Vec<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
}

fn authority(valid: bool) -> Authority {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let now = time::OffsetDateTime::now_utc();
    let (not_before, not_after) = if valid {
        (now - time::Duration::hours(1), now + time::Duration::days(1))
    } else {
        (now - time::Duration::days(2), now - time::Duration::days(1))
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = params.self_signed(&ca_key).unwrap();
    let nodes = (0..4)
        .map(|n| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![node_name(NodeId(n))]).unwrap();
            (params.not_before, params.not_after) = (not_before, not_after);
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
            (cert.der().clone(), key)
        })
        .collect();
    Authority { ca: ca.der().clone(), nodes }
}

/// A process's TLS sessions: node `as_node` holding the keys of `authority`'s node `keys_of`.
fn tls(authority: &Authority, trust: &Authority, as_node: u32, keys_of: usize) -> Arc<Tls> {
    let (cert, key) = &authority.nodes[keys_of];
    let keys = NodeKeys { chain: vec![cert.clone()], key: key.clone_key() };
    let trusted = std::slice::from_ref(&trust.ca);
    Arc::new(Tls::new(trusted, BTreeMap::from([(NodeId(as_node), keys)])).unwrap())
}

fn config(addrs: &[std::net::SocketAddr], tls: Option<Arc<Tls>>) -> TcpConfig {
    let mut config = TcpConfig::new(addrs.to_vec(), 42);
    config.tls = tls;
    config
}

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Sends 10 messages from `from` (as `writer` configures it) to node 0; returns how many
/// node 0 (listening with `listener`) received within a second.
async fn heard(listener: TcpConfig, writer: TcpConfig, from: u32) -> u64 {
    let (inbox, mut received) = tokio::sync::mpsc::channel::<Inbound<u64>>(64);
    let listening = tcp::listen::<u64>(NodeId(0), listener, inbox).await.unwrap();
    let queue = tcp::spawn_writer::<u64>(NodeId(from), NodeId(0), writer);
    for n in 0..10u64 {
        queue.send(Envelope { sent_at_ns: 0, hops: 0, msg: n }).await.unwrap();
    }
    let mut count = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Ok(Some(Inbound::Msg { from: sender, .. })) =
        tokio::time::timeout_at(deadline, received.recv()).await
    {
        assert_eq!(sender, NodeId(from));
        count += 1;
    }
    listening.abort();
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_node_with_its_own_certificate_from_the_cluster_ca_is_heard() {
    let ours = authority(true);
    let foreign = authority(true);
    let expired = authority(false);
    // Each case listens on an address of its own (an aborted listener frees its port late).
    let fresh = || [free_addr(), free_addr(), free_addr(), free_addr()];

    // Node 1 with node 1's certificate: heard.
    let addrs = fresh();
    let good = config(&addrs, Some(tls(&ours, &ours, 1, 1)));
    let l = config(&addrs, Some(tls(&ours, &ours, 0, 0)));
    assert_eq!(heard(l.clone(), good, 1).await, 10);
    assert_eq!(l.stats.rejected.load(Ordering::Relaxed), 0);

    // Node 3's certificate speaking as node 2 (the hello says 2): refused after the handshake,
    // before any batch is read.
    let addrs = fresh();
    let forged = config(&addrs, Some(tls(&ours, &ours, 2, 3)));
    let l = config(&addrs, Some(tls(&ours, &ours, 0, 0)));
    assert_eq!(heard(l.clone(), forged, 2).await, 0);
    assert!(l.stats.rejected.load(Ordering::Relaxed) > 0, "the forgery is counted");

    // A certificate another CA signed: the handshake fails.
    let addrs = fresh();
    let stranger = config(&addrs, Some(tls(&foreign, &ours, 1, 1)));
    let l = config(&addrs, Some(tls(&ours, &ours, 0, 0)));
    assert_eq!(heard(l.clone(), stranger, 1).await, 0);
    assert!(l.stats.rejected.load(Ordering::Relaxed) > 0);

    // No TLS at all: the plain hello is no TLS handshake.
    let addrs = fresh();
    let plain = config(&addrs, None);
    let l = config(&addrs, Some(tls(&ours, &ours, 0, 0)));
    assert_eq!(heard(l.clone(), plain, 1).await, 0);
    assert!(l.stats.rejected.load(Ordering::Relaxed) > 0);

    // An expired certificate: refused by the listener, and by its own process at start.
    let addrs = fresh();
    let stale = tls(&expired, &expired, 1, 1);
    let l = config(&addrs, Some(tls(&expired, &expired, 0, 0)));
    assert_eq!(heard(l.clone(), config(&addrs, Some(stale.clone())), 1).await, 0);
    let (cert, key) = &expired.nodes[1];
    let keys = NodeKeys { chain: vec![cert.clone()], key: key.clone_key() };
    let error = stale.check_own(NodeId(1), &keys).unwrap_err();
    assert!(error.contains("expired"), "{error}");
    // Node 1's own check also refuses another node's certificate.
    let (cert, key) = &ours.nodes[3];
    let keys = NodeKeys { chain: vec![cert.clone()], key: key.clone_key() };
    let error = tls(&ours, &ours, 1, 3).check_own(NodeId(1), &keys).unwrap_err();
    assert!(error.contains("node n1's certificate"), "{error}");
}
