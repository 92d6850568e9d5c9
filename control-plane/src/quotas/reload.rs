//! Hot reload of the quota configuration: the quota directory (or file)
//! is read again every poll and the limits file's `quotas:` section is
//! followed as the live configuration changes; a configuration that
//! changed and is valid replaces the old one, an invalid one (or one
//! whose domains clash) is logged and the old one stays. What the
//! directory says is taken once two polls in a row read the same: a file
//! caught while it is rewritten in place reads empty or cut short.

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
    let mut last_read = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {
                let error = poll(&quotas, &section, &mut last_read).await.err();
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

/// One poll: the directory's configuration if `last_read` (what the poll
/// before read of it) is the same, then the limits file's section.
async fn poll(
    quotas: &Quotas,
    section: &impl Fn() -> NativeQuotas,
    last_read: &mut Option<Result<QuotaConfig, String>>,
) -> Result<(), String> {
    if let Some(path) = quotas.path.clone() {
        let shown = path.display().to_string();
        let options = quotas.settings().load;
        let loaded = tokio::task::spawn_blocking(move || QuotaConfig::load(&path, options))
            .await
            .map_err(|err| format!("quota configuration poll failed: {err}"))?
            .map_err(|err| err.to_string());
        // An error too is reported once it reads the same twice.
        let replaced = if last_read.as_ref() == Some(&loaded) {
            loaded.and_then(|loaded| quotas.replace(loaded))
        } else {
            *last_read = Some(loaded);
            Ok(false)
        };
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::quotas::settings::QuotaSettings;

    const QUOTA: &str = "domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

    /// A quota file rewritten in place reads empty, then cut short, then
    /// whole: what a poll reads is taken only when the poll after it reads
    /// the same, so the domain is never lost meanwhile.
    #[tokio::test]
    async fn a_file_caught_while_being_written_is_not_put_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("shop.yaml");
        std::fs::write(&file, QUOTA).unwrap();
        let loaded = QuotaConfig::load(&file, QuotaSettings::default().load).unwrap();
        let quotas = Quotas::new(
            loaded.clone(),
            Some(file.clone()),
            QuotaSettings::default(),
            Arc::new(|| 0),
            crate::metrics::ControlPlaneMetrics::new(1).quotas(),
        );
        let section = NativeQuotas::default;
        let mut last_read = None;
        poll(&quotas, &section, &mut last_read).await.unwrap();
        for caught in ["", "domain: shop\n", &QUOTA[..QUOTA.len() - 30]] {
            std::fs::write(&file, caught).unwrap();
            let _ = poll(&quotas, &section, &mut last_read).await;
            assert_eq!(*quotas.config(), loaded, "{caught:?} put in force");
            std::fs::write(&file, QUOTA).unwrap();
            poll(&quotas, &section, &mut last_read).await.unwrap();
            assert_eq!(*quotas.config(), loaded, "{caught:?}");
        }
        // A change read twice is taken.
        let edited = QUOTA.replace("requests_per_unit: 5", "requests_per_unit: 9");
        std::fs::write(&file, &edited).unwrap();
        poll(&quotas, &section, &mut last_read).await.unwrap();
        assert_eq!(*quotas.config(), loaded, "seen once");
        poll(&quotas, &section, &mut last_read).await.unwrap();
        assert_ne!(*quotas.config(), loaded, "seen twice");
        // An invalid one is reported once it reads the same twice.
        std::fs::write(&file, "domain: shop\ndescriptors: 7\n").unwrap();
        assert!(poll(&quotas, &section, &mut last_read).await.is_ok());
        assert!(poll(&quotas, &section, &mut last_read).await.is_err());
    }
}
