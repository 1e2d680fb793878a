//! The link-matrix parser on arbitrary text; whatever parses must sample without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meridian_core::netmodel::{LinkState, NetworkModel};
use meridian_core::rng::child_rng;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(model) = NetworkModel::from_toml("fuzz.toml", text) else { return };
    let mut state = LinkState::new(child_rng(1, "fuzz", 0));
    for from in 0..model.regions.len().min(8) {
        for to in 0..model.regions.len().min(8) {
            let _ = state.sample(&model.link(from, to), 1_000);
        }
    }
});
