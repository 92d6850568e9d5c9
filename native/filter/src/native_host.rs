//! [`Host`] for one agent of the native module: the process store, the
//! control streams and the metric registry of its configuration.

use std::sync::Arc;

use sluice_agent::host::{Host, HostError, LogLevel, MetricId, MetricKind, SharedValue};

use crate::control_stream::{ControlStreams, StreamEvent};
use crate::metrics::MetricRegistry;
use crate::process::ProcessStore;

/// What every agent of one configuration shares.
#[derive(Debug)]
pub struct Shared {
    /// Shared data and queues.
    pub store: ProcessStore,
    /// Streams to the control plane.
    pub streams: ControlStreams,
    /// Metrics, summed over agents.
    pub metrics: MetricRegistry,
}

/// The host of one agent.
#[derive(Debug)]
pub struct NativeHost {
    shared: Arc<Shared>,
    /// Streams this agent opened and has not closed.
    tokens: Vec<u32>,
}

impl NativeHost {
    /// A host over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            tokens: Vec::new(),
        }
    }

    /// Events of this agent's streams since the last call, stream by stream.
    pub fn take_stream_events(&mut self) -> Vec<(u32, StreamEvent)> {
        let mut events = Vec::new();
        for token in &self.tokens {
            events.extend(
                self.shared
                    .streams
                    .take_events(*token)
                    .into_iter()
                    .map(|event| (*token, event)),
            );
        }
        self.tokens.retain(|token| {
            !events
                .iter()
                .any(|(t, e)| t == token && matches!(e, StreamEvent::Closed(_)))
        });
        events
    }
}

impl Host for NativeHost {
    fn get_shared_data(&self, key: &str) -> Result<Option<SharedValue>, HostError> {
        Ok(self.shared.store.get(key))
    }

    fn set_shared_data(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), HostError> {
        self.shared.store.set(key, value, cas)
    }

    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError> {
        Ok(self.shared.store.register_queue(name))
    }

    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError> {
        self.shared.store.enqueue(queue_id, message)
    }

    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError> {
        self.shared.store.dequeue(queue_id)
    }

    fn open_control_stream(&mut self, _cluster: &str) -> Result<u32, HostError> {
        let token = self.shared.streams.open()?;
        self.tokens.push(token);
        Ok(token)
    }

    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError> {
        self.shared.streams.send(token, message)
    }

    fn close_stream(&mut self, token: u32) -> Result<(), HostError> {
        self.tokens.retain(|t| *t != token);
        self.shared.streams.close(token)
    }

    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError> {
        Ok(MetricId(self.shared.metrics.define(kind, name)))
    }

    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError> {
        self.shared.metrics.increment(id.0, delta)
    }

    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError> {
        self.shared.metrics.record(id.0, value)
    }

    fn log(&self, level: LogLevel, message: &str) {
        // Envoy's own log goes to stderr; debug lines stay out of it.
        match level {
            LogLevel::Debug => {}
            LogLevel::Info => eprintln!("[sluice_native][info] {message}"),
            LogLevel::Warn => eprintln!("[sluice_native][warn] {message}"),
        }
    }
}
