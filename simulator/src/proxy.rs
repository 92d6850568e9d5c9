//! One simulated Envoy: the filter's own [`Agent`] in each of its workers'
//! VMs, on in-memory hosts that share one process (shared data, queues,
//! streams), ticked on the simulated clock, its control-plane stream
//! carried by the simulator.
//!
//! The agents run exactly as in Envoy: they elect a leader through the
//! lease, which opens the stream and says hello, collects the other VMs'
//! hand-offs, closes report windows on its own ticks and publishes the
//! table, the process rates and the worker count; every VM decides its own
//! requests, derives allowances and falls back when its directives age.
//! Envoy balances connections, not requests, over its workers: the
//! clients' requests go over a few connections, each pinned to a worker,
//! and a connection that has carried its share is replaced by one on a
//! random worker. The simulator only moves messages: what the VMs sent on
//! their streams after each tick, and the batches due to them.

use std::cell::RefCell;
use std::rc::Rc;

use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_agent::agent::Agent;
use sluice_agent::config::RequestPolicy;
use sluice_agent::request::charge::PendingCharge;
use sluice_agent::request::handler::{self, HttpRequest};
use sluice_agent::settings::{AgentSettings, DEFAULT_DIRECTIVE_POLL_MS};
use sluice_agent::testing::host::{FakeHost, FakeProcess};
use sluice_agent::usage::Charge;
use sluice_core::Priority;
use sluice_proto::v1::{ControlMessage, DirectiveBatch, ProxyMessage, control_message};

/// The Envoy cluster the agents open their stream on; any name will do.
const CLUSTER: &str = "sluice-control-plane";

/// Where the simulated clock starts on the agent's (Unix) clock: a time
/// well after 1970, so nothing in the agent reads its first ticks as unset.
pub const CLOCK_ORIGIN_MS: u64 = 1_800_000_000_000;

/// Client connections to one Envoy (each pinned to a worker).
const CONNECTIONS: usize = 8;
/// Requests a connection carries before the client replaces it.
const REQUESTS_PER_CONNECTION: u32 = 200;

/// A simulated Envoy process with one VM per worker.
pub struct AgentProxy {
    /// Its `proxy_id`.
    id: String,
    settings: AgentSettings,
    seed: u64,
    workers: usize,
    /// Starts so far: each one is a new Envoy process.
    starts: u64,
    vms: Vec<Vm>,
    /// What the VMs of the current process share.
    process: Rc<RefCell<FakeProcess>>,
    /// The clients' connections: the worker each is on, and the requests
    /// it still carries.
    connections: Vec<(usize, u32)>,
    next_connection: usize,
    /// Draws the worker of a new connection.
    rng: SmallRng,
    /// The worker whose VM decided the last request.
    last_vm: usize,
}

/// One worker's VM.
struct Vm {
    agent: Agent,
    host: FakeHost,
    next_tick_ms: u64,
}

impl AgentProxy {
    /// A proxy of `workers` VMs (at least one) whose first tick comes at
    /// `first_tick_ms`.
    pub fn new(settings: AgentSettings, seed: u64, workers: usize, first_tick_ms: u64) -> Self {
        let workers = workers.max(1);
        let mut proxy = Self {
            id: settings.proxy_id.to_string(),
            settings,
            seed,
            workers,
            starts: 0,
            vms: Vec::new(),
            process: FakeProcess::new(CLUSTER),
            connections: Vec::new(),
            next_connection: 0,
            rng: SmallRng::seed_from_u64(seed),
            last_vm: 0,
        };
        proxy.start(first_tick_ms);
        proxy
    }

    /// Its `proxy_id`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Shuts the process down and starts a new one at `t_ms`: counts not
    /// reported yet, directives and the stream are gone, as when an Envoy
    /// leaves rotation and comes back.
    pub fn restart(&mut self, t_ms: u64) {
        self.start(t_ms);
    }

    fn start(&mut self, first_tick_ms: u64) {
        let seed = self.seed ^ self.starts.wrapping_mul(0xA24B_AED4_963E_E407);
        self.starts += 1;
        self.rng = SmallRng::seed_from_u64(seed);
        let process = FakeProcess::new(CLUSTER);
        self.process = Rc::clone(&process);
        self.vms = (0..self.workers)
            .map(|vm| Vm {
                agent: Agent::new(self.settings.clone(), self.rng.next_u64()),
                host: FakeProcess::host(&process, vm),
                // Each worker's timer runs at its own phase.
                next_tick_ms: first_tick_ms
                    + self.rng.next_u64() % DEFAULT_DIRECTIVE_POLL_MS * u64::from(vm > 0),
            })
            .collect();
        self.connections = (0..CONNECTIONS)
            .map(|_| (pick_worker(&mut self.rng, self.workers), 0))
            .collect();
        self.next_connection = 0;
    }

    /// Runs the ticks due at `t_ms`, then hands over what the VMs sent on
    /// their streams since, with each stream's token.
    pub fn tick(&mut self, t_ms: u64, sent: &mut Vec<(u32, ProxyMessage)>) {
        for vm in &mut self.vms {
            if t_ms < vm.next_tick_ms {
                continue;
            }
            vm.next_tick_ms = t_ms + DEFAULT_DIRECTIVE_POLL_MS;
            vm.agent.on_tick(&mut vm.host, CLOCK_ORIGIN_MS + t_ms);
        }
        let mut process = self.process.borrow_mut();
        // Nobody reads the logs of a simulated VM: keep memory flat.
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

    /// Hands `batch` to the VM that opened stream `token`; nothing when it
    /// has closed that stream since.
    pub fn deliver(&mut self, token: u32, batch: DirectiveBatch, t_ms: u64) {
        let owner = self
            .process
            .borrow()
            .streams
            .get(&token)
            .filter(|stream| stream.open)
            .map(|stream| stream.vm);
        let Some(vm) = owner.and_then(|owner| self.vms.get_mut(owner)) else {
            return;
        };
        let message = ControlMessage {
            kind: Some(control_message::Kind::Directives(batch)),
        };
        vm.agent.on_stream_message(
            &mut vm.host,
            token,
            &message.encode_to_vec(),
            CLOCK_ORIGIN_MS + t_ms,
        );
    }

    /// Decides a request of `bucket` for `tenant` (empty: none) on the
    /// worker of the next connection, as the filter's request path does;
    /// true when admitted.
    pub fn admit(&mut self, bucket: &str, tenant: &str) -> bool {
        let worker = self.next_worker();
        self.vms.get_mut(worker).is_some_and(|vm| {
            vm.agent
                .admit_cell(bucket, tenant, Priority::Unspecified)
                .admits()
        })
    }

    /// Decides a request a cost rule of `policy` applies to on the worker
    /// of the next connection, through the filter's request handler (its
    /// estimate counted as offered and, if admitted, as admitted cost);
    /// the stream to settle when its response ends, if admitted.
    pub fn admit_costed(
        &mut self,
        policy: &RequestPolicy,
        request: &mut impl HttpRequest,
    ) -> (bool, Option<OpenStream>) {
        let worker = self.next_worker();
        let Some(vm) = self.vms.get_mut(worker) else {
            return (false, None);
        };
        let (mut followed, mut charge) = (None, None);
        let _ = handler::decide(&mut vm.agent, policy, request, &mut followed, &mut charge);
        let admitted = vm.agent.last_decision().admits();
        let stream = charge.map(|pending| OpenStream {
            worker,
            start: self.starts,
            pending,
        });
        (admitted, stream)
    }

    /// The response of `stream` ended as `response` says: the filter's
    /// handler settles its charge and counts it in the VM that decided it.
    /// `None` when that process has been restarted since (its counts are
    /// gone) or the rule no longer applies.
    pub fn end_stream(
        &mut self,
        policy: &RequestPolicy,
        stream: OpenStream,
        response: &impl HttpRequest,
    ) -> Option<Charge> {
        if stream.start != self.starts {
            return None;
        }
        let vm = self.vms.get_mut(stream.worker)?;
        let settled = handler::stream_end(policy, response, stream.pending)?;
        let charge = settled.charge();
        settled.count(&mut vm.agent);
        Some(charge)
    }

    /// The worker of the next connection: Envoy balances connections, not
    /// requests.
    fn next_worker(&mut self) -> usize {
        let index = self.next_connection % self.connections.len().max(1);
        self.next_connection = self.next_connection.wrapping_add(1);
        let worker = match self.connections.get_mut(index) {
            Some((worker, carried)) => {
                *carried += 1;
                let on = *worker;
                if *carried >= REQUESTS_PER_CONNECTION {
                    *worker = pick_worker(&mut self.rng, self.workers);
                    *carried = 0;
                }
                on
            }
            None => 0,
        };
        self.last_vm = worker;
        worker
    }

    /// After an admitted request: the worker that follows its response, if
    /// it does.
    pub fn follows_response(&mut self) -> Option<usize> {
        let worker = self.last_vm;
        let vm = self.vms.get_mut(worker)?;
        vm.agent.follow_response().map(|_| worker)
    }

    /// The response to a request of `bucket` that `worker` followed.
    pub fn observe_response(&mut self, worker: usize, bucket: &str, status: u32, latency_us: u64) {
        if let Some(vm) = self.vms.get_mut(worker) {
            vm.agent.observe_response(bucket, status, Some(latency_us));
        }
    }
}

/// An admitted costed request whose response is streaming: the worker
/// that decided it, in which process, and its pending charge.
#[derive(Debug, Clone)]
pub struct OpenStream {
    worker: usize,
    /// [`AgentProxy`]'s starts when it was decided.
    start: u64,
    pending: PendingCharge,
}

/// A worker for a new connection, uniformly.
fn pick_worker(rng: &mut SmallRng, workers: usize) -> usize {
    usize::try_from(rng.next_u64() % workers.max(1) as u64).unwrap_or(0)
}

/// The agent's settings for a simulated proxy: its cluster, and every
/// other field as given.
pub fn settings(proxy_id: &str, configure: impl FnOnce(&mut AgentSettings)) -> AgentSettings {
    let mut settings = AgentSettings::new(CLUSTER, proxy_id);
    configure(&mut settings);
    settings
}
