//! The upstream of the adaptive-limit scenarios: a service whose capacity
//! changes over time, modelled as the integration tests' capped upstream
//! serves (tests/src/capped_upstream.rs): one request after another at
//! `1 / capacity` each, the rest queued while their wait stays within a
//! bound (so latency grows with the queue, as a saturated service's does),
//! 503 at once past it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::load::Load;

/// Below this capacity the service is treated as serving this much: a
/// capacity of 0 would make every service time infinite.
const MIN_CAPACITY_RPS: f64 = 0.001;

/// What the upstream can serve, over time.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSpec {
    /// Requests per second it serves.
    pub capacity: Load,
    /// Longest wait in its queue; a request that would wait longer is
    /// answered 503 at once.
    pub max_wait_ms: f64,
    /// Latency added to every response (the network and the work that is
    /// not queued).
    pub base_latency_ms: f64,
}

/// One response on its way back to the proxy that admitted its request.
/// Ordered by when it arrives, then by when its request was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Response {
    /// When the proxy sees it.
    pub due_ms: u64,
    /// Order of service, so that equal due times stay in order.
    sequence: u64,
    /// Index of the proxy that admitted the request.
    pub proxy: usize,
    /// Index of the request's bucket in the scenario.
    pub bucket: usize,
    /// HTTP status.
    pub status: u32,
    /// The proxy's worker that follows this response into its signals,
    /// if one does.
    pub followed: Option<usize>,
    /// From the request to the response.
    pub latency_us: u64,
}

impl Response {
    /// Whether it is a 5xx.
    pub fn is_error(&self) -> bool {
        (500..600).contains(&self.status)
    }
}

/// The service and the responses it has not sent back yet.
#[derive(Debug)]
pub struct Upstream {
    spec: UpstreamSpec,
    /// When the server finishes the work it has accepted, in (fractional)
    /// milliseconds.
    busy_until_ms: f64,
    pending: BinaryHeap<Reverse<Response>>,
    served: u64,
}

impl Upstream {
    /// An idle service.
    pub fn new(spec: UpstreamSpec) -> Self {
        Self {
            spec,
            busy_until_ms: 0.0,
            pending: BinaryHeap::new(),
            served: 0,
        }
    }

    /// The capacity at `t_ms`.
    pub fn capacity_at(&self, t_ms: u64) -> f64 {
        self.spec.capacity.rps_at(t_ms)
    }

    /// A request `proxy` admitted at `t_ms`: queued behind the work
    /// accepted before it, or answered 503 at once if it would wait longer
    /// than the bound. `followed`: the proxy's worker that follows its
    /// response.
    pub fn serve(&mut self, t_ms: u64, proxy: usize, bucket: usize, followed: Option<usize>) {
        let now = t_ms as f64;
        let service_ms = 1_000.0 / self.capacity_at(t_ms).max(MIN_CAPACITY_RPS);
        let start = self.busy_until_ms.max(now);
        let (status, done) = if start - now > self.spec.max_wait_ms {
            (503, now)
        } else {
            self.busy_until_ms = start + service_ms;
            (200, self.busy_until_ms)
        };
        let latency_ms = done - now + self.spec.base_latency_ms;
        self.served += 1;
        self.pending.push(Reverse(Response {
            due_ms: t_ms + latency_ms.ceil() as u64,
            sequence: self.served,
            proxy,
            bucket,
            status,
            followed,
            latency_us: (latency_ms * 1_000.0).round() as u64,
        }));
    }

    /// The next response due by `t_ms`, if any; call until `None`.
    pub fn next_due(&mut self, t_ms: u64) -> Option<Response> {
        if self.pending.peek()?.0.due_ms > t_ms {
            return None;
        }
        self.pending.pop().map(|Reverse(response)| response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(capacity_rps: f64) -> Upstream {
        Upstream::new(UpstreamSpec {
            capacity: Load::Constant(capacity_rps),
            max_wait_ms: 200.0,
            base_latency_ms: 5.0,
        })
    }

    fn drain(upstream: &mut Upstream, t_ms: u64) -> Vec<Response> {
        std::iter::from_fn(|| upstream.next_due(t_ms)).collect()
    }

    #[test]
    fn below_capacity_every_request_takes_its_service_time() {
        let mut upstream = upstream(100.0);
        // One request every 20 ms to a service taking 10 ms each.
        for t_ms in (0..1_000).step_by(20) {
            upstream.serve(t_ms, 0, 0, None);
        }
        let responses = drain(&mut upstream, 2_000);
        assert_eq!(responses.len(), 50);
        for response in responses {
            assert_eq!(response.status, 200);
            assert_eq!(response.latency_us, 15_000, "{response:?}");
        }
    }

    #[test]
    fn over_capacity_the_queue_grows_to_its_bound_then_503s() {
        let mut upstream = upstream(100.0);
        // 1,000 requests at once: 21 fit within a 200 ms wait at 10 ms
        // each (the one served at once and 20 behind it), the rest are
        // refused.
        for _ in 0..1_000 {
            upstream.serve(0, 0, 0, None);
        }
        let responses = drain(&mut upstream, 10_000);
        let ok: Vec<&Response> = responses.iter().filter(|r| !r.is_error()).collect();
        assert_eq!(ok.len(), 21);
        assert_eq!(ok.last().unwrap().latency_us, 215_000);
        assert!(
            responses
                .iter()
                .filter(|r| r.is_error())
                .all(|r| r.latency_us == 5_000)
        );
        // Responses come back in the order they are due.
        assert!(responses.windows(2).all(|w| w[0].due_ms <= w[1].due_ms));
    }

    #[test]
    fn nothing_is_due_before_its_time() {
        let mut upstream = upstream(100.0);
        upstream.serve(0, 3, 1, Some(0));
        assert_eq!(upstream.next_due(14), None);
        let response = upstream.next_due(15).unwrap();
        assert_eq!((response.proxy, response.bucket), (3, 1));
        assert_eq!(upstream.next_due(1_000), None);
    }
}
