//! A request followed to its response for the upstream signals.

use std::time::Instant;

/// What the response hook needs of a followed request: the bucket its
/// signals count under and when its headers arrived. Held by the module's
/// per-request state between the two hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedRequest {
    /// The bucket the request was decided in.
    pub bucket: String,
    /// When the filter saw its request headers (a monotonic clock: the
    /// native module, unlike a wasm VM, can read one).
    pub started: Instant,
}

impl FollowedRequest {
    /// Microseconds from the request headers to `now`.
    pub fn latency_us(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.started).as_micros()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latency_is_read_defensively() {
        let started = Instant::now();
        let followed = FollowedRequest {
            bucket: "a".to_owned(),
            started,
        };
        assert_eq!(
            followed.latency_us(started + Duration::from_millis(3)),
            3_000
        );
        assert_eq!(followed.latency_us(started), 0);
        // A reading before the start (never, with a monotonic clock) is 0.
        if let Some(earlier) = started.checked_sub(Duration::from_millis(1)) {
            assert_eq!(followed.latency_us(earlier), 0);
        }
    }
}
