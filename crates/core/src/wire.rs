//! Wire frames: a 4-byte big-endian length, then that many bytes of postcard payload.
//!
//! [`FrameDecoder`] is sans-IO: the transport pushes whatever bytes arrived and pulls whole
//! frames. A length above the decoder's maximum is an error (the connection is closed, nothing
//! is buffered beyond the maximum), so a hostile peer cannot make a node allocate without bound.
//! Payloads are [`WireFrame`]s: a `Hello` opening each connection, then `Batch`es of envelopes.

use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes in the length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;
/// Default largest frame payload.
pub const FRAME_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Protocol version in `Hello`; bump on any incompatible change of the frame types.
pub const WIRE_VERSION: u32 = 3;

/// What opens a connection and what follows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WireFrame<M> {
    /// First frame of every connection: who is talking to whom.
    Hello(Hello),
    /// Messages from the hello's `from` node to its `to` node.
    Batch(Vec<Envelope<M>>),
}

/// Identifies the two ends and checks that they run the same cluster and procedures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`WIRE_VERSION`] of the sender.
    pub version: u32,
    /// Hash of the cluster file and procedure registry; both ends must agree.
    pub cluster_fingerprint: u64,
    /// Sending node.
    pub from: NodeId,
    /// Receiving node.
    pub to: NodeId,
}

/// One message with the sender's true send time (for measuring one-way delays).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope<M> {
    /// Sender's wall-clock send time in nanoseconds since the Unix epoch (unskewed).
    pub sent_at_ns: u64,
    /// Wide-area one-way legs on the causal chain that led to this message, this one
    /// included (how the runtime counts round trips per commit, as the simulator does).
    pub hops: u16,
    /// The message.
    pub msg: M,
}

/// Why bytes could not become a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix exceeds the maximum.
    TooLarge {
        /// Announced length.
        bytes: usize,
        /// The maximum.
        bytes_max: usize,
    },
    /// The payload is not a valid frame.
    Malformed(String),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { bytes, bytes_max } => {
                write!(f, "frame of {bytes} bytes exceeds the {bytes_max}-byte maximum")
            }
            Self::Malformed(why) => write!(f, "malformed frame: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Appends one frame holding `payload` to `out`.
pub fn encode_frame<M: Serialize>(
    frame: &WireFrame<M>,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    let encoded = postcard::to_extend(frame, std::mem::take(out))
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    *out = encoded;
    let len = out.len() - start - FRAME_HEADER_BYTES;
    if len > FRAME_BYTES_MAX {
        out.truncate(start);
        return Err(FrameError::TooLarge { bytes: len, bytes_max: FRAME_BYTES_MAX });
    }
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// Decodes one frame payload.
pub fn decode_payload<M: for<'de> Deserialize<'de>>(
    payload: &[u8],
) -> Result<WireFrame<M>, FrameError> {
    postcard::from_bytes(payload).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// The only frame a connection may open with. It shares `WireFrame`'s variant index 0, so a
/// `WireFrame::Hello` decodes as this, and anything else (a batch before the hello) does not,
/// without the batch's messages ever being decoded.
#[derive(Deserialize)]
enum OpeningFrame {
    Hello(Hello),
}

/// What a connection's reader produced.
#[derive(Debug, PartialEq)]
pub enum ReadEvent<M> {
    /// The hello checked out: the connection carries messages from this node.
    Hello(NodeId),
    /// Messages from the node the hello named.
    Batch(Vec<Envelope<M>>),
}

/// Who this end is: what a hello must say to be accepted.
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    /// This node.
    pub node: NodeId,
    /// How many nodes the cluster has (a hello from an id beyond is refused).
    pub nodes: usize,
    /// The cluster fingerprint both ends must share.
    pub fingerprint: u64,
}

/// The receiving side of one connection, sans-IO: bytes in, checked events out. A connection
/// is untrusted until its first frame, which must be a [`Hello`] naming this node and the
/// cluster's fingerprint; nothing else is decoded before it. After it, every frame is a batch
/// of envelopes; a second hello, a frame over the maximum or one that does not decode is an
/// error after which the connection must be closed. Decoding is bounded: frames have a
/// maximum size and the message types are not recursive (nested data has a depth limit).
#[derive(Debug)]
pub struct ConnectionReader {
    decoder: FrameDecoder,
    identity: Identity,
    from: Option<NodeId>,
}

impl ConnectionReader {
    /// A reader for a new connection to `identity`, accepting frames up to `bytes_max`.
    pub fn new(identity: Identity, bytes_max: usize) -> Self {
        Self { decoder: FrameDecoder::new(bytes_max), identity, from: None }
    }

    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.decoder.push(bytes);
    }

    /// The sender, once its hello was accepted.
    pub fn peer(&self) -> Option<NodeId> {
        self.from
    }

    /// The next event, `Ok(None)` when more bytes are needed, or why the connection must close.
    pub fn next_event<M: for<'de> Deserialize<'de>>(
        &mut self,
    ) -> Result<Option<ReadEvent<M>>, String> {
        let Some(payload) = self.decoder.next_payload().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        if self.from.is_none() {
            let OpeningFrame::Hello(hello) = postcard::from_bytes::<OpeningFrame>(payload)
                .map_err(|_| "the first frame is not a hello".to_string())?;
            let from = check_hello(&hello, self.identity)?;
            self.from = Some(from);
            return Ok(Some(ReadEvent::Hello(from)));
        }
        match decode_payload::<M>(payload).map_err(|e| e.to_string())? {
            WireFrame::Hello(_) => Err("a second hello on one connection".into()),
            WireFrame::Batch(envelopes) => Ok(Some(ReadEvent::Batch(envelopes))),
        }
    }
}

/// Checks a hello against this end; returns the sender.
pub fn check_hello(hello: &Hello, identity: Identity) -> Result<NodeId, String> {
    if hello.version != WIRE_VERSION {
        return Err(format!("wire version {} from peer, {WIRE_VERSION} here", hello.version));
    }
    if hello.cluster_fingerprint != identity.fingerprint {
        return Err("the peer runs a different cluster file or workload".into());
    }
    if hello.to != identity.node {
        return Err(format!("hello for node {}, but this is node {}", hello.to, identity.node));
    }
    if hello.from.0 as usize >= identity.nodes || hello.from == identity.node {
        return Err(format!("hello from unknown node {}", hello.from));
    }
    Ok(hello.from)
}

/// Splits a byte stream into frame payloads.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    consumed: usize,
    bytes_max: usize,
}

impl FrameDecoder {
    /// A decoder accepting payloads up to `bytes_max`.
    pub fn new(bytes_max: usize) -> Self {
        Self { buffer: Vec::new(), consumed: 0, bytes_max }
    }

    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.consumed > 0 && self.consumed == self.buffer.len() {
            self.buffer.clear();
            self.consumed = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete payload, `Ok(None)` when more bytes are needed, or an error after which
    /// the stream is unusable.
    pub fn next_payload(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let available = &self.buffer[self.consumed..];
        let Some(header) = available.get(..FRAME_HEADER_BYTES) else {
            self.compact();
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > self.bytes_max {
            return Err(FrameError::TooLarge { bytes: len, bytes_max: self.bytes_max });
        }
        if available.len() < FRAME_HEADER_BYTES + len {
            self.compact();
            return Ok(None);
        }
        let start = self.consumed + FRAME_HEADER_BYTES;
        self.consumed = start + len;
        Ok(Some(&self.buffer[start..start + len]))
    }

    /// Bytes buffered but not yet returned.
    pub fn pending_bytes(&self) -> usize {
        self.buffer.len() - self.consumed
    }

    /// Moves unread bytes to the front so the buffer never holds more than one partial frame.
    fn compact(&mut self) {
        if self.consumed > 0 {
            self.buffer.drain(..self.consumed);
            self.consumed = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(values: &[u32]) -> WireFrame<u32> {
        WireFrame::Batch(
            values.iter().map(|&msg| Envelope { sent_at_ns: 7, hops: 0, msg }).collect(),
        )
    }

    #[test]
    fn frames_round_trip_in_any_chunking() {
        let mut bytes = Vec::new();
        let hello = WireFrame::<u32>::Hello(Hello {
            version: WIRE_VERSION,
            cluster_fingerprint: 9,
            from: NodeId(1),
            to: NodeId(2),
        });
        encode_frame(&hello, &mut bytes).unwrap();
        encode_frame(&batch(&[1, 2, 3]), &mut bytes).unwrap();
        encode_frame(&batch(&[]), &mut bytes).unwrap();
        for chunk in [1, 2, 3, 5, 64] {
            let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
            let mut frames = Vec::new();
            for piece in bytes.chunks(chunk) {
                decoder.push(piece);
                while let Some(payload) = decoder.next_payload().unwrap() {
                    frames.push(decode_payload::<u32>(payload).unwrap());
                }
            }
            assert_eq!(frames, vec![hello.clone(), batch(&[1, 2, 3]), batch(&[])]);
            assert_eq!(decoder.pending_bytes(), 0);
        }
    }

    fn identity() -> Identity {
        Identity { node: NodeId(2), nodes: 3, fingerprint: 9 }
    }

    fn hello(from: u32, to: u32, fingerprint: u64) -> WireFrame<u32> {
        WireFrame::Hello(Hello {
            version: WIRE_VERSION,
            cluster_fingerprint: fingerprint,
            from: NodeId(from),
            to: NodeId(to),
        })
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<ReadEvent<u32>>, String> {
        let mut reader = ConnectionReader::new(identity(), FRAME_BYTES_MAX);
        reader.push(bytes);
        let mut events = Vec::new();
        while let Some(event) = reader.next_event::<u32>()? {
            events.push(event);
        }
        Ok(events)
    }

    #[test]
    fn a_connection_opens_with_a_hello_and_nothing_else() {
        let mut bytes = Vec::new();
        encode_frame(&hello(1, 2, 9), &mut bytes).unwrap();
        encode_frame(&batch(&[4, 5]), &mut bytes).unwrap();
        let events = read_all(&bytes).unwrap();
        assert_eq!(events[0], ReadEvent::Hello(NodeId(1)));
        assert!(matches!(&events[1], ReadEvent::Batch(b) if b.len() == 2));
        // A batch first is refused without decoding its messages.
        let mut bytes = Vec::new();
        encode_frame(&batch(&[4]), &mut bytes).unwrap();
        assert_eq!(read_all(&bytes).unwrap_err(), "the first frame is not a hello");
        // Hellos that do not check out.
        for (from, to, fingerprint, why) in [
            (1, 2, 8, "different cluster"),
            (1, 1, 9, "this is node"),
            (7, 2, 9, "unknown node"),
            (2, 2, 9, "unknown node"),
        ] {
            let mut bytes = Vec::new();
            encode_frame(&hello(from, to, fingerprint), &mut bytes).unwrap();
            let error = read_all(&bytes).unwrap_err();
            assert!(error.contains(why), "{error}");
        }
        // A second hello.
        let mut bytes = Vec::new();
        encode_frame(&hello(1, 2, 9), &mut bytes).unwrap();
        encode_frame(&hello(1, 2, 9), &mut bytes).unwrap();
        assert!(read_all(&bytes).unwrap_err().contains("second hello"));
    }

    #[test]
    fn oversized_and_malformed_frames_are_errors() {
        let mut decoder = FrameDecoder::new(16);
        decoder.push(&100u32.to_be_bytes());
        assert_eq!(decoder.next_payload(), Err(FrameError::TooLarge { bytes: 100, bytes_max: 16 }));
        let mut decoder = FrameDecoder::new(16);
        decoder.push(&[0, 0, 0, 3, 0xFF, 0xFF, 0xFF]);
        let payload = decoder.next_payload().unwrap().unwrap().to_vec();
        assert!(matches!(decode_payload::<u32>(&payload), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn mutated_and_random_streams_never_panic_the_decoder() {
        // Bounded property test (the `wire_frames` fuzz target runs the same idea unbounded).
        let mut valid = Vec::new();
        encode_frame(&batch(&[1, 2, 3]), &mut valid).unwrap();
        encode_frame(&batch(&[u32::MAX]), &mut valid).unwrap();
        let mut rng = crate::rng::child_rng(7, "wire-property", 0);
        for case in 0..5_000 {
            let bytes = if case % 2 == 0 {
                crate::testing::mutate(&mut rng, &valid, &[], 6)
            } else {
                let len = crate::rng::uniform_u64(&mut rng, 64) as usize;
                (0..len).map(|_| crate::rng::uniform_u64(&mut rng, 256) as u8).collect()
            };
            let mut decoder = FrameDecoder::new(64);
            decoder.push(&bytes);
            for _ in 0..bytes.len() + 1 {
                match decoder.next_payload() {
                    Ok(Some(payload)) => {
                        let payload = payload.to_vec();
                        let _ = decode_payload::<u32>(&payload);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            assert!(decoder.pending_bytes() <= bytes.len());
        }
    }
}
