//! One agent per Envoy worker thread, as the wasm filter has one per VM: the
//! request path locks only its own worker's agent (the ticker takes the same
//! lock briefly every tick), and the agents meet in the process store.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_filter::agent::{Agent, AgentSettings};

use crate::native_host::{NativeHost, Shared};

/// An agent and its host.
#[derive(Debug)]
pub struct WorkerState {
    /// The wasm filter's per-VM logic.
    pub agent: Agent,
    /// Its view of the process.
    pub host: NativeHost,
}

/// One worker's agent.
#[derive(Debug)]
pub struct WorkerSlot {
    state: Mutex<WorkerState>,
    /// Set when its configuration is gone: the worker forgets the slot.
    retired: AtomicBool,
}

impl WorkerSlot {
    /// Locks the agent.
    pub fn lock(&self) -> MutexGuard<'_, WorkerState> {
        // Nothing panics while the lock is held (the agent does not panic);
        // a poisoned lock still holds a consistent agent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
        let main = workers.new_slot();
        workers.lock_slots().push(main);
        workers
    }

    fn new_slot(&self) -> Arc<WorkerSlot> {
        let mut host = NativeHost::new(Arc::clone(&self.shared));
        let mut agent = Agent::new(self.settings.clone(), seed());
        // A first tick sets the agent's clock before it decides a request.
        agent.on_tick(&mut host, now_ms());
        Arc::new(WorkerSlot {
            state: Mutex::new(WorkerState { agent, host }),
            retired: AtomicBool::new(false),
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
        let slot = self.new_slot();
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
