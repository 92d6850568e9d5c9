//! An in-memory host for tests and the simulator: several [`FakeHost`]s
//! share one [`FakeProcess`] the way VMs of one `vm_id` share an Envoy
//! process. Shared data, queues and metrics are the in-memory parts every
//! in-memory host uses ([`crate::memory`]); the streams and the log are
//! recorded, for tests to read and the simulator to carry.

use crate::host::{
    ControlStreams, HostError, HostParts, Log, LogLevel, MetricId, MetricKind, MetricSink,
};
use crate::memory::{MetricRegistry, ProcessStore};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

/// A gRPC stream some VM opened.
#[derive(Debug, Default)]
pub struct FakeStream {
    /// Index of the VM that opened it.
    pub vm: usize,
    /// Messages the VM sent, in order.
    pub sent: Vec<Vec<u8>>,
    /// False once either side closed it.
    pub open: bool,
}

/// What the VMs of one process share.
#[derive(Debug)]
pub struct FakeProcess {
    /// Shared data and queues.
    pub store: Arc<ProcessStore>,
    /// Metrics, summed over the VMs.
    pub registry: Arc<MetricRegistry>,
    /// Every stream opened, by token.
    pub streams: BTreeMap<u32, FakeStream>,
    next_token: u32,
    /// Clusters that exist; opening a stream to another is `BadArgument`.
    pub clusters: Vec<String>,
    /// Every line logged, with the VM that logged it.
    pub logs: Vec<(usize, LogLevel, String)>,
    /// Metric host calls made, by VM.
    pub metric_calls: BTreeMap<usize, usize>,
    /// When set, every metric call fails with this error.
    pub metric_error: Option<HostError>,
    /// Metric definitions made, across VMs (Envoy hands out a fresh id on
    /// every one).
    definitions: usize,
}

/// One VM's view of its process.
pub type FakeHost = HostParts<Arc<ProcessStore>, FakeStreams, FakeMetrics, FakeLog>;

impl FakeProcess {
    /// A process whose one cluster is `cluster`.
    pub fn new(cluster: &str) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self {
            store: Arc::default(),
            registry: Arc::default(),
            streams: BTreeMap::new(),
            next_token: 1,
            clusters: vec![cluster.to_owned()],
            logs: Vec::new(),
            metric_calls: BTreeMap::new(),
            metric_error: None,
            definitions: 0,
        }))
    }

    /// The host of VM `vm` of `process`.
    pub fn host(process: &Rc<RefCell<Self>>, vm: usize) -> FakeHost {
        let view = || FakeView {
            vm,
            process: Rc::clone(process),
        };
        HostParts {
            data: Arc::clone(&process.borrow().store),
            streams: FakeStreams(view()),
            metrics: FakeMetrics(view()),
            log: FakeLog(view()),
        }
    }

    /// Messages waiting in the named queue.
    pub fn queue_len(&self, name: &str) -> usize {
        self.store.queue_len(name)
    }

    /// A shared-data value.
    pub fn get(&self, key: &str) -> Option<crate::host::SharedValue> {
        self.store.get(key)
    }

    /// Writes a shared-data value, as some VM would.
    pub fn set(&mut self, key: &str, bytes: &[u8]) {
        // A write without CAS always succeeds.
        let _ = self.store.set(key, bytes, None);
    }

    /// Open streams, by token, with the VM that opened each.
    pub fn open_streams(&self) -> Vec<(u32, usize)> {
        self.streams
            .iter()
            .filter(|(_, s)| s.open)
            .map(|(t, s)| (*t, s.vm))
            .collect()
    }

    /// A metric's value, if defined.
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.registry.value(name)
    }

    /// Metric definitions made so far, across VMs.
    pub fn metric_definitions(&self) -> usize {
        self.definitions
    }

    /// Messages ever enqueued, all queues together.
    pub fn enqueued(&self) -> usize {
        self.store.enqueued()
    }

    /// Counts a metric call by `vm` and fails it if told to.
    fn metric_call(&mut self, vm: usize) -> Result<(), HostError> {
        *self.metric_calls.entry(vm).or_default() += 1;
        self.metric_error.map_or(Ok(()), Err)
    }
}

/// One VM's handle on its process, which each recorded part holds.
#[derive(Debug)]
pub struct FakeView {
    /// Index of the VM.
    pub vm: usize,
    /// Its process.
    pub process: Rc<RefCell<FakeProcess>>,
}

/// The streams of one VM, recorded in its process.
#[derive(Debug)]
pub struct FakeStreams(pub FakeView);

impl ControlStreams for FakeStreams {
    fn open_control_stream(&mut self, cluster: &str) -> Result<u32, HostError> {
        let mut process = self.0.process.borrow_mut();
        if !process.clusters.iter().any(|c| c == cluster) {
            return Err(HostError::BadArgument);
        }
        let token = process.next_token;
        process.next_token += 1;
        process.streams.insert(
            token,
            FakeStream {
                vm: self.0.vm,
                sent: Vec::new(),
                open: true,
            },
        );
        Ok(token)
    }

    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError> {
        let mut process = self.0.process.borrow_mut();
        match process.streams.get_mut(&token) {
            Some(stream) if stream.open => {
                stream.sent.push(message.to_vec());
                Ok(())
            }
            _ => Err(HostError::NotFound),
        }
    }

    fn close_stream(&mut self, token: u32) -> Result<(), HostError> {
        let mut process = self.0.process.borrow_mut();
        match process.streams.get_mut(&token) {
            Some(stream) if stream.open => {
                stream.open = false;
                Ok(())
            }
            _ => Err(HostError::NotFound),
        }
    }
}

/// The metrics of one VM: the process's registry, each call counted and
/// failed when the test says so.
#[derive(Debug)]
pub struct FakeMetrics(pub FakeView);

impl MetricSink for FakeMetrics {
    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError> {
        let mut process = self.0.process.borrow_mut();
        process.metric_call(self.0.vm)?;
        process.definitions += 1;
        process.registry.define_metric(kind, name)
    }

    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError> {
        let mut process = self.0.process.borrow_mut();
        process.metric_call(self.0.vm)?;
        process.registry.increment_metric(id, delta)
    }

    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError> {
        let mut process = self.0.process.borrow_mut();
        process.metric_call(self.0.vm)?;
        process.registry.record_metric(id, value)
    }
}

/// The log of one VM, kept in its process.
#[derive(Debug)]
pub struct FakeLog(pub FakeView);

impl Log for FakeLog {
    fn log(&self, level: LogLevel, message: &str) {
        self.0
            .process
            .borrow_mut()
            .logs
            .push((self.0.vm, level, message.to_owned()));
    }
}
