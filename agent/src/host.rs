//! What an agent's ticks need from the proxy, as four small traits (shared
//! data, the control-plane streams, metrics, a log) that [`Host`] joins:
//! any type with the four is a host. The proxy-wasm filter implements them
//! over host calls; the in-memory parts ([`crate::memory`]) are the native
//! module's, the simulator's and the tests', assembled with their own
//! streams and log in a [`HostParts`]. The request path uses none of them:
//! a request's host is [`crate::request::handler::HttpRequest`].
//!
//! Every call returns a `Result`; nothing here may panic inside Envoy.

use thiserror::Error;

/// A failed host call, one variant per proxy-wasm status the host may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum HostError {
    /// The key, queue, stream or property does not exist.
    #[error("not found")]
    NotFound,
    /// The host rejected an argument (for example an unknown cluster).
    #[error("bad argument")]
    BadArgument,
    /// A compare-and-swap write lost against a concurrent write.
    #[error("compare-and-swap mismatch")]
    CasMismatch,
    /// The host could not parse what it was given.
    #[error("parse failure")]
    ParseFailure,
    /// The host failed internally.
    #[error("internal failure")]
    InternalFailure,
    /// The host does not implement the call.
    #[error("not implemented by the host")]
    Unimplemented,
    /// Any other status code.
    #[error("host status {0}")]
    Other(u32),
}

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Detail for debugging; off in production.
    Debug,
    /// Notable state changes.
    Info,
    /// Something is wrong but the filter copes.
    Warn,
}

/// A value in shared data together with its compare-and-swap token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedValue {
    /// The stored bytes.
    pub bytes: Vec<u8>,
    /// Changes on every write. Only compare it for equality: the host draws
    /// it from a process-wide counter, not per key.
    pub cas: u32,
}

/// Kind of a host metric. Envoy sums counters of every VM of a process into
/// one, and a gauge holds whatever value some VM recorded last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only grows; the filter adds deltas.
    Counter,
    /// Set to a value.
    Gauge,
}

/// A metric defined in this VM. Ids are per VM: never share one between VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricId(pub u32);

/// The process's shared data and queues, as proxy-wasm has them: what the
/// agents of one proxy exchange.
pub trait SharedData {
    /// Reads a shared-data key; `Ok(None)` when absent.
    fn get_shared_data(&self, key: &str) -> Result<Option<SharedValue>, HostError>;
    /// Writes a shared-data key. With `cas`, fails with
    /// [`HostError::CasMismatch`] if the key changed since it was read.
    fn set_shared_data(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), HostError>;
    /// Returns the id of the named shared queue, creating it if needed.
    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError>;
    /// Appends a message to a shared queue.
    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError>;
    /// Takes the oldest message of a shared queue; `Ok(None)` when empty.
    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError>;
}

/// The leader's gRPC streams to the control plane.
pub trait ControlStreams {
    /// Opens the control-plane gRPC stream on `cluster`; returns its token.
    fn open_control_stream(&mut self, cluster: &str) -> Result<u32, HostError>;
    /// Sends one protobuf message on an open stream.
    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError>;
    /// Closes a stream this agent opened.
    fn close_stream(&mut self, token: u32) -> Result<(), HostError>;
}

/// The proxy's stats.
pub trait MetricSink {
    /// Defines (or looks up) a metric of this agent. Call it once per name
    /// and agent: Envoy hands out a fresh id on every call.
    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError>;
    /// Adds `delta` to a counter.
    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError>;
    /// Sets a gauge.
    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError>;
}

/// The proxy's log.
pub trait Log {
    /// Writes a log line.
    fn log(&self, level: LogLevel, message: &str);
}

/// The proxy services the ticks use: the four parts. Deliberately small:
/// the request path uses none of them.
pub trait Host: SharedData + ControlStreams + MetricSink + Log {}

impl<T: SharedData + ControlStreams + MetricSink + Log> Host for T {}

/// A host assembled from its parts: the shape every host that is not one
/// object (the native module's, the simulator's, the tests') takes.
#[derive(Debug)]
pub struct HostParts<D, S, M, L> {
    /// Shared data and queues.
    pub data: D,
    /// The control-plane streams.
    pub streams: S,
    /// The stats.
    pub metrics: M,
    /// The log.
    pub log: L,
}

impl<D: SharedData, S, M, L> SharedData for HostParts<D, S, M, L> {
    fn get_shared_data(&self, key: &str) -> Result<Option<SharedValue>, HostError> {
        self.data.get_shared_data(key)
    }

    fn set_shared_data(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), HostError> {
        self.data.set_shared_data(key, value, cas)
    }

    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError> {
        self.data.register_shared_queue(name)
    }

    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError> {
        self.data.enqueue_shared_queue(queue_id, message)
    }

    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError> {
        self.data.dequeue_shared_queue(queue_id)
    }
}

impl<D, S: ControlStreams, M, L> ControlStreams for HostParts<D, S, M, L> {
    fn open_control_stream(&mut self, cluster: &str) -> Result<u32, HostError> {
        self.streams.open_control_stream(cluster)
    }

    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError> {
        self.streams.send_stream_message(token, message)
    }

    fn close_stream(&mut self, token: u32) -> Result<(), HostError> {
        self.streams.close_stream(token)
    }
}

impl<D, S, M: MetricSink, L> MetricSink for HostParts<D, S, M, L> {
    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError> {
        self.metrics.define_metric(kind, name)
    }

    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError> {
        self.metrics.increment_metric(id, delta)
    }

    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError> {
        self.metrics.record_metric(id, value)
    }
}

impl<D, S, M, L: Log> Log for HostParts<D, S, M, L> {
    fn log(&self, level: LogLevel, message: &str) {
        self.log.log(level, message);
    }
}
