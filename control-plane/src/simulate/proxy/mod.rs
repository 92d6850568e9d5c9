//! The simulated Envoys, in one of two models: the filter's request-path
//! parts with ideal report timing (the default, on which the published
//! accuracy table is measured) or the filter's whole agent (`--proxy
//! agent`), ticks and report windows included.

mod agent;
mod parts;

pub use agent::{AgentProxy, CLOCK_ORIGIN_MS, settings};
pub use parts::PartsProxy;
use sluice_proto::v1::{DirectiveBatch, ProxyMessage};

/// Which model the simulated proxies run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyModel {
    /// The filter's table, pacer and counters; reports every
    /// `report_interval_ms` exactly.
    #[default]
    Parts,
    /// The filter's [`sluice_filter::agent::Agent`] in each of `workers`
    /// VMs on in-memory hosts of one process.
    Agent {
        /// Worker threads (VMs) per Envoy.
        workers: usize,
    },
}

impl ProxyModel {
    /// The model called `name` on the command line.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "parts" => Some(Self::Parts),
            "agent" => Some(Self::Agent { workers: 1 }),
            _ => None,
        }
    }
}

/// One simulated Envoy.
pub enum SimProxy {
    /// See [`ProxyModel::Parts`].
    Parts(Box<PartsProxy>),
    /// See [`ProxyModel::Agent`].
    Agent(Box<AgentProxy>),
}

impl SimProxy {
    /// Its `proxy_id`.
    pub fn id(&self) -> &str {
        match self {
            Self::Parts(proxy) => proxy.id(),
            Self::Agent(proxy) => proxy.id(),
        }
    }

    /// Starts it again at `t_ms` after it was out of rotation.
    pub fn restart(&mut self, t_ms: u64) {
        match self {
            Self::Parts(proxy) => proxy.restart(t_ms),
            Self::Agent(proxy) => proxy.restart(t_ms),
        }
    }

    /// Its ticks due at `t_ms`, before the millisecond's requests; what it
    /// sent on its streams goes into `sent`.
    pub fn tick(&mut self, t_ms: u64, sent: &mut Vec<(u32, ProxyMessage)>) {
        match self {
            Self::Parts(proxy) => proxy.tick(t_ms, sent),
            Self::Agent(proxy) => proxy.tick(t_ms, sent),
        }
    }

    /// What it sends after the millisecond's requests (the parts model's
    /// reports; the agent reports on its ticks).
    pub fn after_requests(&mut self, t_ms: u64, sent: &mut Vec<(u32, ProxyMessage)>) {
        if let Self::Parts(proxy) = self {
            proxy.report(t_ms, sent);
        }
    }

    /// A batch on stream `token`. The parts model has no freshness for a
    /// heartbeat to renew and skips those.
    pub fn deliver(&mut self, token: u32, batch: DirectiveBatch, heartbeat: bool, t_ms: u64) {
        match self {
            Self::Parts(proxy) if !heartbeat => proxy.deliver(batch),
            Self::Parts(_) => {}
            Self::Agent(proxy) => proxy.deliver(token, batch, t_ms),
        }
    }

    /// Decides a request of `bucket` for `tenant` (empty: none); true when
    /// admitted.
    pub fn admit(&mut self, bucket: &str, tenant: &str) -> bool {
        match self {
            Self::Parts(proxy) => proxy.admit(bucket, tenant),
            Self::Agent(proxy) => proxy.admit(bucket, tenant),
        }
    }

    /// After an admitted request: the worker that may follow its
    /// response, if any.
    pub fn follows_response(&mut self) -> Option<usize> {
        match self {
            Self::Parts(proxy) => proxy.follows_response(),
            Self::Agent(proxy) => proxy.follows_response(),
        }
    }

    /// The response to a request of `bucket` that `worker` followed.
    pub fn observe_response(&mut self, worker: usize, bucket: &str, status: u32, latency_us: u64) {
        match self {
            Self::Parts(proxy) => proxy.observe_response(bucket, status, latency_us),
            Self::Agent(proxy) => proxy.observe_response(worker, bucket, status, latency_us),
        }
    }
}
