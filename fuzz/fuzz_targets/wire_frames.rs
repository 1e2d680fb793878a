//! The frame decoder on arbitrary bytes, fed in arbitrary chunks: it must never panic, never
//! hand out a payload over its limit, and every payload must decode or be refused cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meridian_core::wire::{decode_payload, FrameDecoder};

const FRAME_BYTES_MAX: usize = 1 << 12;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, bytes)) = data.split_first() else { return };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    'feed: for piece in bytes.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_payload() {
                Ok(Some(payload)) => {
                    assert!(payload.len() <= FRAME_BYTES_MAX);
                    let payload = payload.to_vec();
                    let _ = decode_payload::<Vec<u64>>(&payload);
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
});
