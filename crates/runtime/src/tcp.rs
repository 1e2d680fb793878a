//! TCP between processes: one connection per ordered node pair, opened by the sender.
//!
//! A connection starts with a `Hello` frame naming both nodes and the cluster fingerprint; the
//! receiver checks them and then accepts `Batch` frames of envelopes. Frames are length-delimited
//! with a maximum size. A malformed, oversized or unexpected frame closes that connection with a
//! logged error; the node goes on serving every other connection. The writer task batches
//! whatever is queued (up to [`BATCH_MESSAGES_MAX`]) into one frame and reconnects with backoff
//! when the peer is unreachable; a batch lost to a broken connection is lost like a TCP reset,
//! and the protocols' timeouts recover.

use crate::node_task::Inbound;
use meridian_core::node::Message;
use meridian_core::wire::{
    decode_payload, encode_frame, Envelope, FrameDecoder, Hello, WireFrame, FRAME_BYTES_MAX,
    WIRE_VERSION,
};
use meridian_core::NodeId;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Messages queued for one connection before senders wait.
pub const WRITER_MESSAGES_MAX: usize = 1 << 16;
/// Messages per frame.
pub const BATCH_MESSAGES_MAX: usize = 1_024;
/// Bytes read from a socket per call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest wait between reconnection attempts.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Addresses of every node and the fingerprint both ends must share.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// `addrs[i]` is node `i`'s listening address.
    pub addrs: Vec<SocketAddr>,
    /// Hash of the cluster file and procedure registry.
    pub fingerprint: u64,
}

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
            let inbox = inbox.clone();
            let config = config.clone();
            tokio::spawn(async move {
                if let Err(error) = read_connection::<M>(stream, node, &config, inbox).await {
                    tracing::error!(%node, %peer, %error, "closing connection");
                }
            });
        }
    }))
}

/// Reads frames from one connection until it closes or misbehaves.
pub async fn read_connection<M: Message>(
    mut stream: TcpStream,
    node: NodeId,
    config: &TcpConfig,
    inbox: mpsc::Sender<Inbound<M>>,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut from: Option<NodeId> = None;
    loop {
        let read = stream.read(&mut chunk).await.map_err(|e| format!("read failed: {e}"))?;
        if read == 0 {
            return Ok(());
        }
        decoder.push(&chunk[..read]);
        while let Some(payload) = decoder.next_payload().map_err(|e| e.to_string())? {
            let frame = decode_payload::<M>(payload).map_err(|e| e.to_string())?;
            match (frame, from) {
                (WireFrame::Hello(hello), None) => from = Some(check_hello(&hello, node, config)?),
                (WireFrame::Hello(_), Some(_)) => {
                    return Err("a second hello on one connection".into())
                }
                (WireFrame::Batch(_), None) => return Err("a batch before the hello".into()),
                (WireFrame::Batch(envelopes), Some(sender)) => {
                    for envelope in envelopes {
                        let inbound = Inbound::Msg {
                            from: sender,
                            sent_at_ns: envelope.sent_at_ns,
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

fn check_hello(hello: &Hello, node: NodeId, config: &TcpConfig) -> Result<NodeId, String> {
    if hello.version != WIRE_VERSION {
        return Err(format!("wire version {} from peer, {WIRE_VERSION} here", hello.version));
    }
    if hello.cluster_fingerprint != config.fingerprint {
        return Err("the peer runs a different cluster file or workload".into());
    }
    if hello.to != node {
        return Err(format!("hello for node {}, but this is node {node}", hello.to));
    }
    if hello.from.0 as usize >= config.addrs.len() || hello.from == node {
        return Err(format!("hello from unknown node {}", hello.from));
    }
    Ok(hello.from)
}

/// Spawns the writer of connection `from → to`; returns its queue.
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
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                continue;
            };
            backoff = Duration::from_millis(10);
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
                if let Err(error) = stream.write_all(&buffer).await {
                    tracing::warn!(%from, %to, %error, "connection lost; reconnecting");
                    break;
                }
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
) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    buffer.clear();
    let hello = Hello { version: WIRE_VERSION, cluster_fingerprint: config.fingerprint, from, to };
    // The hello's encoding does not depend on the message type.
    encode_frame(&WireFrame::<()>::Hello(hello), buffer).ok()?;
    stream.write_all(buffer).await.ok()?;
    Some(stream)
}
