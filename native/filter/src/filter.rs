//! One configured filter: its agents, its ticker and the request path.

use std::sync::Arc;
use std::time::Duration;

use sluice_agent::config::RequestPolicy;
use sluice_agent::identity::{ProxyIdentity, made_up_name_warning};
use sluice_agent::memory::MetricValue;
use sluice_agent::request::charge::PendingCharge;
use sluice_agent::request::handler::{self, FollowedRequest, HeadersAction, HttpRequest};

use crate::clock::now_ms;
use crate::config::NativeConfig;
use crate::control_stream::Streams;
use crate::native_host::Shared;
use crate::proxy_name;
use crate::stats::StatsSink;
use crate::ticker::Ticker;
use crate::workers::Workers;

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

    /// The request headers are complete: this worker's agent ticks if
    /// its tick is due, then the agent's request handler decides and
    /// carries the decision out on `request`. An admitted request picked
    /// for the upstream signals is returned in `followed`, for
    /// [`NativeFilter::on_response_headers`].
    ///
    /// An admitted request a cost rule applies to comes back in `charge`,
    /// for [`NativeFilter::on_response_body`] and
    /// [`NativeFilter::on_stream_complete`].
    pub fn on_request_headers(
        &self,
        request: &mut impl HttpRequest,
        followed: &mut Option<FollowedRequest>,
        charge: &mut Option<PendingCharge>,
    ) -> HeadersAction {
        let rejection = {
            let slot = self.workers.local();
            let mut state = slot.lock();
            if slot.take_tick_due() {
                state.tick(now_ms());
            }
            handler::decide(&mut state.agent, &self.request, request, followed, charge)
        };
        handler::answer(request, rejection)
    }

    /// The response headers of a followed request, counted by this
    /// worker's agent (a stream stays on one worker, so it is the agent
    /// that followed it; the leader collects every worker's signals for
    /// the report).
    pub fn on_response_headers(&self, followed: &FollowedRequest, response: &impl HttpRequest) {
        // Read before taking the lock: waiting for it is not latency.
        let observed = handler::observe_response(followed, response);
        let slot = self.workers.local();
        let mut state = slot.lock();
        observed.count(&mut state.agent);
    }

    /// A chunk of a costed request's response body, read as it passes (no
    /// lock: the parser is the request's own); the last if `end_of_stream`.
    pub fn on_response_body(
        &self,
        charge: &mut Option<PendingCharge>,
        chunk: &[u8],
        end_of_stream: bool,
    ) {
        handler::response_body(charge, chunk, end_of_stream);
    }

    /// A costed request's response trailers arrived.
    pub fn on_response_trailers(&self, charge: &mut Option<PendingCharge>) {
        handler::response_trailers(charge);
    }

    /// A costed request's stream is complete (ended, reset or abandoned):
    /// its charge, read from `request`, goes to this worker's agent, the
    /// one that decided it.
    pub fn on_stream_complete(&self, request: &impl HttpRequest, pending: PendingCharge) {
        let Some(settled) = handler::stream_end(&self.request, request, pending) else {
            return;
        };
        let slot = self.workers.local();
        let mut state = slot.lock();
        settled.count(&mut state.agent);
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
