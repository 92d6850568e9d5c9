//! Reconnect delays: exponential from 250 ms to 5 s with full jitter, so a
//! fleet of proxies does not reconnect in lockstep after a control-plane
//! restart.

use rand::Rng;

/// Delay cap of the first retry.
pub const BASE_DELAY_MS: u64 = 250;
/// Largest delay cap.
pub const MAX_DELAY_MS: u64 = 5_000;

/// Exponential backoff state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// Records a failure and returns how long to wait before the next
    /// attempt: uniform in `[0, min(MAX, BASE · 2^(failures-1))]`.
    pub fn next_delay_ms(&mut self, rng: &mut impl Rng) -> u64 {
        let cap = self.current_cap_ms();
        self.failures = self.failures.saturating_add(1);
        rng.next_u64() % (cap + 1)
    }

    /// The delay cap the next failure will use.
    pub fn current_cap_ms(&self) -> u64 {
        // Shift by at most 5: 250 << 5 already exceeds the cap.
        (BASE_DELAY_MS << self.failures.min(5)).min(MAX_DELAY_MS)
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Called when a stream proved healthy.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn caps_double_up_to_the_maximum() {
        let mut backoff = Backoff::default();
        let mut rng = SmallRng::seed_from_u64(3);
        let mut caps = Vec::new();
        for _ in 0..8 {
            caps.push(backoff.current_cap_ms());
            let delay = backoff.next_delay_ms(&mut rng);
            assert!(delay <= *caps.last().unwrap());
        }
        assert_eq!(caps, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(backoff.failures(), 8);
        backoff.reset();
        assert_eq!(backoff.current_cap_ms(), BASE_DELAY_MS);
    }

    #[test]
    fn delays_are_jittered() {
        let mut rng = SmallRng::seed_from_u64(9);
        let delays: Vec<u64> = (0..32)
            .map(|_| {
                let mut backoff = Backoff { failures: 6 };
                backoff.next_delay_ms(&mut rng)
            })
            .collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 20, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= MAX_DELAY_MS));
    }
}
