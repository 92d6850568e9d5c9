//! An in-memory [`Host`] for tests. Several `FakeHost`s share one
//! [`FakeProcess`] the way VMs of one `vm_id` share an Envoy process: shared
//! data (with Envoy's CAS semantics), queues and gRPC streams.

use crate::host_api::{Host, HostError, LogLevel, SharedValue};
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

    fn log(&self, level: LogLevel, message: &str) {
        self.process
            .borrow_mut()
            .logs
            .push((self.vm, level, message.to_owned()));
    }
}
