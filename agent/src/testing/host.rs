//! An in-memory [`Host`] for tests. Several `FakeHost`s share one
//! [`FakeProcess`] the way VMs of one `vm_id` share an Envoy process: shared
//! data (with Envoy's CAS semantics), queues and gRPC streams.

use crate::host::{Host, HostError, LogLevel, MetricId, MetricKind, SharedValue};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

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
    data: HashMap<String, SharedValue>,
    next_cas: u32,
    queues: HashMap<String, u32>,
    queue_contents: HashMap<u32, VecDeque<Vec<u8>>>,
    pub streams: BTreeMap<u32, FakeStream>,
    next_token: u32,
    /// Clusters that exist; opening a stream to another is `BadArgument`.
    pub clusters: Vec<String>,
    pub logs: Vec<(usize, LogLevel, String)>,
    /// Metric values by name: counters summed over VMs, gauges last write.
    pub metrics: BTreeMap<String, (MetricKind, u64)>,
    /// Name of every id handed out. Like Envoy, every define call returns a
    /// fresh id, even for a known name.
    metric_ids: Vec<String>,
    /// Metric host calls made, by VM.
    pub metric_calls: BTreeMap<usize, usize>,
    /// When set, every metric call fails with this error.
    pub metric_error: Option<HostError>,
    /// Messages ever enqueued, by queue id.
    pub enqueued: BTreeMap<u32, usize>,
}

impl FakeProcess {
    pub fn new(cluster: &str) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self {
            data: HashMap::new(),
            next_cas: 1,
            queues: HashMap::new(),
            queue_contents: HashMap::new(),
            streams: BTreeMap::new(),
            next_token: 1,
            clusters: vec![cluster.to_owned()],
            logs: Vec::new(),
            metrics: BTreeMap::new(),
            metric_ids: Vec::new(),
            metric_calls: BTreeMap::new(),
            metric_error: None,
            enqueued: BTreeMap::new(),
        }))
    }

    pub fn queue_len(&self, name: &str) -> usize {
        self.queues
            .get(name)
            .and_then(|id| self.queue_contents.get(id))
            .map_or(0, VecDeque::len)
    }

    pub fn get(&self, key: &str) -> Option<SharedValue> {
        self.data.get(key).cloned()
    }

    pub fn set(&mut self, key: &str, bytes: &[u8]) {
        let cas = self.bump_cas();
        self.data.insert(
            key.to_owned(),
            SharedValue {
                bytes: bytes.to_vec(),
                cas,
            },
        );
    }

    /// Open streams, by token.
    pub fn open_streams(&self) -> Vec<(u32, usize)> {
        self.streams
            .iter()
            .filter(|(_, s)| s.open)
            .map(|(t, s)| (*t, s.vm))
            .collect()
    }

    /// A metric's value, if defined.
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.metrics.get(name).map(|(_, value)| *value)
    }

    /// Ids defined so far, across VMs.
    pub fn metric_definitions(&self) -> usize {
        self.metric_ids.len()
    }

    /// Counts a metric call by `vm` and fails it if told to.
    fn metric_call(&mut self, vm: usize) -> Result<(), HostError> {
        *self.metric_calls.entry(vm).or_default() += 1;
        self.metric_error.map_or(Ok(()), Err)
    }

    fn metric_mut(&mut self, id: MetricId, kind: MetricKind) -> Result<&mut u64, HostError> {
        let name = usize::try_from(id.0)
            .ok()
            .and_then(|index| self.metric_ids.get(index))
            .ok_or(HostError::NotFound)?;
        match self.metrics.get_mut(name) {
            Some((k, value)) if *k == kind => Ok(value),
            _ => Err(HostError::BadArgument),
        }
    }

    fn bump_cas(&mut self) -> u32 {
        // Like Envoy: one process-wide counter, odd values.
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(2);
        cas
    }
}

/// One VM's view of the process.
#[derive(Debug)]
pub struct FakeHost {
    pub vm: usize,
    pub process: Rc<RefCell<FakeProcess>>,
}

impl Host for FakeHost {
    fn get_shared_data(&self, key: &str) -> Result<Option<SharedValue>, HostError> {
        Ok(self.process.borrow().get(key))
    }

    fn set_shared_data(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), HostError> {
        let mut process = self.process.borrow_mut();
        // Envoy checks the CAS only when the key exists.
        if let (Some(existing), Some(cas)) = (process.data.get(key), cas)
            && existing.cas != cas
        {
            return Err(HostError::CasMismatch);
        }
        process.set(key, value);
        Ok(())
    }

    fn register_shared_queue(&mut self, name: &str) -> Result<u32, HostError> {
        let mut process = self.process.borrow_mut();
        let next_id =
            u32::try_from(process.queues.len()).map_err(|_| HostError::InternalFailure)? + 1;
        let id = *process.queues.entry(name.to_owned()).or_insert(next_id);
        process.queue_contents.entry(id).or_default();
        Ok(id)
    }

    fn enqueue_shared_queue(&mut self, queue_id: u32, message: &[u8]) -> Result<(), HostError> {
        let mut process = self.process.borrow_mut();
        let queue = process
            .queue_contents
            .get_mut(&queue_id)
            .ok_or(HostError::NotFound)?;
        queue.push_back(message.to_vec());
        *process.enqueued.entry(queue_id).or_default() += 1;
        Ok(())
    }

    fn dequeue_shared_queue(&mut self, queue_id: u32) -> Result<Option<Vec<u8>>, HostError> {
        let mut process = self.process.borrow_mut();
        let queue = process
            .queue_contents
            .get_mut(&queue_id)
            .ok_or(HostError::NotFound)?;
        Ok(queue.pop_front())
    }

    fn open_control_stream(&mut self, cluster: &str) -> Result<u32, HostError> {
        let mut process = self.process.borrow_mut();
        if !process.clusters.iter().any(|c| c == cluster) {
            return Err(HostError::BadArgument);
        }
        let token = process.next_token;
        process.next_token += 1;
        process.streams.insert(
            token,
            FakeStream {
                vm: self.vm,
                sent: Vec::new(),
                open: true,
            },
        );
        Ok(token)
    }

    fn send_stream_message(&mut self, token: u32, message: &[u8]) -> Result<(), HostError> {
        let mut process = self.process.borrow_mut();
        match process.streams.get_mut(&token) {
            Some(stream) if stream.open => {
                stream.sent.push(message.to_vec());
                Ok(())
            }
            _ => Err(HostError::NotFound),
        }
    }

    fn close_stream(&mut self, token: u32) -> Result<(), HostError> {
        let mut process = self.process.borrow_mut();
        match process.streams.get_mut(&token) {
            Some(stream) if stream.open => {
                stream.open = false;
                Ok(())
            }
            _ => Err(HostError::NotFound),
        }
    }

    fn define_metric(&mut self, kind: MetricKind, name: &str) -> Result<MetricId, HostError> {
        let mut process = self.process.borrow_mut();
        process.metric_call(self.vm)?;
        let entry = process.metrics.entry(name.to_owned()).or_insert((kind, 0));
        if entry.0 != kind {
            return Err(HostError::BadArgument);
        }
        let id = u32::try_from(process.metric_ids.len()).map_err(|_| HostError::InternalFailure)?;
        process.metric_ids.push(name.to_owned());
        Ok(MetricId(id))
    }

    fn increment_metric(&mut self, id: MetricId, delta: u64) -> Result<(), HostError> {
        let mut process = self.process.borrow_mut();
        process.metric_call(self.vm)?;
        let value = process.metric_mut(id, MetricKind::Counter)?;
        *value = value.saturating_add(delta);
        Ok(())
    }

    fn record_metric(&mut self, id: MetricId, value: u64) -> Result<(), HostError> {
        let mut process = self.process.borrow_mut();
        process.metric_call(self.vm)?;
        *process.metric_mut(id, MetricKind::Gauge)? = value;
        Ok(())
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.process
            .borrow_mut()
            .logs
            .push((self.vm, level, message.to_owned()));
    }
}
