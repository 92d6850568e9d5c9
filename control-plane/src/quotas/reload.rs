//! Hot reload of the quota configuration: the quota directory (or file)
//! is read again every poll and the limits file's `quotas:` section is
//! followed as the live configuration changes; a configuration that
//! changed and is valid replaces the old one, an invalid one (or one
//! whose domains clash) is logged and the old one stays.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{self, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::engine::Quotas;
use crate::config::quota_file::QuotaConfig;
use crate::config::quota_section::NativeQuotas;

/// Polls every `period` until `shutdown` is cancelled: `quotas.path` if
/// set, and `section()` (the limits file's `quotas:` section in force).
pub async fn watch(
    quotas: Arc<Quotas>,
    section: impl Fn() -> NativeQuotas + Send,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut interval = time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {
                let error = poll(&quotas, &section).await.err();
                // Once per distinct error: the poll repeats it.
                if let Some(message) = &error
                    && last_error.as_ref() != Some(message)
                {
                    quotas.metrics.config_load(false);
                    tracing::error!(error = %message, "quota configuration not reloaded; the previous one stays");
                }
                last_error = error;
            }
        }
    }
    tracing::debug!("quota configuration watcher stopped");
}

async fn poll(quotas: &Quotas, section: &impl Fn() -> NativeQuotas) -> Result<(), String> {
    if let Some(path) = quotas.path.clone() {
        let shown = path.display().to_string();
        let options = quotas.settings().load;
        let loaded = tokio::task::spawn_blocking(move || QuotaConfig::load(&path, options))
            .await
            .map_err(|err| format!("quota configuration poll failed: {err}"))?
            .map_err(|err| err.to_string());
        let replaced = loaded.and_then(|loaded| quotas.replace(loaded));
        match replaced {
            Ok(true) => {
                quotas.metrics.config_load(true);
                tracing::info!(path = %shown, "quota configuration reloaded");
            }
            Ok(false) => {}
            Err(err) => return Err(err),
        }
    }
    if quotas.set_native(&section())? {
        quotas.metrics.config_load(true);
        tracing::info!("the limits file's quotas: section reloaded");
    }
    Ok(())
}
