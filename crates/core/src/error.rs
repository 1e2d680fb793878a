//! Errors for input from outside (CLI flags, files). Each carries a one-line message that says
//! what is wrong and, where there is a closed set, what is accepted.

use std::fmt;

/// Bad configuration: a name, number or file that cannot be used. Nothing was started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl ConfigError {
    /// Builds an error from anything printable.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Returns an error naming `what`, the bad `value` and the accepted names.
pub fn unknown_name(what: &str, value: &str, accepted: &[&str]) -> ConfigError {
    ConfigError(format!("unknown {what} '{value}'; accepted: {}", accepted.join(", ")))
}
