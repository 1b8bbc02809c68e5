//! Bounded retry with exponential backoff and jitter, for calls whose errors say they are
//! worth retrying (503s, 5xx, timeouts). The policy is data so tests can shrink it.

use std::future::Future;
use std::time::Duration;

use rand::RngExt;

/// How often and how long to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    /// Give up after this many attempts in all (≥ 1).
    pub attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(5),
            attempts: 8,
        }
    }
}

impl Backoff {
    /// Delay before attempt `n` (1-based; attempt 1 has none): doubling, capped, with ±25% jitter.
    pub fn delay(&self, n: u32) -> Duration {
        if n <= 1 {
            return Duration::ZERO;
        }
        let exp = self.first.saturating_mul(1u32 << (n - 2).min(16));
        let capped = exp.min(self.max);
        let jitter = rand::rng().random_range(0.75..1.25);
        capped.mul_f64(jitter)
    }
}

/// Runs `op` until it succeeds, fails with an error `retryable` rejects, or attempts run out.
pub async fn retry<T, E, F, Fut>(
    policy: Backoff,
    retryable: impl Fn(&E) -> bool,
    mut op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt < policy.attempts.max(1) && retryable(&e) => {
                attempt += 1;
                tokio::time::sleep(policy.delay(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn fast(attempts: u32) -> Backoff {
        Backoff {
            first: Duration::from_millis(1),
            max: Duration::from_millis(2),
            attempts,
        }
    }

    #[tokio::test]
    async fn retries_retryable_errors_until_success() {
        let calls = AtomicU32::new(0);
        let r: Result<u32, &str> = retry(
            fast(5),
            |e| *e == "503",
            || async {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                if n < 3 { Err("503") } else { Ok(n) }
            },
        )
        .await;
        assert_eq!(r, Ok(3));
    }

    #[tokio::test]
    async fn stops_on_a_permanent_error_and_when_attempts_run_out() {
        let calls = AtomicU32::new(0);
        let r: Result<(), &str> = retry(
            fast(5),
            |e| *e == "503",
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err("400")
            },
        )
        .await;
        assert_eq!((r, calls.load(Ordering::SeqCst)), (Err("400"), 1));
        let calls = AtomicU32::new(0);
        let r: Result<(), &str> = retry(
            fast(4),
            |e| *e == "503",
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err("503")
            },
        )
        .await;
        assert_eq!((r, calls.load(Ordering::SeqCst)), (Err("503"), 4));
    }

    #[test]
    fn delays_grow_and_are_capped() {
        let b = Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
            attempts: 10,
        };
        assert_eq!(b.delay(1), Duration::ZERO);
        assert!(b.delay(2) <= Duration::from_millis(125));
        assert!(b.delay(9) <= Duration::from_millis(1250));
    }
}
