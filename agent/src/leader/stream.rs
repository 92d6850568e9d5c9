//! The leader's control-plane stream: closed (waiting for a retry time) or
//! open (reports flowing), with backoff between attempts.
//!
//! Envoy's `open_grpc_stream` succeeds even when the control plane is down;
//! the failure arrives as a close a millisecond later. So a stream counts as
//! healthy, and the backoff resets, only once a message arrives on it.

use rand::Rng;
use sluice_core::backoff::Backoff;

/// Where the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamState {
    /// No stream; the next attempt may start at `retry_at_ms`.
    Closed {
        /// Unix ms of the earliest next attempt.
        retry_at_ms: u64,
    },
    /// A stream is open (`Hello` sent).
    Open {
        /// The host's token for the stream.
        token: u32,
        /// Sequence number of the next `Report`.
        next_sequence: u64,
        /// When the stream opened or last delivered a message.
        last_heard_ms: u64,
    },
}

/// A stream close the caller should log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reconnect {
    /// Milliseconds until the next attempt.
    pub delay_ms: u64,
    /// Consecutive failed attempts, this one included.
    pub failures: u32,
}

/// The stream state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ControlStream {
    state: StreamState,
    backoff: Backoff,
}

impl Default for ControlStream {
    fn default() -> Self {
        Self::new()
    }
}

impl ControlStream {
    /// Closed, ready to open at once.
    pub(crate) fn new() -> Self {
        Self {
            state: StreamState::Closed { retry_at_ms: 0 },
            backoff: Backoff::default(),
        }
    }

    #[cfg(test)]
    /// The current state.
    pub(crate) fn state(&self) -> StreamState {
        self.state
    }

    /// Whether to try opening a stream now.
    pub(crate) fn should_open(&self, now_ms: u64) -> bool {
        matches!(self.state, StreamState::Closed { retry_at_ms } if now_ms >= retry_at_ms)
    }

    /// The token of the open stream.
    pub(crate) fn open_token(&self) -> Option<u32> {
        match self.state {
            StreamState::Open { token, .. } => Some(token),
            StreamState::Closed { .. } => None,
        }
    }

    /// The host opened a stream.
    pub(crate) fn opened(&mut self, token: u32, now_ms: u64) {
        self.state = StreamState::Open {
            token,
            next_sequence: 1,
            last_heard_ms: now_ms,
        };
    }

    /// Opening or sending failed, or the host closed the stream: schedule
    /// the next attempt.
    pub(crate) fn failed(&mut self, now_ms: u64, rng: &mut impl Rng) -> Reconnect {
        let delay_ms = self.backoff.next_delay_ms(rng);
        self.state = StreamState::Closed {
            retry_at_ms: now_ms.saturating_add(delay_ms),
        };
        Reconnect {
            delay_ms,
            failures: self.backoff.failures(),
        }
    }

    /// The host closed stream `token`. `None` if it is not the current
    /// stream (a stream this VM already abandoned).
    pub(crate) fn closed(
        &mut self,
        token: u32,
        now_ms: u64,
        rng: &mut impl Rng,
    ) -> Option<Reconnect> {
        (self.open_token() == Some(token)).then(|| self.failed(now_ms, rng))
    }

    /// A message arrived on `token`; returns whether it is the current
    /// stream. The stream has proved healthy, so the backoff resets.
    pub(crate) fn received(&mut self, token: u32, now_ms: u64) -> bool {
        match &mut self.state {
            StreamState::Open {
                token: open,
                last_heard_ms,
                ..
            } if *open == token => {
                *last_heard_ms = now_ms;
                self.backoff.reset();
                true
            }
            _ => false,
        }
    }

    /// The open stream's token if nothing arrived on it for `timeout_ms`.
    /// A healthy control plane sends at least a heartbeat every second, so
    /// a stream this quiet is wedged: giving it up releases whatever Envoy
    /// buffered for it, and the reconnect finds a working control plane.
    pub(crate) fn silent_for(&self, now_ms: u64, timeout_ms: u64) -> Option<u32> {
        match self.state {
            StreamState::Open {
                token,
                last_heard_ms,
                ..
            } if now_ms.saturating_sub(last_heard_ms) >= timeout_ms => Some(token),
            _ => None,
        }
    }

    /// Takes the sequence number for the next report, if open.
    pub(crate) fn take_sequence(&mut self) -> Option<(u32, u64)> {
        match &mut self.state {
            StreamState::Open {
                token,
                next_sequence,
                ..
            } => {
                let sequence = *next_sequence;
                *next_sequence = next_sequence.saturating_add(1);
                Some((*token, sequence))
            }
            StreamState::Closed { .. } => None,
        }
    }

    /// Abandons the stream (lease lost); returns the token to close.
    pub(crate) fn shut_down(&mut self) -> Option<u32> {
        let token = self.open_token();
        self.state = StreamState::Closed { retry_at_ms: 0 };
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use sluice_core::backoff::MAX_DELAY_MS;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn opens_at_once_then_numbers_reports() {
        let mut stream = ControlStream::new();
        assert!(stream.should_open(0));
        stream.opened(5, 0);
        assert!(!stream.should_open(10));
        assert_eq!(stream.take_sequence(), Some((5, 1)));
        assert_eq!(stream.take_sequence(), Some((5, 2)));
    }

    #[test]
    fn close_schedules_a_jittered_retry() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut stream = ControlStream::new();
        stream.opened(5, 0);
        assert_eq!(
            stream.closed(6, 1000, &mut rng),
            None,
            "foreign token ignored"
        );
        let reconnect = stream.closed(5, 1000, &mut rng).unwrap();
        assert_eq!(reconnect.failures, 1);
        assert!(reconnect.delay_ms <= 250);
        assert_eq!(
            stream.state(),
            StreamState::Closed {
                retry_at_ms: 1000 + reconnect.delay_ms
            }
        );
        assert!(stream.should_open(1000 + reconnect.delay_ms));
        assert_eq!(stream.take_sequence(), None);
    }

    #[test]
    fn repeated_failures_back_off_until_a_message_arrives() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut stream = ControlStream::new();
        let mut last = Reconnect {
            delay_ms: 0,
            failures: 0,
        };
        for token in 1..=10 {
            stream.opened(token, 0);
            last = stream.closed(token, 0, &mut rng).unwrap();
            assert!(last.delay_ms <= MAX_DELAY_MS);
        }
        assert_eq!(last.failures, 10);
        stream.opened(11, 0);
        assert!(stream.received(11, 0));
        assert!(!stream.received(12, 0));
        assert_eq!(stream.closed(11, 0, &mut rng).unwrap().failures, 1);
    }

    #[test]
    fn a_new_stream_restarts_the_sequence() {
        let mut stream = ControlStream::new();
        stream.opened(1, 0);
        stream.take_sequence();
        assert_eq!(stream.shut_down(), Some(1));
        assert_eq!(stream.shut_down(), None);
        stream.opened(2, 0);
        assert_eq!(stream.take_sequence(), Some((2, 1)));
    }
}
