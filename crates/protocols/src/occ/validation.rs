//! `occ`'s concurrency control in the two-phase commit engine: read validation (Silo-style).
//! Execution reads the newest committed state and keeps nothing; prepare validates every read
//! and scan and locks them with the writes until the decision. That is the engine's default
//! behaviour, so this control only names it.

use crate::engine::participant::{Concurrency, Rules};

/// Validation at prepare, nothing more.
pub(crate) struct Validation;

impl Concurrency for Validation {
    fn rules(&self) -> Rules {
        Rules::default()
    }
}
