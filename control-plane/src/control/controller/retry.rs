//! How long a rejected client is told to wait.

use crate::types::ControlInterval;

/// Longest `retry_after_ms` ever pushed.
pub(crate) const MAX_RETRY_AFTER_MS: u64 = 30_000;

/// How long a rejected client should wait, from how long its bucket has
/// been over its limit: one second (or two control intervals, if longer)
/// at first, one more second for every ten seconds of overload, at most
/// [`MAX_RETRY_AFTER_MS`], rounded down to whole seconds (but never below
/// the start). Whole seconds, because `Retry-After` carries
/// seconds and because a value that moves every interval would be pushed
/// every interval.
pub(crate) fn retry_after_ms(interval: ControlInterval, overloaded_intervals: u32) -> u64 {
    let interval_ms = interval.as_millis();
    let base = (2 * interval_ms).max(1_000);
    let overloaded_ms = u64::from(overloaded_intervals).saturating_mul(interval_ms);
    let wait = base.saturating_add(overloaded_ms / 10);
    (wait / 1_000 * 1_000).clamp(base, MAX_RETRY_AFTER_MS)
}

/// `wait_ms`, or `repaid_in_s` rounded up to a power of two seconds if
/// longer, at most [`MAX_RETRY_AFTER_MS`]: a budget cell in debt admits
/// less than its share until the debt is repaid, so a client told the
/// usual wait would mostly be refused again. Powers of two, as the
/// filter's waits for large estimates: a debt being repaid changes the
/// wait, and each change is pushed, only a few times.
pub(crate) fn with_debt(wait_ms: u64, repaid_in_s: f64) -> u64 {
    if !(repaid_in_s.is_finite() && repaid_in_s > 0.0) {
        return wait_ms;
    }
    // The cast saturates; the cap bounds it.
    let seconds = (repaid_in_s.ceil() as u64).checked_next_power_of_two();
    let debt_ms = seconds.map_or(u64::MAX, |s| s.saturating_mul(1_000));
    wait_ms.max(debt_ms.min(MAX_RETRY_AFTER_MS))
}
