//! Running a transaction again: [`Client::transact`] begins a transaction, runs a body on it,
//! commits, and on an error that applied nothing ([`Error::is_retryable`]) waits a growing,
//! bounded pause and runs it again, at most [`Retry::attempts_max`] times.

use crate::{Client, Error, Transaction};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// How [`Client::transact`] runs a transaction again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Attempts at most (the first included).
    pub attempts_max: u32,
    /// The pause after the first failed attempt; it doubles after each further one.
    pub backoff_min: Duration,
    /// The longest pause.
    pub backoff_max: Duration,
}

/// The most attempts a [`Retry`] may allow.
pub const ATTEMPTS_MAX_LIMIT: u32 = 1_000;

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts_max: 10,
            backoff_min: Duration::from_millis(1),
            backoff_max: Duration::from_millis(500),
        }
    }
}

impl Retry {
    /// Refuses a setting that would never run or never stop.
    pub(crate) fn check(&self) -> Result<(), String> {
        if !(1..=ATTEMPTS_MAX_LIMIT).contains(&self.attempts_max) {
            return Err(format!("retry attempts: give 1..={ATTEMPTS_MAX_LIMIT}"));
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err("retry backoff: give 0 < backoff_min <= backoff_max".into());
        }
        if self.backoff_max > Duration::from_secs(60) {
            return Err("retry backoff: backoff_max is at most 60 s".into());
        }
        Ok(())
    }

    /// The pause after failed attempt `attempt` (1-based): `backoff_min` doubled per
    /// attempt up to `backoff_max`, and up to as much again drawn from `jitter` (so that
    /// clients refused by one another do not run again in step).
    pub(crate) fn pause(&self, attempt: u32, jitter: u64) -> Duration {
        let doubled = self.backoff_min.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let base = doubled.min(self.backoff_max);
        let base_ns = u64::try_from(base.as_nanos()).unwrap_or(u64::MAX).max(1);
        base + Duration::from_nanos(jitter % base_ns)
    }
}

/// A transaction's body for [`Client::transact`]: given the open transaction, its work as a
/// boxed future (`Box::pin(async move { ... })`).
pub type TxnBody<'t, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 't>>;

impl Client {
    /// Runs `body` in a transaction and commits it (unless the body ended it itself), again
    /// after a pause for as long as it fails with a retryable error (nothing applied) and
    /// [`crate::Options::retry`] allows. Returns the body's value once committed, or the
    /// first error that is not retryable, or the last one when the attempts run out. An
    /// error the body returns ends the transaction (aborted).
    ///
    /// ```no_run
    /// # async fn example(client: &meridian_client::Client) -> Result<(), meridian_client::Error> {
    /// use meridian_client::text_key;
    /// let visits: u64 = client
    ///     .transact(|txn| {
    ///         Box::pin(async move {
    ///             let seen = txn.get(&text_key("visits")).await?;
    ///             let n = seen.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap())) + 1;
    ///             txn.put(text_key("visits"), n.to_le_bytes().to_vec())?;
    ///             Ok(n)
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn transact<T, F>(&self, mut body: F) -> Result<T, Error>
    where
        F: for<'t> FnMut(&'t mut Transaction) -> TxnBody<'t, T>,
    {
        let retry = self.inner.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let error = match self.attempt(&mut body).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if !error.is_retryable() || attempt >= retry.attempts_max {
                return Err(error);
            }
            tokio::time::sleep(retry.pause(attempt, jitter())).await;
        }
    }

    /// One attempt of [`Client::transact`].
    async fn attempt<T, F>(&self, body: &mut F) -> Result<T, Error>
    where
        F: for<'t> FnMut(&'t mut Transaction) -> TxnBody<'t, T>,
    {
        let mut txn = self.begin().await?;
        let value = match body(&mut txn).await {
            Ok(value) => value,
            Err(error) => {
                if !txn.is_over() {
                    // Best effort: dropping it aborts it anyway.
                    let _ = txn.abort().await;
                }
                return Err(error);
            }
        };
        if !txn.is_over() {
            txn.commit().await?;
        }
        Ok(value)
    }
}

/// Nanoseconds of the wall clock: a jitter that differs between clients and attempts.
fn jitter() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_bound_with_at_most_as_much_again_of_jitter() {
        let retry = Retry::default();
        assert_eq!(retry.pause(1, 0), Duration::from_millis(1));
        assert_eq!(retry.pause(2, 0), Duration::from_millis(2));
        assert_eq!(retry.pause(4, 0), Duration::from_millis(8));
        assert_eq!(retry.pause(30, 0), Duration::from_millis(500), "bounded");
        for jitter in [1, 999_999, u64::MAX] {
            let pause = retry.pause(1, jitter);
            assert!(pause >= Duration::from_millis(1) && pause < Duration::from_millis(2));
        }
        assert!(retry.check().is_ok());
        let bad = |r: Retry| r.check().unwrap_err();
        assert!(bad(Retry { attempts_max: 0, ..retry }).contains("attempts"));
        assert!(bad(Retry { backoff_min: Duration::ZERO, ..retry }).contains("backoff"));
        assert!(bad(Retry { backoff_min: Duration::from_secs(1), ..retry }).contains("backoff"));
        assert!(bad(Retry { backoff_max: Duration::from_secs(61), ..retry }).contains("60 s"));
    }

    #[test]
    fn only_what_applied_nothing_is_retryable() {
        use meridian_core::txn::AbortCause;
        let timeout = Error::Timeout {
            operation: "a read",
            after: Duration::from_secs(1),
            shards: vec![1],
            servers: vec!["127.0.0.1:7001".parse().unwrap()],
        };
        assert!(timeout.is_retryable());
        assert!(timeout.to_string().contains("shard 1 (servers 127.0.0.1:7001)"), "{timeout}");
        assert!(Error::Aborted(AbortCause::Validation).is_retryable());
        assert!(Error::Rejected("busy".into()).is_retryable());
        assert!(!Error::Unknown("commit unanswered".into()).is_retryable());
        assert!(!Error::Failed("overdraft".into()).is_retryable());
        assert!(!Error::BadRequest("reversed".into()).is_retryable());
        let config: Error = meridian_core::ConfigError::new("no such file").into();
        assert!(std::error::Error::source(&config).is_some(), "the cause is kept");
    }
}
