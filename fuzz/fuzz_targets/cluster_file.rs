//! The cluster file parser on arbitrary text: an error or a file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = meridian_node::cluster_file::ClusterFile::parse("fuzz.toml", text, None);
    }
});
