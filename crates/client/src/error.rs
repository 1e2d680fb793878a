//! The client's errors: one enum, each variant saying what happened to the transaction and
//! whether running it again may succeed ([`Error::is_retryable`]).

use meridian_core::txn::AbortCause;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Why an operation did not succeed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The cluster file, node or options are wrong, or the coordinator could not start;
    /// `cause` is the underlying error, where there is one.
    Config { why: String, cause: Option<Arc<dyn std::error::Error + Send + Sync>> },
    /// The protocol aborted the transaction (a conflict, a lease that ran out): nothing it
    /// wrote was applied, and it is over. Running it again may succeed.
    Aborted(AbortCause),
    /// The operation was refused and changed nothing (a reversed scan range, too many keys):
    /// the transaction is still open.
    BadRequest(String),
    /// The transaction is over (committed, aborted or failed) and takes no more operations.
    Finished(String),
    /// The coordinator refused the operation before it started (busy, or the transaction is
    /// unknown there): nothing changed. Running the transaction again may succeed.
    Rejected(String),
    /// The transaction failed and did not commit; the text says why.
    Failed(String),
    /// Whether the commit took effect is unknown (a participant forgot the decision, or no
    /// answer came in time after the commit was sent). Not retryable as such: the
    /// transaction may have applied.
    Unknown(String),
    /// No answer within [`crate::Options::timeout`] to an operation before its commit: the
    /// transaction is over and nothing of it was applied. `shards` are the shards the
    /// operation waited on, `servers` their replicas' addresses.
    Timeout { operation: &'static str, after: Duration, shards: Vec<u32>, servers: Vec<SocketAddr> },
    /// The local coordinator stopped.
    Closed(String),
}

impl Error {
    /// True when running the transaction again may succeed: it was aborted by a conflict,
    /// refused before it started, or timed out before its commit was sent. In each case
    /// nothing of it was applied.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Aborted(_) | Self::Rejected(_) | Self::Timeout { .. })
    }

    pub(crate) fn config(why: impl Into<String>) -> Self {
        Self::Config { why: why.into(), cause: None }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config { why, .. } => write!(f, "{why}"),
            Self::Aborted(cause) => {
                write!(f, "transaction aborted ({}): nothing was applied", cause.name())
            }
            Self::BadRequest(why) => write!(f, "refused: {why}"),
            Self::Finished(why) => write!(f, "the transaction is over: {why}"),
            Self::Rejected(why) => write!(f, "rejected: {why}"),
            Self::Failed(why) => write!(f, "failed: {why}"),
            Self::Unknown(why) => write!(f, "outcome unknown: {why}"),
            Self::Timeout { operation, after, shards, servers } => {
                write!(f, "no answer to {operation} within {} ms", after.as_millis())?;
                if !shards.is_empty() {
                    let shards: Vec<String> = shards.iter().map(u32::to_string).collect();
                    let servers: Vec<String> = servers.iter().map(SocketAddr::to_string).collect();
                    write!(
                        f,
                        " from shard {} (servers {})",
                        shards.join(", "),
                        servers.join(", ")
                    )?;
                }
                write!(f, ": the transaction is over, nothing was applied")
            }
            Self::Closed(why) => write!(f, "client closed: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config { cause: Some(cause), .. } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

impl From<meridian_core::ConfigError> for Error {
    fn from(error: meridian_core::ConfigError) -> Self {
        Self::Config { why: error.to_string(), cause: Some(Arc::new(error)) }
    }
}
