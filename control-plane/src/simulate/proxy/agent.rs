//! One simulated Envoy: the filter's own [`Agent`] on an in-memory host,
//! ticked on the simulated clock, its control-plane stream carried by the
//! simulator.
//!
//! The agent runs exactly as in Envoy (one VM, which serves requests and
//! leads): it takes the lease, opens the stream and says hello, closes its
//! report windows on its own ticks, applies batches, derives allowances and
//! falls back when its directives age. The simulator only moves its
//! messages: what it sent on the stream after each tick, and the batches
//! due to it.

use prost::Message;
use sluice_core::Priority;
use sluice_filter::agent::{Agent, AgentSettings, DEFAULT_DIRECTIVE_POLL_MS, Decision};
use sluice_filter::fake_host::{FakeHost, FakeProcess};
use sluice_proto::v1::{ControlMessage, DirectiveBatch, ProxyMessage, control_message};

/// The Envoy cluster the agent opens its stream on; any name will do.
const CLUSTER: &str = "sluice-control-plane";

/// Where the simulated clock starts on the agent's (Unix) clock: a time
/// well after 1970, so nothing in the agent reads its first ticks as unset.
pub const CLOCK_ORIGIN_MS: u64 = 1_800_000_000_000;

/// A simulated Envoy process with one VM.
pub struct AgentProxy {
    /// Its `proxy_id`.
    id: String,
    settings: AgentSettings,
    seed: u64,
    /// Starts so far: each one is a new Envoy process.
    starts: u64,
    agent: Agent,
    host: FakeHost,
    next_tick_ms: u64,
}

impl AgentProxy {
    /// A proxy whose first tick comes at `first_tick_ms`.
    pub fn new(settings: AgentSettings, seed: u64, first_tick_ms: u64) -> Self {
        let (agent, host) = start(&settings, seed);
        Self {
            id: settings.proxy_id.clone(),
            settings,
            seed,
            starts: 1,
            agent,
            host,
            next_tick_ms: first_tick_ms,
        }
    }

    /// Its `proxy_id`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Shuts the process down and starts a new one at `t_ms`: counts not
    /// reported yet, directives and the stream are gone, as when an Envoy
    /// leaves rotation and comes back.
    pub fn restart(&mut self, t_ms: u64) {
        let seed = self.seed ^ self.starts.wrapping_mul(0xA24B_AED4_963E_E407);
        self.starts += 1;
        (self.agent, self.host) = start(&self.settings, seed);
        self.next_tick_ms = t_ms;
    }

    /// Runs the agent's tick if one is due at `t_ms`, then hands over what
    /// it sent on its streams since, with each stream's token.
    pub fn tick(&mut self, t_ms: u64, sent: &mut Vec<(u32, ProxyMessage)>) {
        if t_ms < self.next_tick_ms {
            return;
        }
        self.next_tick_ms = t_ms + DEFAULT_DIRECTIVE_POLL_MS;
        self.agent.on_tick(&mut self.host, CLOCK_ORIGIN_MS + t_ms);
        let mut process = self.host.process.borrow_mut();
        // Nobody reads the logs and metrics of a simulated VM: keep its
        // memory flat over long runs.
        process.logs.clear();
        for (&token, stream) in &mut process.streams {
            for bytes in stream.sent.drain(..) {
                // The agent encodes what it sends: it always decodes.
                if let Ok(message) = ProxyMessage::decode(bytes.as_slice()) {
                    sent.push((token, message));
                }
            }
        }
    }

    /// Hands `batch` to the agent as a message on stream `token`; nothing
    /// when the agent has closed that stream since.
    pub fn deliver(&mut self, token: u32, batch: DirectiveBatch, t_ms: u64) {
        let open = self
            .host
            .process
            .borrow()
            .streams
            .get(&token)
            .is_some_and(|stream| stream.open);
        if !open {
            return;
        }
        let message = ControlMessage {
            kind: Some(control_message::Kind::Directives(batch)),
        };
        self.agent.on_stream_message(
            &mut self.host,
            token,
            &message.encode_to_vec(),
            CLOCK_ORIGIN_MS + t_ms,
        );
    }

    /// Decides a request of `bucket` for `tenant` (empty: none), as the
    /// filter's request path does; true when admitted.
    pub fn admit(&mut self, bucket: &str, tenant: &str) -> bool {
        self.agent.admit_cell(bucket, tenant, Priority::Unspecified) == Decision::Admit
    }

    /// After an admitted request: whether the agent follows its response.
    pub fn follows_response(&mut self) -> bool {
        self.agent.follow_response().is_some()
    }

    /// The response to a followed request of `bucket`.
    pub fn observe_response(&mut self, bucket: &str, status: u32, latency_us: u64) {
        self.agent
            .observe_response(bucket, status, Some(latency_us));
    }
}

fn start(settings: &AgentSettings, seed: u64) -> (Agent, FakeHost) {
    let host = FakeHost {
        vm: 0,
        process: FakeProcess::new(CLUSTER),
    };
    (Agent::new(settings.clone(), seed), host)
}

/// The agent's settings for a simulated proxy: its cluster, and every
/// other field as given.
pub fn settings(proxy_id: &str, configure: impl FnOnce(&mut AgentSettings)) -> AgentSettings {
    let mut settings = AgentSettings::new(CLUSTER, proxy_id);
    configure(&mut settings);
    settings
}
