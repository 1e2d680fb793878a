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
pub const WIRE_VERSION: u32 = 1;

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
        WireFrame::Batch(values.iter().map(|&msg| Envelope { sent_at_ns: 7, msg }).collect())
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
