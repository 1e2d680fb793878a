//! The durable log's replay on arbitrary bytes (a damaged or foreign data directory): it
//! returns the live records, a discarded torn tail, or an error, and never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meridian_runtime::logstore::replay;

fuzz_target!(|data: &[u8]| {
    // With and without the header, so the batch parser is reached either way.
    let _ = replay(data);
    let mut framed = b"MERIDIAN-LOG v1\n".to_vec();
    framed.extend_from_slice(data);
    let _ = replay(&framed);
});
