//! The host of one agent of the native module: the process's in-memory
//! shared data and metrics (the agent library's, shared by every agent of
//! one configuration), the control streams it opened, and Envoy's stderr.

use std::sync::Arc;

use sluice_agent::host::{ControlStreams, HostError, HostParts, Log, LogLevel};
use sluice_agent::memory::{MetricRegistry, ProcessStore};

use crate::control_stream::{StreamEvent, Streams};

/// What every agent of one configuration shares.
#[derive(Debug)]
pub struct Shared {
    /// Shared data and queues.
    pub store: Arc<ProcessStore>,
    /// Streams to the control plane.
    pub streams: Streams,
    /// Metrics, summed over agents.
    pub metrics: Arc<MetricRegistry>,
}

/// The host of one agent.
pub type NativeHost = HostParts<Arc<ProcessStore>, AgentStreams, Arc<MetricRegistry>, Stderr>;

/// The host of an agent over `shared`.
pub fn native_host(shared: &Arc<Shared>) -> NativeHost {
    HostParts {
        data: Arc::clone(&shared.store),
        streams: AgentStreams {
            shared: Arc::clone(shared),
            tokens: Vec::new(),
        },
        metrics: Arc::clone(&shared.metrics),
        log: Stderr,
    }
}

/// The control-plane streams one agent opened.
#[derive(Debug)]
pub struct AgentStreams {
    shared: Arc<Shared>,
    /// Streams this agent opened and has not closed.
    tokens: Vec<u32>,
}

impl AgentStreams {
    /// Events of this agent's streams since the last call, stream by stream.
    pub fn take_events(&mut self) -> Vec<(u32, StreamEvent)> {
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

impl ControlStreams for AgentStreams {
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
}

/// Envoy's own log goes to stderr; debug lines stay out of it.
#[derive(Debug, Clone, Copy)]
pub struct Stderr;

impl Log for Stderr {
    fn log(&self, level: LogLevel, message: &str) {
        match level {
            LogLevel::Debug => {}
            LogLevel::Info => eprintln!("[sluice_native][info] {message}"),
            LogLevel::Warn => eprintln!("[sluice_native][warn] {message}"),
        }
    }
}
