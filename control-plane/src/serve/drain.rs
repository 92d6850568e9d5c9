//! How long the servers drain after the shutdown signal: open calls get
//! [`DRAIN_TIMEOUT`] to finish, then whatever is still open is closed.
//!
//! Why a bound: a server's graceful shutdown waits for each connection to
//! close, and an HTTP/2 connection closes only once its client answers
//! the server's last ping. A client that does not (hung, partitioned)
//! held SIGTERM for the 30 s of the keepalive's interval and timeout,
//! which is when an orchestrator's default grace period kills the process.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How long open calls get after the shutdown signal.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `serve` (a server that drains when `shutdown` fires) until it
/// returns, or until `drain` after `shutdown` fired: then it is dropped
/// with what it still holds open, and the result is `Ok`.
pub(crate) async fn bounded<E>(
    server: &'static str,
    serve: impl Future<Output = Result<(), E>>,
    shutdown: &CancellationToken,
    drain: Duration,
) -> Result<(), E> {
    tokio::select! {
        result = serve => result,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(drain).await;
        } => {
            tracing::warn!(server, drain_ms = drain.as_millis() as u64, "connections still open after the drain: closing them");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAIN: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_server_that_drains_in_time_returns_its_own_result() {
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let serve = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Err::<(), _>("failed")
        };
        let result = bounded("test", serve, &shutdown, Duration::from_secs(60)).await;
        assert_eq!(result, Err("failed"));
    }

    #[tokio::test]
    async fn a_server_still_draining_is_dropped_at_the_bound() {
        let shutdown = CancellationToken::new();
        let never = std::future::pending::<Result<(), ()>>();
        let run = bounded("test", never, &shutdown, DRAIN);
        tokio::pin!(run);
        // Before the signal nothing bounds it.
        let early = tokio::time::timeout(DRAIN * 4, &mut run).await;
        assert!(early.is_err(), "{early:?}");
        shutdown.cancel();
        let signalled = tokio::time::Instant::now();
        assert_eq!(run.await, Ok(()));
        assert!(signalled.elapsed() >= DRAIN);
    }
}
