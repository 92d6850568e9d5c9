//! The native module's clocks: the wall clock the agents tick by, and a
//! monotonic one for a followed request's latency (which the native
//! module, unlike a wasm VM, can read).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Nanoseconds since the first reading in this process, on a monotonic
/// clock ([`sluice_agent::request::handler::HttpRequest::clock_ns`]).
pub fn monotonic_ns() -> Option<u64> {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_never_goes_back() {
        let first = monotonic_ns().unwrap();
        let second = monotonic_ns().unwrap();
        assert!(second >= first);
    }
}
