//! The agent's host over proxy-wasm host calls (shared data and queues,
//! the gRPC stream, metrics, the log), plus the clock and entropy the root
//! context needs.

use crate::status::host_error;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{LogLevel as ProxyLogLevel, MetricType};
use sluice_agent::host::{
    ControlStreams, HostError, Log, LogLevel, MetricId, MetricKind, MetricSink, SharedData,
    SharedValue,
};
use sluice_proto::{SERVICE_NAME, STREAM_METHOD};
use std::time::UNIX_EPOCH;

/// The host of the VM this module runs in. Stateless: the host keeps the
/// state and knows which context is current.
#[derive(Debug, Default)]
pub(super) struct EnvoyHost;

impl SharedData for EnvoyHost {
    fn get_shared_data(&self, key: &str) -> Result<Option<SharedValue>, HostError> {
        match hostcalls::get_shared_data(key).map_err(host_error)? {
            (Some(bytes), Some(cas)) => Ok(Some(SharedValue { bytes, cas })),
            // Absent; or present without a CAS, which Envoy never returns
            // and which could not be written back safely anyway.
            _ => Ok(None),
        }
    }

    fn set_shared_data(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), HostError> {
        hostcalls::set_shared_data(key, Some(value), cas).map_err(host_error)
    }

    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError> {
        hostcalls::register_shared_queue(name).map_err(host_error)
    }

    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError> {
        hostcalls::enqueue_shared_queue(queue_id, Some(message)).map_err(host_error)
    }

    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError> {
        hostcalls::dequeue_shared_queue(queue_id).map_err(host_error)
    }
}

impl ControlStreams for EnvoyHost {
    fn open_control_stream(&mut self, cluster: &str) -> Result<u32, HostError> {
        hostcalls::open_grpc_stream(cluster, SERVICE_NAME, STREAM_METHOD, Vec::new())
            .map_err(host_error)
    }

    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError> {
        hostcalls::send_grpc_stream_message(token, Some(message), false).map_err(host_error)
    }

    fn close_stream(&mut self, token: u32) -> Result<(), HostError> {
        hostcalls::close_grpc_stream(token).map_err(host_error)
    }
}

impl MetricSink for EnvoyHost {
    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError> {
        let metric_type = match kind {
            MetricKind::Counter => MetricType::Counter,
            MetricKind::Gauge => MetricType::Gauge,
        };
        hostcalls::define_metric(metric_type, name)
            .map(MetricId)
            .map_err(host_error)
    }

    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError> {
        // The ABI takes a signed offset; a delta beyond i64::MAX (never
        // reached by a per-tick count) is refused rather than wrapped.
        let offset = i64::try_from(delta).map_err(|_| HostError::BadArgument)?;
        hostcalls::increment_metric(id.0, offset).map_err(host_error)
    }

    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError> {
        hostcalls::record_metric(id.0, value).map_err(host_error)
    }
}

impl Log for EnvoyHost {
    fn log(&self, level: LogLevel, message: &str) {
        log(
            match level {
                LogLevel::Debug => ProxyLogLevel::Debug,
                LogLevel::Info => ProxyLogLevel::Info,
                LogLevel::Warn => ProxyLogLevel::Warn,
            },
            message,
        );
    }
}

/// Logs through Envoy; a failing log call has nowhere to be reported.
pub(super) fn log(level: ProxyLogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

/// Unix milliseconds from the host clock; `None` if the host cannot tell.
pub(super) fn now_ms() -> Option<u64> {
    let now = hostcalls::get_current_time().ok()?;
    let since_epoch = now.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since_epoch.as_millis()).ok()
}

/// A PRNG seed from WASI `random_get`, falling back to the clock mixed with
/// the context id if the host has no entropy to give.
pub(super) fn seed(context_id: u32) -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    log(
        ProxyLogLevel::Warn,
        "random_get failed; seeding from the clock",
    );
    let clock = hostcalls::get_current_time()
        .ok()
        .and_then(|now| now.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    clock ^ u64::from(context_id).rotate_left(32)
}
