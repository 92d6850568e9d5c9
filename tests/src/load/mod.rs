//! An open-loop, paced HTTP load generator; `results.rs` holds what it recorded.
//!
//! Each [`StreamSpec`] sends GET requests at a fixed rate to one Envoy with one
//! tenant header, on its own schedule: request `i` is due at `i / rps` seconds,
//! whatever happened to earlier ones (open loop), so slow or dropped responses
//! do not lower the offered rate. In-flight requests are bounded; a request due
//! while the bound is reached is recorded as [`Outcome::Skipped`] instead of
//! queueing. Every response is recorded with its send and completion times.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod results;
mod spec;

pub use results::{Counts, LoadResult, Outcome, Sample, TimeBase, Window, rate, timeline, within};
pub use spec::StreamSpec;

/// The header the demo configs build bucket keys from.
pub const TENANT_HEADER: &str = "x-tenant";

/// A whole load run.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// The streams, run concurrently.
    pub streams: Vec<StreamSpec>,
    /// How long to send for.
    pub duration: Duration,
    /// Bound on requests in flight across all streams.
    pub max_in_flight: usize,
    /// Per-request timeout (a timeout is recorded as [`Outcome::Error`]).
    pub request_timeout: Duration,
    /// The header carrying [`StreamSpec::tenant`].
    pub tenant_header: String,
}

impl LoadPlan {
    /// A plan with a 512 in-flight bound, 2 s request timeout and the `x-tenant` header.
    pub fn new(streams: Vec<StreamSpec>, duration: Duration) -> Self {
        Self {
            streams,
            duration,
            max_in_flight: 512,
            request_timeout: Duration::from_secs(2),
            tenant_header: TENANT_HEADER.to_owned(),
        }
    }
}

/// Send time of request `index` of a stream at `rps`.
pub fn due_at(index: u64, rps: f64) -> Duration {
    Duration::from_secs_f64(index as f64 / rps)
}

/// Number of requests a stream at `rps` sends in `duration`.
pub fn planned_requests(rps: f64, duration: Duration) -> u64 {
    if rps <= 0.0 {
        return 0;
    }
    (duration.as_secs_f64() * rps).ceil() as u64
}

/// A load run in progress.
#[derive(Debug)]
pub struct LoadRun {
    start: Instant,
    streams: Vec<StreamSpec>,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    in_flight: Arc<Semaphore>,
    max_in_flight: u32,
    request_timeout: Duration,
    tasks: Vec<JoinHandle<()>>,
}

impl LoadRun {
    /// Starts every stream now (needs a Tokio runtime).
    pub fn start(plan: LoadPlan) -> Result<Self> {
        if plan.max_in_flight == 0 {
            bail!("max_in_flight must be > 0");
        }
        if let Some(bad) = plan
            .streams
            .iter()
            .find(|s| !(s.rps.is_finite() && s.rps > 0.0))
        {
            bail!("stream {} has a bad rate: {}", bad.label, bad.rps);
        }
        let max_in_flight = u32::try_from(plan.max_in_flight).context("max_in_flight too large")?;
        let client = reqwest::Client::builder()
            .timeout(plan.request_timeout)
            .connect_timeout(Duration::from_secs(1))
            .pool_max_idle_per_host(plan.max_in_flight)
            .build()
            .context("cannot build the load HTTP client")?;
        let header = reqwest::header::HeaderName::from_bytes(plan.tenant_header.as_bytes())
            .with_context(|| format!("bad header name {:?}", plan.tenant_header))?;
        let start = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(Semaphore::new(plan.max_in_flight));
        let mut tasks = Vec::with_capacity(plan.streams.len());
        for (index, spec) in plan.streams.iter().enumerate() {
            let stream = Stream {
                index,
                url: format!("{}/", spec.base_url.trim_end_matches('/')),
                tenant: spec.tenant.clone(),
                unique_tenants: spec.unique_tenants,
                header: header.clone(),
                rps: spec.rps,
                duration: plan.duration,
                start,
                client: client.clone(),
                samples: samples.clone(),
                stop: stop.clone(),
                in_flight: in_flight.clone(),
            };
            tasks.push(tokio::spawn(stream.run()));
        }
        Ok(Self {
            start,
            streams: plan.streams,
            samples,
            stop,
            in_flight,
            max_in_flight,
            request_timeout: plan.request_timeout,
            tasks,
        })
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The streams, as planned.
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }

    /// A copy of the samples recorded so far.
    pub fn snapshot(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops sending new requests (in-flight ones still complete).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the schedule to end and every in-flight request to finish.
    pub async fn finish(mut self) -> Result<LoadResult> {
        for task in std::mem::take(&mut self.tasks) {
            task.await.context("a load stream task failed")?;
        }
        let drain = self.request_timeout + Duration::from_secs(2);
        let permits = tokio::time::timeout(drain, self.in_flight.acquire_many(self.max_in_flight))
            .await
            .context("in-flight requests did not finish in time")?
            .context("in-flight semaphore closed")?;
        drop(permits);
        let samples =
            std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner));
        Ok(LoadResult {
            streams: std::mem::take(&mut self.streams),
            samples,
        })
    }
}

impl Drop for LoadRun {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Stream {
    index: usize,
    url: String,
    tenant: Option<String>,
    unique_tenants: bool,
    header: reqwest::header::HeaderName,
    rps: f64,
    duration: Duration,
    start: Instant,
    client: reqwest::Client,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    in_flight: Arc<Semaphore>,
}

impl Stream {
    async fn run(self) {
        for i in 0..planned_requests(self.rps, self.duration) {
            let due = due_at(i, self.rps);
            if due >= self.duration {
                break;
            }
            tokio::time::sleep_until(self.start + due).await;
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let sent_at = self.start.elapsed();
            let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
                self.record(sent_at, sent_at, Outcome::Skipped);
                continue;
            };
            let mut request = self.client.get(&self.url);
            match &self.tenant {
                Some(tenant) if self.unique_tenants => {
                    request = request.header(self.header.clone(), format!("{tenant}-{i}"));
                }
                Some(tenant) => request = request.header(self.header.clone(), tenant.as_str()),
                None => {}
            }
            let samples = self.samples.clone();
            let (start, stream) = (self.start, self.index);
            tokio::spawn(async move {
                let outcome = send(request).await;
                let sample = Sample {
                    stream,
                    sent_at,
                    done_at: start.elapsed(),
                    outcome,
                };
                samples
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(sample);
                drop(permit);
            });
        }
    }

    fn record(&self, sent_at: Duration, done_at: Duration, outcome: Outcome) {
        let sample = Sample {
            stream: self.index,
            sent_at,
            done_at,
            outcome,
        };
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sample);
    }
}

async fn send(request: reqwest::RequestBuilder) -> Outcome {
    let Ok(response) = request.send().await else {
        return Outcome::Error;
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .contains_key(reqwest::header::RETRY_AFTER);
    // Read the body so the connection goes back to the pool.
    if response.bytes().await.is_err() {
        return Outcome::Error;
    }
    match status {
        200 => Outcome::Ok,
        429 => Outcome::Limited { retry_after },
        other => Outcome::Status(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(stream: usize, sent_ms: u64, outcome: Outcome) -> Sample {
        Sample {
            stream,
            sent_at: Duration::from_millis(sent_ms),
            done_at: Duration::from_millis(sent_ms + 5),
            outcome,
        }
    }

    #[test]
    fn schedule_is_evenly_paced() {
        assert_eq!(due_at(0, 200.0), Duration::ZERO);
        assert_eq!(due_at(200, 200.0), Duration::from_secs(1));
        assert_eq!(due_at(3, 1000.0), Duration::from_millis(3));
        assert_eq!(planned_requests(450.0, Duration::from_secs(4)), 1800);
        assert_eq!(planned_requests(0.0, Duration::from_secs(4)), 0);
        assert_eq!(planned_requests(3.0, Duration::from_millis(500)), 2);
    }

    #[test]
    fn counts_classify_outcomes() {
        let mut c = Counts::default();
        for outcome in [
            Outcome::Ok,
            Outcome::Limited { retry_after: true },
            Outcome::Limited { retry_after: false },
            Outcome::Status(503),
            Outcome::Status(404),
            Outcome::Error,
            Outcome::Skipped,
        ] {
            c.add(outcome);
        }
        assert_eq!(
            c,
            Counts {
                sent: 6,
                ok: 1,
                limited: 2,
                limited_with_retry_after: 1,
                server_errors: 1,
                other_status: 1,
                errors: 1,
                skipped: 1
            }
        );
        assert_eq!(c.offered(), 7);
        assert!((c.limited_share() - 2.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn window_is_half_open_and_filters_by_time_base() {
        let samples = vec![
            sample(0, 999, Outcome::Ok),
            sample(0, 1000, Outcome::Ok),
            sample(1, 1500, Outcome::Limited { retry_after: true }),
            sample(0, 1998, Outcome::Ok), // done at 2003: outside by completion time
            sample(0, 2000, Outcome::Ok),
        ];
        let w = Window::secs(1.0, 2.0);
        let by_sent = Counts::of(&samples, w, TimeBase::Sent, |_| true);
        assert_eq!((by_sent.ok, by_sent.limited), (2, 1));
        let by_done = Counts::of(&samples, w, TimeBase::Done, |_| true);
        assert_eq!((by_done.ok, by_done.limited), (2, 1)); // 999+5 in, 1998+5 out
        let stream0 = Counts::of(&samples, w, TimeBase::Sent, |s| s.stream == 0);
        assert_eq!(stream0.sent, 2);
    }

    #[test]
    fn rates_and_tolerance() {
        let w = Window::secs(2.0, 6.0);
        assert!((w.len_secs() - 4.0).abs() < 1e-9);
        assert!((rate(800, w) - 200.0).abs() < 1e-9);
        assert_eq!(rate(5, Window::secs(1.0, 1.0)), 0.0);
        assert!(within(219.0, 200.0, 0.1));
        assert!(within(181.0, 200.0, 0.1));
        assert!(!within(221.0, 200.0, 0.1));
        assert!(!within(179.0, 200.0, 0.1));
    }

    #[test]
    fn result_rates_per_tenant() {
        let streams = vec![
            StreamSpec::new("A/acme", "http://a", "acme", 3.0),
            StreamSpec::new("B/acme", "http://b", "acme", 1.0),
            StreamSpec::new("A/free", "http://a", "free", 1.0),
        ];
        let samples = vec![
            sample(0, 100, Outcome::Ok),
            sample(0, 400, Outcome::Limited { retry_after: true }),
            sample(1, 500, Outcome::Ok),
            sample(2, 600, Outcome::Ok),
        ];
        let result = LoadResult { streams, samples };
        let w = Window::secs(0.0, 1.0);
        assert!((result.admitted_rps(w, "acme") - 2.0).abs() < 1e-9);
        assert_eq!(result.tenant_counts(w, "acme").limited, 1);
        assert_eq!(result.counts(w, |s| s.label.starts_with("A/")).sent, 3);
        let table = result.timeline(Duration::from_millis(500));
        assert!(table.contains("A/acme ok/429/bad"), "{table}");
        assert!(table.contains("1/1/0"), "{table}");
    }

    #[test]
    fn start_rejects_bad_plans() {
        let plan = LoadPlan::new(
            vec![StreamSpec::new("x", "http://127.0.0.1:1", "t", 0.0)],
            Duration::from_secs(1),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(async { LoadRun::start(plan).map(drop) })
            .unwrap_err();
        assert!(err.to_string().contains("bad rate"), "{err}");
    }

    /// End to end against a tiny local HTTP server that answers 200 or 429.
    #[tokio::test]
    async fn paced_load_hits_its_target_rate() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = vec![0_u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        let request = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                        let reply = if request.contains("x-tenant: limited") {
                            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n"
                        } else {
                            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n"
                        };
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let base = format!("http://{addr}");
        let plan = LoadPlan::new(
            vec![
                StreamSpec::new("ok", &base, "free", 200.0),
                StreamSpec::new("lim", &base, "limited", 50.0),
            ],
            Duration::from_secs(1),
        );
        let result = LoadRun::start(plan).unwrap().finish().await.unwrap();
        server.abort();
        let w = Window::secs(0.0, 1.0);
        let free = result.tenant_counts(w, "free");
        let limited = result.tenant_counts(w, "limited");
        assert_eq!(free.sent, 200, "{free}");
        assert_eq!(free.ok, 200, "{free}");
        assert_eq!(limited.limited, 50, "{limited}");
        assert_eq!(limited.limited_with_retry_after, 50, "{limited}");
    }
}
