//! The native module's clock for a followed request's latency: monotonic,
//! which the native module, unlike a wasm VM, can read.

use std::sync::OnceLock;
use std::time::Instant;

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
