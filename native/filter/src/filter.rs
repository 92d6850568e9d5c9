//! One configured filter: its agents, its ticker and the request path.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_agent::config::RequestPolicy;
use sluice_agent::identity::{ProxyIdentity, made_up_name_warning};
use sluice_agent::memory::MetricValue;
use sluice_agent::request::attributes::RequestAttributes;
use sluice_agent::upstream::status_of;

use crate::config::NativeConfig;
use crate::control_stream::Streams;
use crate::followed::FollowedRequest;
use crate::native_host::Shared;
use crate::proxy_name;
use crate::stats::StatsSink;
use crate::ticker::Ticker;
use crate::workers::{Workers, now_ms};

/// Status of a dropped request.
const REJECT_STATUS: u16 = 429;

/// What the filter needs from the proxy for one request.
pub trait RequestHost {
    /// The first value of a request header (`name` in lower case).
    fn request_header(&self, name: &str) -> Option<&[u8]>;
    /// The name of the route the request matched, if it has one.
    fn route_name(&self) -> Option<&[u8]>;
    /// Adds a request header that goes upstream.
    fn add_request_header(&mut self, name: &str, value: &[u8]);
    /// Stores the request's decision record for access logs.
    fn set_decision_record(&mut self, record: &[u8]);
    /// Answers the request from the proxy instead of the upstream.
    fn send_local_reply(&mut self, status: u16, headers: &[(&str, &[u8])], body: &[u8]);
}

/// Whether Envoy goes on with the request after the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersAction {
    /// On to the next filter.
    Continue,
    /// The filter answered the request.
    Stop,
}

/// Why the filter could not start.
#[derive(Debug, thiserror::Error)]
#[error("sluice_native: cannot start its {what}: {source}")]
pub struct StartError {
    what: &'static str,
    source: std::io::Error,
}

/// One configured filter, shared by every request of every worker.
#[derive(Debug)]
pub struct NativeFilter {
    request: RequestPolicy,
    shared: Arc<Shared>,
    workers: Arc<Workers>,
    // Declared last: dropped after the agents are retired in `Drop`.
    ticker: Option<Ticker>,
}

impl NativeFilter {
    /// Starts the filter: its runtime thread (streams) and ticker thread,
    /// which exports the agents' metrics to `stats`.
    pub fn start(config: NativeConfig, stats: Arc<dyn StatsSink>) -> Result<Self, StartError> {
        let filter = config.filter;
        let streams =
            Streams::new(&config.control_plane_uris, config.tls.as_ref()).map_err(|source| {
                StartError {
                    what: "gRPC client",
                    source,
                }
            })?;
        let shared = Arc::new(Shared {
            store: Arc::default(),
            streams,
            metrics: Arc::default(),
        });
        // A module cannot read Envoy's node id: without a configured id the
        // proxy is named after its host and process.
        let parts = filter.into_parts(
            || {
                let name = proxy_name::made_up();
                eprintln!("[sluice_native][warn] {}", made_up_name_warning(&name));
                ProxyIdentity::Named(name)
            },
            String::new,
        );
        let workers = Arc::new(Workers::new(parts.agent, Arc::clone(&shared)));
        let ticker = Ticker::start(
            Arc::clone(&workers),
            Arc::clone(&shared),
            stats,
            Duration::from_millis(parts.directive_poll_ms),
        )
        .map_err(|source| StartError {
            what: "ticker thread",
            source,
        })?;
        Ok(Self {
            request: parts.request,
            shared,
            workers,
            ticker: Some(ticker),
        })
    }

    /// The request headers are complete: classify, count, decide. An
    /// admitted request picked for the upstream signals is returned in
    /// `followed`, for [`NativeFilter::on_response_headers`].
    pub fn on_request_headers(
        &self,
        host: &mut impl RequestHost,
        followed: &mut Option<FollowedRequest>,
    ) -> HeadersAction {
        let slot = self.workers.local();
        let decision = {
            let mut state = slot.lock();
            if slot.take_tick_due() {
                state.tick(now_ms());
            }
            let decision = state
                .agent
                .admit_request(&self.request.classifier, &Attributes(&*host));
            if decision.admits()
                && let Some(bucket) = state.agent.follow_response()
            {
                *followed = Some(FollowedRequest {
                    bucket,
                    started: Instant::now(),
                });
            }
            if self.request.decision_record.records(&decision) {
                host.set_decision_record(state.agent.last_record().as_bytes());
            }
            if decision.admits()
                && decision.source.is_undirected()
                && let Some(header) = self.request.undirected_header.as_deref()
            {
                host.add_request_header(header, decision.source.name().as_bytes());
            }
            state.agent.rejection().cloned()
        };
        match decision {
            None => HeadersAction::Continue,
            Some(response) => {
                let headers: Vec<(&str, &[u8])> = response
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes()))
                    .collect();
                host.send_local_reply(REJECT_STATUS, &headers, &response.body);
                HeadersAction::Stop
            }
        }
    }

    /// The response headers of a followed request: its `:status` value and
    /// the time since its request headers, counted by this worker's agent
    /// (a stream stays on one worker, so it is the agent that followed it;
    /// the leader collects every worker's signals for the report).
    pub fn on_response_headers(&self, followed: FollowedRequest, status: Option<&[u8]>) {
        let latency_us = followed.latency_us(Instant::now());
        let status = status_of(status);
        let slot = self.workers.local();
        let mut state = slot.lock();
        state
            .agent
            .observe_response(&followed.bucket, status, Some(latency_us));
    }

    /// A hook panicked for a request, which went on unfiltered: counted in
    /// `sluice.native_hook_panics`.
    pub fn count_hook_panic(&self) {
        let id = self.shared.metrics.define(
            sluice_agent::host::MetricKind::Counter,
            crate::stats::HOOK_PANICS,
        );
        // The id was just defined, so it exists.
        let _ = self.shared.metrics.increment(id, 1);
    }

    /// The agents' metrics (counters summed over workers).
    pub fn metrics(&self) -> Vec<MetricValue> {
        self.shared.metrics.snapshot()
    }
}

impl Drop for NativeFilter {
    fn drop(&mut self) {
        // Stop ticking first, then close the agents' streams.
        drop(self.ticker.take());
        self.workers.retire();
    }
}

/// The request as the classifier reads it: Envoy's bytes, borrowed for the
/// hook. What bytes that are not UTF-8 mean is the wasm filter's rule
/// (`sluice_agent::request::attributes`), so both data planes classify a
/// request alike.
struct Attributes<'a, H: RequestHost>(&'a H);

impl<H: RequestHost> RequestAttributes for Attributes<'_, H> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.0.request_header(name).map(Cow::Borrowed)
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        self.0.route_name().map(Cow::Borrowed)
    }
}
