//! What the per-VM logic needs from the proxy, as a trait: the proxy-wasm
//! binding implements it inside Envoy, and an in-memory fake implements it in
//! tests (several fakes can share one "process" to simulate several VMs).
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

/// The proxy services the tick logic uses. Deliberately small: the request
/// path uses none of them.
pub trait Host {
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
    /// Returns the id of this VM's named shared queue, creating it if needed.
    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError>;
    /// Appends a message to a shared queue.
    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError>;
    /// Takes the oldest message of a shared queue; `Ok(None)` when empty.
    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError>;
    /// Opens the control-plane gRPC stream on `cluster`; returns its token.
    fn open_control_stream(&mut self, cluster: &str) -> Result<u32, HostError>;
    /// Sends one protobuf message on an open stream.
    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError>;
    /// Closes a stream this VM opened.
    fn close_stream(&mut self, token: u32) -> Result<(), HostError>;
    /// Defines (or looks up) a metric of this VM. Call it once per name and
    /// VM: Envoy hands out a fresh id on every call.
    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError>;
    /// Adds `delta` to a counter.
    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError>;
    /// Sets a gauge.
    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError>;
    /// Writes a log line.
    fn log(&self, level: LogLevel, message: &str);
}
