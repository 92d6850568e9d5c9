//! One agent per Envoy worker thread, as the wasm filter has one per VM: the
//! request path locks only its own worker's agent, and the agents meet in
//! the process store.
//!
//! A worker's agent is ticked on the worker's own thread, by the first
//! request after the ticker marks the tick due, as Envoy runs a wasm VM's
//! timer on its worker. The ticker thread ticks only the agents no request
//! reached for a whole period (and the main agent, which serves none): a
//! request never waits for another thread that holds its agent's lock and
//! may be descheduled on a busy machine.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sluice_agent::agent::Agent;
use sluice_agent::settings::AgentSettings;

use crate::clock::now_ms;
use crate::control_stream::StreamEvent;
use crate::native_host::{NativeHost, Shared, native_host};

/// An agent and its host.
#[derive(Debug)]
pub struct WorkerState {
    /// The wasm filter's per-VM logic.
    pub agent: Agent,
    /// Its view of the process.
    pub host: NativeHost,
}

impl WorkerState {
    /// Hands the agent what its control-plane streams received, then ticks
    /// it, at `now` (Unix ms).
    pub fn tick(&mut self, now: u64) {
        let Self { agent, host } = self;
        for (token, event) in host.streams.take_events() {
            match event {
                StreamEvent::Message(bytes, received_ms) => {
                    agent.on_stream_message(host, token, &bytes, received_ms.min(now));
                }
                StreamEvent::Closed(status) => agent.on_stream_close(host, token, status, now),
            }
        }
        agent.on_tick(host, now);
    }
}

/// One worker's agent.
#[derive(Debug)]
pub struct WorkerSlot {
    state: Mutex<WorkerState>,
    /// Set when its configuration is gone: the worker forgets the slot.
    retired: AtomicBool,
    /// Set by the ticker every period, cleared by whoever ticks the agent.
    tick_due: AtomicBool,
    /// Whether requests reach this agent (the main agent's never do).
    serves_requests: bool,
}

impl WorkerSlot {
    /// Locks the agent.
    pub fn lock(&self) -> MutexGuard<'_, WorkerState> {
        // Nothing panics while the lock is held (the agent does not panic);
        // a poisoned lock still holds a consistent agent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the agent's tick is due, clearing the mark: the caller, which
    /// holds the lock, ticks it. One relaxed load when it is not.
    pub fn take_tick_due(&self) -> bool {
        self.tick_due.load(Ordering::Relaxed) && self.tick_due.swap(false, Ordering::Relaxed)
    }

    /// Marks the tick due, for the ticker; ticks the agent on the ticker's
    /// thread when the last mark is still there (no request came for a
    /// whole period) or no request ever comes, unless a request holds the
    /// agent right now (it takes the mark).
    pub fn mark_tick_due(&self) {
        let unclaimed = self.tick_due.swap(true, Ordering::Relaxed);
        if (unclaimed || !self.serves_requests)
            && let Ok(mut state) = self.state.try_lock()
            && self.take_tick_due()
        {
            state.tick(now_ms());
        }
    }
}

/// Every worker agent of one configuration.
#[derive(Debug)]
pub struct Workers {
    /// Tells this configuration's slots apart in each thread's list.
    id: u64,
    settings: AgentSettings,
    shared: Arc<Shared>,
    slots: Mutex<Vec<Arc<WorkerSlot>>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The slots this thread serves, by configuration.
    static LOCAL: RefCell<Vec<(u64, Arc<WorkerSlot>)>> = const { RefCell::new(Vec::new()) };
}

fn seed() -> u64 {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one((DRAWS.fetch_add(1, Ordering::Relaxed), now_ms()))
}

impl Workers {
    /// One agent that serves no requests, as the wasm filter's main-thread
    /// VM: it connects to the control plane before the first request and
    /// usually holds the leader lease, so no worker's requests wait on the
    /// stream. Each worker creates its own agent on its first request.
    pub fn new(settings: AgentSettings, shared: Arc<Shared>) -> Self {
        let workers = Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            settings,
            shared,
            slots: Mutex::default(),
        };
        let main = workers.new_slot(false);
        workers.lock_slots().push(main);
        workers
    }

    fn new_slot(&self, serves_requests: bool) -> Arc<WorkerSlot> {
        let mut host = native_host(&self.shared);
        let mut agent = Agent::new(self.settings.clone(), seed());
        // A first tick sets the agent's clock before it decides a request.
        agent.on_tick(&mut host, now_ms());
        Arc::new(WorkerSlot {
            state: Mutex::new(WorkerState { agent, host }),
            retired: AtomicBool::new(false),
            tick_due: AtomicBool::new(false),
            serves_requests,
        })
    }

    fn lock_slots(&self) -> MutexGuard<'_, Vec<Arc<WorkerSlot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The calling thread's agent, created on first use.
    pub fn local(&self) -> Arc<WorkerSlot> {
        let found = LOCAL.with_borrow(|local| {
            local
                .iter()
                .find(|(id, _)| *id == self.id)
                .map(|(_, slot)| Arc::clone(slot))
        });
        if let Some(slot) = found {
            return slot;
        }
        let slot = self.new_slot(true);
        self.lock_slots().push(Arc::clone(&slot));
        LOCAL.with_borrow_mut(|local| {
            local.retain(|(_, slot)| !slot.retired.load(Ordering::Relaxed));
            local.push((self.id, Arc::clone(&slot)));
        });
        slot
    }

    /// Every agent created so far.
    pub fn all(&self) -> Vec<Arc<WorkerSlot>> {
        self.lock_slots().clone()
    }

    /// The configuration is gone: agents shut down and are forgotten.
    pub fn retire(&self) {
        for slot in self.lock_slots().drain(..) {
            slot.retired.store(true, Ordering::Relaxed);
            let mut state = slot.lock();
            let WorkerState { agent, host } = &mut *state;
            agent.shut_down(host);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::control_stream::Streams;

    fn workers() -> Workers {
        // Nothing listens on port 1: the agents' streams fail, which these
        // tests do not look at.
        let shared = Arc::new(Shared {
            store: Arc::default(),
            streams: Streams::new(&["http://127.0.0.1:1".to_owned()], None).unwrap(),
            metrics: Arc::default(),
        });
        Workers::new(AgentSettings::new("cp", "p"), shared)
    }

    #[test]
    fn a_worker_with_requests_ticks_itself() {
        let workers = workers();
        let worker = workers.local();
        worker.mark_tick_due();
        // The ticker left the tick to the worker's next request.
        assert!(worker.take_tick_due());
        assert!(!worker.take_tick_due());
    }

    #[test]
    fn the_ticker_ticks_a_worker_no_request_reached_for_a_period() {
        let workers = workers();
        let worker = workers.local();
        worker.mark_tick_due();
        worker.mark_tick_due();
        // Still marked a period later: the ticker ran the tick.
        assert!(!worker.take_tick_due());
    }

    #[test]
    fn a_request_holding_the_agent_keeps_the_tick() {
        let workers = workers();
        let worker = workers.local();
        let held = worker.lock();
        worker.mark_tick_due();
        worker.mark_tick_due();
        drop(held);
        assert!(worker.take_tick_due());
    }

    #[test]
    fn the_main_agent_is_ticked_every_period() {
        let workers = workers();
        let main = Arc::clone(&workers.all()[0]);
        assert!(!main.serves_requests);
        main.mark_tick_due();
        assert!(!main.take_tick_due());
    }
}
