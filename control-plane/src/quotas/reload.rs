//! Hot reload of the quota configuration: the file or directory is read
//! again every poll; a configuration that changed and is valid replaces
//! the old one, an invalid one is logged and the old one stays.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{self, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{QuotaConfig, Quotas};

/// Polls `quotas.path` every `period` until `shutdown` is cancelled.
pub async fn watch(quotas: Arc<Quotas>, period: Duration, shutdown: CancellationToken) {
    let Some(path) = quotas.path.clone() else {
        return;
    };
    let mut interval = time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {
                let path = path.clone();
                let loaded = tokio::task::spawn_blocking(move || QuotaConfig::from_path(&path)).await;
                match loaded {
                    Ok(Ok(config)) => {
                        if *quotas.config() != config {
                            quotas.replace(config);
                            tracing::info!(path = %quotas.path.as_ref().map_or(String::new(), |p| p.display().to_string()), "quota configuration reloaded");
                        }
                        last_error = None;
                    }
                    Ok(Err(err)) => {
                        let message = err.to_string();
                        // Once per distinct error: the poll repeats it.
                        if last_error.as_deref() != Some(message.as_str()) {
                            tracing::error!(error = %message, "quota configuration not reloaded; the previous one stays");
                            last_error = Some(message);
                        }
                    }
                    Err(err) => tracing::error!(%err, "quota configuration poll failed"),
                }
            }
        }
    }
    tracing::debug!("quota configuration watcher stopped");
}
