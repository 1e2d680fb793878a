//! TCP between processes: one connection per ordered node pair, opened by the sender.
//!
//! A connection is untrusted until its first frame, a `Hello` naming both nodes and the cluster
//! fingerprint, checks out (`meridian_core::wire::ConnectionReader`: nothing else is decoded
//! before it). Then it carries `Batch` frames of envelopes. The listener bounds what strangers
//! can hold: at most [`PENDING_HELLOS_MAX`] connections may be waiting for their hello, each
//! for at most [`HELLO_TIMEOUT`], and at most [`CONNECTIONS_PER_PEER_MAX`] connections per
//! authenticated peer. A malformed, oversized or unexpected frame closes only that connection,
//! with a logged error; every refusal is counted ([`TcpStats`], exported as metrics).
//!
//! With TLS ([`crate::tls`]) every connection first completes a mutual TLS handshake (within
//! the hello's time limit): a connection without a certificate the cluster's CA signed is
//! closed before anything it sent is decoded, and the hello must name the node the
//! certificate names.
//!
//! The writer task batches whatever is queued (up to [`BATCH_MESSAGES_MAX`]) into one frame
//! and reconnects with backoff when the peer is unreachable. Senders never wait on a writer:
//! its queue is bounded and a message that does not fit is dropped and counted (a dead peer
//! must not stall the process; every protocol tolerates loss). While disconnected the writer
//! sheds what is queued. A batch lost to a broken connection is lost like a TCP reset, and
//! the protocols' timeouts recover.

use crate::inbox::Inbound;
use crate::tls::{node_name, Tls};
use meridian_core::node::Message;
use meridian_core::wire::{
    encode_frame, ConnectionReader, Envelope, Hello, Identity, ReadEvent, WireFrame,
    FRAME_BYTES_MAX, WIRE_VERSION,
};
use meridian_core::NodeId;
use rustls::pki_types::{CertificateDer, ServerName};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Messages queued for one connection; more are dropped and counted.
pub const WRITER_MESSAGES_MAX: usize = 1 << 16;
/// Messages per frame.
pub const BATCH_MESSAGES_MAX: usize = 1_024;
/// Connections one listener lets wait for their hello at once; more are closed at once.
pub const PENDING_HELLOS_MAX: usize = 64;
/// How long a new connection has to send its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections one authenticated peer may hold open to one node at once.
pub const CONNECTIONS_PER_PEER_MAX: usize = 4;
/// Bytes read from a socket per call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest wait between reconnection attempts.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Counters of a process's TCP transport.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Connections accepted by listeners.
    pub accepted: AtomicU64,
    /// Connections refused or closed for misbehaving: too many waiting for a hello, no hello
    /// in time, a bad hello or frame, too many from one peer.
    pub rejected: AtomicU64,
    /// Messages a writer shed while its peer was unreachable (a full writer queue is counted by
    /// the sending process instead).
    pub dropped: AtomicU64,
}

impl TcpStats {
    /// The counters as metrics: `(name, value)`.
    pub fn counters(&self) -> [(&'static str, u64); 3] {
        [
            ("tcp_connections_accepted_total", self.accepted.load(Ordering::Relaxed)),
            ("tcp_connections_rejected_total", self.rejected.load(Ordering::Relaxed)),
            ("tcp_messages_dropped_total", self.dropped.load(Ordering::Relaxed)),
        ]
    }
}

/// Addresses of every node and the fingerprint both ends must share.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// `addrs[i]` is node `i`'s listening address.
    pub addrs: Vec<SocketAddr>,
    /// Hash of the cluster file and procedure registry.
    pub fingerprint: u64,
    /// The process's transport counters.
    pub stats: Arc<TcpStats>,
    /// Mutual TLS for every connection; `None`: plain TCP (a cluster file's `insecure`).
    pub tls: Option<Arc<Tls>>,
}

impl TcpConfig {
    /// A plain-TCP configuration with fresh counters.
    pub fn new(addrs: Vec<SocketAddr>, fingerprint: u64) -> Self {
        Self { addrs, fingerprint, stats: Arc::new(TcpStats::default()), tls: None }
    }
}

/// A connection's byte stream, plain or TLS.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

/// Listens on `node`'s address and feeds accepted connections into `inbox`.
pub async fn listen<M: Message>(
    node: NodeId,
    config: TcpConfig,
    inbox: mpsc::Sender<Inbound<M>>,
) -> std::io::Result<JoinHandle<()>> {
    let addr = *config
        .addrs
        .get(node.0 as usize)
        .ok_or_else(|| std::io::Error::other(format!("no address for node {node}")))?;
    let listener = TcpListener::bind(addr).await?;
    let pending = Arc::new(AtomicUsize::new(0));
    let per_peer: Arc<Mutex<BTreeMap<NodeId, usize>>> = Arc::default();
    Ok(tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%node, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            config.stats.accepted.fetch_add(1, Ordering::Relaxed);
            if pending.fetch_add(1, Ordering::AcqRel) >= PENDING_HELLOS_MAX {
                pending.fetch_sub(1, Ordering::AcqRel);
                config.stats.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%node, %peer, "closing connection: too many awaiting their hello");
                drop(stream);
                continue;
            }
            let (inbox, config) = (inbox.clone(), config.clone());
            let (pending, per_peer) = (pending.clone(), per_peer.clone());
            tokio::spawn(async move {
                let mut slot = ConnectionSlot { pending: Some(pending), per_peer, peer: None };
                let result = match secure(stream, node, &config).await {
                    Ok((stream, cert)) => {
                        read_from::<M>(stream, cert, (node, &config), inbox, &mut slot).await
                    }
                    Err(error) => Err(error),
                };
                if let Err(error) = result {
                    config.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(%node, %peer, %error, "closing connection");
                }
            });
        }
    }))
}

/// What a connection holds of its listener's limits; released when dropped.
pub struct ConnectionSlot {
    pending: Option<Arc<AtomicUsize>>,
    per_peer: Arc<Mutex<BTreeMap<NodeId, usize>>>,
    peer: Option<NodeId>,
}

impl ConnectionSlot {
    /// The hello arrived from `peer`: leave the pending count, join the peer's.
    fn authenticated(&mut self, peer: NodeId) -> Result<(), String> {
        if let Some(pending) = self.pending.take() {
            pending.fetch_sub(1, Ordering::AcqRel);
        }
        let mut counts = self.per_peer.lock().expect("connection counts");
        let count = counts.entry(peer).or_default();
        if *count >= CONNECTIONS_PER_PEER_MAX {
            return Err(format!(
                "node {peer} already holds {CONNECTIONS_PER_PEER_MAX} connections"
            ));
        }
        *count += 1;
        self.peer = Some(peer);
        Ok(())
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(peer) = self.peer {
            let mut counts = self.per_peer.lock().expect("connection counts");
            if let Some(count) = counts.get_mut(&peer) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&peer);
                }
            }
        }
    }
}

/// An accepted connection as the listener reads it: plain, or after a TLS handshake (within
/// [`HELLO_TIMEOUT`]) with the certificate the peer showed.
async fn secure(
    stream: TcpStream,
    node: NodeId,
    config: &TcpConfig,
) -> Result<(Box<dyn Stream>, Option<CertificateDer<'static>>), String> {
    let _ = stream.set_nodelay(true);
    let Some(tls) = &config.tls else { return Ok((Box::new(stream), None)) };
    let acceptor = tls.acceptor(node).ok_or(format!("no TLS keys for node {node}"))?;
    let handshake = tokio::time::timeout(HELLO_TIMEOUT, acceptor.accept(stream));
    let stream = match handshake.await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(format!("TLS handshake refused: {e}")),
        Err(_) => return Err(format!("no TLS handshake within {} s", HELLO_TIMEOUT.as_secs())),
    };
    let cert = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).cloned();
    let cert = cert.ok_or("the peer showed no certificate")?;
    Ok((Box::new(stream), Some(cert)))
}

/// Reads frames from one connection until it closes or misbehaves; with `cert` (a TLS
/// connection's peer certificate), the hello must name the node it names.
async fn read_from<M: Message>(
    mut stream: Box<dyn Stream>,
    cert: Option<CertificateDer<'static>>,
    (node, config): (NodeId, &TcpConfig),
    inbox: mpsc::Sender<Inbound<M>>,
    slot: &mut ConnectionSlot,
) -> Result<(), String> {
    let identity = Identity { node, nodes: config.addrs.len(), fingerprint: config.fingerprint };
    let mut reader = ConnectionReader::new(identity, FRAME_BYTES_MAX);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let hello_by = tokio::time::Instant::now() + HELLO_TIMEOUT;
    loop {
        let read = if reader.peer().is_none() {
            match tokio::time::timeout_at(hello_by, stream.read(&mut chunk)).await {
                Ok(read) => read,
                Err(_) => return Err(format!("no hello within {} s", HELLO_TIMEOUT.as_secs())),
            }
        } else {
            stream.read(&mut chunk).await
        };
        let read = read.map_err(|e| format!("read failed: {e}"))?;
        if read == 0 {
            return Ok(());
        }
        reader.push(&chunk[..read]);
        while let Some(event) = reader.next_event::<M>()? {
            match event {
                ReadEvent::Hello(peer) => {
                    if let Some(cert) = &cert {
                        Tls::check_peer(cert, peer)?;
                    }
                    slot.authenticated(peer)?
                }
                ReadEvent::Batch(envelopes) => {
                    let sender = reader.peer().expect("a batch follows the hello");
                    for envelope in envelopes {
                        let inbound = Inbound::Msg {
                            from: sender,
                            sent_at_ns: envelope.sent_at_ns,
                            hops: envelope.hops,
                            msg: envelope.msg,
                        };
                        if inbox.send(inbound).await.is_err() {
                            return Ok(()); // The node stopped.
                        }
                    }
                }
            }
        }
    }
}

/// Spawns the writer of connection `from → to`; returns its queue. Senders use `try_send` and
/// count what does not fit (see the module documentation).
pub fn spawn_writer<M: Message>(
    from: NodeId,
    to: NodeId,
    config: TcpConfig,
) -> mpsc::Sender<Envelope<M>> {
    let (tx, mut rx) = mpsc::channel::<Envelope<M>>(WRITER_MESSAGES_MAX);
    tokio::spawn(async move {
        let Some(&addr) = config.addrs.get(to.0 as usize) else { return };
        let mut backoff = Duration::from_millis(10);
        let mut buffer = Vec::new();
        loop {
            let Some(mut stream) = connect(addr, from, to, &config, &mut buffer).await else {
                if rx.is_closed() {
                    return;
                }
                // Unreachable: shed what is queued rather than deliver it stale much later.
                let mut shed = 0;
                while rx.try_recv().is_ok() {
                    shed += 1;
                }
                config.stats.dropped.fetch_add(shed, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                continue;
            };
            // The backoff starts over only once a connection has lived a while: a peer that
            // accepts and then drops every connection (another cluster refusing the hello)
            // is retried ever more slowly, not a hundred times a second.
            let connected_at = tokio::time::Instant::now();
            loop {
                let Some(first) = rx.recv().await else { return };
                let mut batch = Vec::with_capacity(16);
                batch.push(first);
                while batch.len() < BATCH_MESSAGES_MAX {
                    match rx.try_recv() {
                        Ok(envelope) => batch.push(envelope),
                        Err(_) => break,
                    }
                }
                buffer.clear();
                let frame = WireFrame::Batch(batch);
                if encode_frame(&frame, &mut buffer).is_err() {
                    // Too big together (a few snapshot chunks): one frame per message.
                    let WireFrame::Batch(batch) = frame else { unreachable!("built above") };
                    for envelope in batch {
                        if let Err(error) =
                            encode_frame(&WireFrame::Batch(vec![envelope]), &mut buffer)
                        {
                            tracing::error!(%from, %to, %error, "dropping a message that cannot be framed");
                        }
                    }
                }
                // A TLS session holds written bytes until flushed; plain TCP flushes nothing.
                let written = match stream.write_all(&buffer).await {
                    Ok(()) => stream.flush().await,
                    Err(error) => Err(error),
                };
                if let Err(error) = written {
                    tracing::warn!(%from, %to, %error, "connection lost; reconnecting");
                    break;
                }
            }
            if connected_at.elapsed() >= RECONNECT_BACKOFF_MAX {
                backoff = Duration::from_millis(10);
            } else {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            }
        }
    });
    tx
}

async fn connect(
    addr: SocketAddr,
    from: NodeId,
    to: NodeId,
    config: &TcpConfig,
    buffer: &mut Vec<u8>,
) -> Option<Box<dyn Stream>> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    let mut stream: Box<dyn Stream> = match &config.tls {
        None => Box::new(stream),
        Some(tls) => {
            let connector = tls.connector(from)?;
            let name = ServerName::try_from(node_name(to)).ok()?;
            let handshake = tokio::time::timeout(HELLO_TIMEOUT, connector.connect(name, stream));
            match handshake.await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(error)) => {
                    tracing::warn!(%from, %to, %error, "TLS handshake failed");
                    return None;
                }
                Err(_) => return None,
            }
        }
    };
    buffer.clear();
    let hello = Hello { version: WIRE_VERSION, cluster_fingerprint: config.fingerprint, from, to };
    // The hello's encoding does not depend on the message type.
    encode_frame(&WireFrame::<()>::Hello(hello), buffer).ok()?;
    stream.write_all(buffer).await.ok()?;
    stream.flush().await.ok()?;
    Some(stream)
}
