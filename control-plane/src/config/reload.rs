//! Watches the limits file: polls it (no inotify, no extra daemon) and
//! expires overrides, until shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{self, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::config::live::LiveConfig;
use crate::config::overrides::unix_now;

/// How often the file is read when `--reload-poll-ms` is not given.
pub(crate) const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// Polls every `period` until `shutdown` is cancelled.
pub(crate) async fn run(live: Arc<LiveConfig>, period: Duration, shutdown: CancellationToken) {
    let mut interval = time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {
                let live = Arc::clone(&live);
                // File I/O and the policy lock: off the async workers.
                if let Err(err) = tokio::task::spawn_blocking(move || live.poll(unix_now())).await {
                    tracing::error!(%err, "limits file poll failed");
                }
            }
        }
    }
    tracing::debug!("limits file watcher stopped");
}
