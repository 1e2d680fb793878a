//! A connection's bytes through the real reader (`ConnectionReader`, the same code the TCP
//! listener runs), decoding the real message type (`OccMsg`): arbitrary bytes, fed in
//! arbitrary chunks, after an optional valid hello. It must never panic, overflow the stack or
//! hand out a payload over its limit; every frame is accepted or refused cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meridian_core::wire::{encode_frame, ConnectionReader, Hello, Identity, WireFrame, WIRE_VERSION};
use meridian_core::NodeId;
use meridian_protocols::occ::OccMsg;

const FRAME_BYTES_MAX: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&control, bytes)) = data.split_first() else { return };
    let chunk = usize::from(control >> 1).max(1);
    let identity = Identity { node: NodeId(0), nodes: 3, fingerprint: 42 };
    let mut reader = ConnectionReader::new(identity, FRAME_BYTES_MAX);
    if control & 1 == 1 {
        // Past the hello, so the batch decoding is reached.
        let hello = Hello { version: WIRE_VERSION, cluster_fingerprint: 42, from: NodeId(1), to: NodeId(0) };
        let mut opening = Vec::new();
        encode_frame(&WireFrame::<()>::Hello(hello), &mut opening).expect("a hello encodes");
        reader.push(&opening);
    }
    'feed: for piece in bytes.chunks(chunk) {
        reader.push(piece);
        loop {
            match reader.next_event::<OccMsg>() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
});
