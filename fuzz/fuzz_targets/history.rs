//! The history parser and the checker on arbitrary text: whatever parses is checked under both
//! models without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meridian_check::history::{History, Model};
use meridian_check::{check, Consistency};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for model in [Model::ListAppend, Model::RwRegister] {
        if let Ok(history) = History::parse(text, model) {
            let _ = check(&history, model, Consistency::StrictSerializable);
        }
    }
});
