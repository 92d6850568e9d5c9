//! A local token bucket for the limits a VM enforces on its own: the
//! fallback after the directive TTL and the limit of new buckets.
//!
//! Time is the VM's tick clock (the request path reads no clock), so tokens
//! refill in steps of one tick; the bucket holds one second's worth of
//! tokens (at least one), so a rate is enforced over seconds, not
//! milliseconds.

/// Tokens and their refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    rate_per_ms: f64,
    capacity: f64,
    tokens: f64,
    last_ms: u64,
}

impl TokenBucket {
    /// A full bucket for `rate_per_s` requests per second at `now_ms`.
    pub fn new(rate_per_s: f64, now_ms: u64) -> Self {
        let rate = if rate_per_s.is_finite() && rate_per_s > 0.0 {
            rate_per_s
        } else {
            0.0
        };
        let capacity = rate.max(1.0);
        Self {
            rate_per_ms: rate / 1000.0,
            capacity,
            tokens: capacity,
            last_ms: now_ms,
        }
    }

    /// Requests per second.
    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_ms * 1000.0
    }

    /// Changes the rate, keeping the tokens (capped at the new capacity).
    pub fn set_rate(&mut self, rate_per_s: f64) {
        let fresh = Self::new(rate_per_s, self.last_ms);
        self.rate_per_ms = fresh.rate_per_ms;
        self.capacity = fresh.capacity;
        self.tokens = self.tokens.min(self.capacity);
    }

    /// Takes one token if there is one.
    #[inline]
    pub fn try_take(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        if elapsed > 0 {
            self.tokens = (self.tokens + elapsed as f64 * self.rate_per_ms).min(self.capacity);
            self.last_ms = now_ms;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn admits_the_rate_over_time() {
        let mut bucket = TokenBucket::new(10.0, 0);
        let mut admitted = 0;
        // 100 requests per 20 ms tick for 10 s.
        for tick in 0..500u64 {
            for _ in 0..100 {
                admitted += usize::from(bucket.try_take(tick * 20));
            }
        }
        // One second of burst plus ten seconds of refill.
        assert!((100..=111).contains(&admitted), "{admitted}");
    }

    #[test]
    fn zero_rate_admits_the_first_only() {
        let mut bucket = TokenBucket::new(0.0, 0);
        assert!(bucket.try_take(0));
        assert!(!bucket.try_take(10_000));
        let mut nan = TokenBucket::new(f64::NAN, 0);
        assert_eq!(nan.rate_per_s(), 0.0);
        assert!(nan.try_take(0));
    }

    #[test]
    fn a_clock_going_backwards_adds_nothing() {
        let mut bucket = TokenBucket::new(1.0, 1000);
        assert!(bucket.try_take(1000));
        assert!(!bucket.try_take(500));
        assert!(bucket.try_take(2000));
    }

    #[test]
    fn set_rate_caps_the_tokens() {
        let mut bucket = TokenBucket::new(100.0, 0);
        bucket.set_rate(2.0);
        assert!(bucket.try_take(0));
        assert!(bucket.try_take(0));
        assert!(!bucket.try_take(0));
    }
}
