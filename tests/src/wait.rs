//! Polling with a deadline: every wait in the harness is bounded.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::time::Instant;

/// Calls `probe` every `every` until it returns `Ok(Some(value))`, or fails
/// after `timeout` with `what` and the last probe error in the message.
/// An `Err` from the probe is remembered and the probe retried.
pub async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error: Option<anyhow::Error> = None;
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(err) => last_error = Some(err),
        }
        if Instant::now() >= deadline {
            match last_error {
                Some(err) => bail!("timed out after {timeout:?} waiting for {what}: {err:#}"),
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_ready_value() {
        let mut calls = 0;
        let value = until(
            "three calls",
            Duration::from_secs(1),
            Duration::from_millis(1),
            || {
                calls += 1;
                let ready = calls >= 3;
                async move { Ok(ready.then_some(42)) }
            },
        )
        .await
        .unwrap();
        assert_eq!(value, 42);
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn times_out_with_the_last_error() {
        let err = until::<(), _, _>(
            "never",
            Duration::from_millis(20),
            Duration::from_millis(5),
            || async { Err(anyhow::anyhow!("connection refused")) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("never"), "{err}");
        assert!(err.contains("connection refused"), "{err}");
    }
}
