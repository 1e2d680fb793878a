//! Helpers for bounded property tests of parsers and decoders (the fuzz targets' in-suite
//! counterparts): seeded mutations of valid inputs.

use crate::rng::{uniform_u64, Rng};

/// `input` with 1 to `edits_max` random edits: a byte replaced (from `alphabet` or any byte),
/// a byte removed, a byte duplicated, or the tail cut off.
pub fn mutate(rng: &mut Rng, input: &[u8], alphabet: &[u8], edits_max: u64) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..1 + uniform_u64(rng, edits_max.max(1)) {
        if bytes.is_empty() {
            break;
        }
        let at = uniform_u64(rng, bytes.len() as u64) as usize;
        match uniform_u64(rng, 5) {
            0 if !alphabet.is_empty() => {
                bytes[at] = alphabet[uniform_u64(rng, alphabet.len() as u64) as usize];
            }
            0 | 1 => bytes[at] = uniform_u64(rng, 256) as u8,
            2 => {
                bytes.remove(at);
            }
            3 => bytes.insert(at, bytes[at]),
            _ => bytes.truncate(at),
        }
    }
    bytes
}

/// Feeds `cases` streams derived from `valid` (a connection's valid bytes) to fresh
/// connection readers, in random chunks: half mutated copies, half the first frame header
/// followed by random bytes. A reader must answer each with events or an error, never panic.
pub fn feed_hostile_streams<M: crate::node::Message>(
    valid: &[u8],
    identity: crate::wire::Identity,
    cases: u32,
    label: &str,
) {
    let mut rng = crate::rng::child_rng(9, label, 0);
    for case in 0..cases {
        let bytes = if case % 2 == 0 {
            mutate(&mut rng, valid, &[0, 1, 3, 12, 0xff], 8)
        } else {
            let len = uniform_u64(&mut rng, 256) as usize;
            let mut bytes = valid[..valid.len().min(24)].to_vec();
            bytes.extend((0..len).map(|_| uniform_u64(&mut rng, 256) as u8));
            bytes
        };
        let mut reader = crate::wire::ConnectionReader::new(identity, 1 << 16);
        'feed: for piece in bytes.chunks(1 + uniform_u64(&mut rng, 64) as usize) {
            reader.push(piece);
            loop {
                match reader.next_event::<M>() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // The connection would be closed here.
                    Err(_) => break 'feed,
                }
            }
        }
    }
}

/// The connection property test of a protocol's messages: a stream of a [`Hello`] from node 1
/// to node 0 of a `nodes`-node cluster and one batch of `msgs` must decode (two events), and
/// `cases` mutated and random streams derived from it must never panic the reader.
///
/// [`Hello`]: crate::wire::Hello
pub fn check_message_streams<M: crate::node::Message>(
    msgs: Vec<M>,
    nodes: usize,
    cases: u32,
    label: &str,
) {
    use crate::wire::{encode_frame, ConnectionReader, Envelope, Hello, Identity, WireFrame};
    let identity = Identity { node: crate::NodeId(0), nodes, fingerprint: 42 };
    let hello = Hello {
        version: crate::wire::WIRE_VERSION,
        cluster_fingerprint: 42,
        from: crate::NodeId(1),
        to: crate::NodeId(0),
    };
    let mut valid = Vec::new();
    encode_frame(&WireFrame::<M>::Hello(hello), &mut valid).expect("a hello encodes");
    let batch = msgs.into_iter().map(|msg| Envelope { sent_at_ns: 1, hops: 0, msg }).collect();
    encode_frame(&WireFrame::Batch(batch), &mut valid).expect("the batch encodes");
    let mut reader = ConnectionReader::new(identity, 1 << 16);
    reader.push(&valid);
    let mut decoded = 0;
    while let Ok(Some(_)) = reader.next_event::<M>() {
        decoded += 1;
    }
    assert_eq!(decoded, 2, "the valid stream decodes: a hello and a batch");
    feed_hostile_streams::<M>(&valid, identity, cases, label);
}
