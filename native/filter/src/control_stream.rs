//! The leader's stream to the control plane: Sluice's own gRPC stream, over
//! a tonic client on the module's runtime thread (a dynamic module cannot
//! use Envoy's gRPC client). Messages cross as the same protobuf bytes the
//! wasm filter sends and receives through Envoy, so the agent cannot tell
//! the difference; what arrives waits in a per-stream inbox until the
//! ticker hands it to the agent that opened the stream.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prost::Message;
use sluice_agent::host::HostError;
use sluice_proto::v1::directive_service_client::DirectiveServiceClient;
use sluice_proto::v1::{ControlMessage, ProxyMessage};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::clock::now_ms;
use crate::config::ControlPlaneTls;

/// Messages the agent may queue before the stream is up.
const OUTBOUND_CAPACITY: usize = 64;
/// Messages kept for the agent between two ticks; older ones are dropped.
const INBOX_CAPACITY: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// gRPC status `UNAVAILABLE`: what the agent sees when the dial fails.
const UNAVAILABLE: u32 = 14;

/// What happened on a stream since the agent last looked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// One `ControlMessage`, encoded, and when it arrived (Unix ms): the
    /// agent stamps the directives' age from it, as a wasm VM does from
    /// the moment Envoy hands it the message.
    Message(Vec<u8>, u64),
    /// The stream ended with this gRPC status (0: the server closed it).
    Closed(u32),
}

#[derive(Debug, Default)]
struct Inboxes {
    events: HashMap<u32, VecDeque<StreamEvent>>,
    senders: HashMap<u32, mpsc::Sender<ProxyMessage>>,
}

/// Every open stream of one configuration, and the runtime they run on.
#[derive(Debug)]
pub struct Streams {
    runtime: Option<tokio::runtime::Runtime>,
    /// One per control-plane replica; each new stream takes the next.
    endpoints: Vec<Endpoint>,
    next_token: AtomicU32,
    inboxes: Arc<Mutex<Inboxes>>,
}

fn lock(inboxes: &Mutex<Inboxes>) -> MutexGuard<'_, Inboxes> {
    // Nothing panics while the lock is held.
    inboxes.lock().unwrap_or_else(PoisonError::into_inner)
}

fn push(inboxes: &Mutex<Inboxes>, token: u32, event: StreamEvent) {
    let mut inboxes = lock(inboxes);
    // A stream the agent closed has no inbox any more: drop what arrives.
    if let Some(inbox) = inboxes.events.get_mut(&token) {
        if inbox.len() >= INBOX_CAPACITY {
            inbox.pop_front();
        }
        inbox.push_back(event);
    }
}

impl Streams {
    /// Streams to `uris` (with `tls`, if given), on a runtime of their own
    /// (one thread). With several (replicas), each new stream dials the
    /// next one, so a stream that failed on a dead replica reconnects to
    /// another.
    pub fn new(uris: &[String], tls: Option<&ControlPlaneTls>) -> std::io::Result<Self> {
        let invalid = |error: tonic::transport::Error| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, error)
        };
        let mut endpoints = Vec::with_capacity(uris.len());
        for uri in uris {
            let mut endpoint = Endpoint::from_shared(uri.clone())
                .map_err(invalid)?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true);
            if let Some(tls) = tls {
                let mut config =
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
                if let Some((cert, key)) = &tls.identity {
                    config = config.identity(Identity::from_pem(cert, key));
                }
                if let Some(name) = &tls.server_name {
                    config = config.domain_name(name.clone());
                }
                endpoint = endpoint.tls_config(config).map_err(invalid)?;
            }
            endpoints.push(endpoint);
        }
        if endpoints.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no control-plane address",
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-native-grpc")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
            endpoints,
            next_token: AtomicU32::new(1),
            inboxes: Arc::default(),
        })
    }

    /// Opens a stream; its events arrive in [`Self::take_events`].
    pub fn open(&self) -> Result<u32, HostError> {
        let runtime = self.runtime.as_ref().ok_or(HostError::InternalFailure)?;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel(OUTBOUND_CAPACITY);
        {
            let mut inboxes = lock(&self.inboxes);
            inboxes.events.insert(token, VecDeque::new());
            inboxes.senders.insert(token, sender);
        }
        let inboxes = Arc::clone(&self.inboxes);
        // Tokens count up from 1: consecutive streams (a reconnect after a
        // failure) take consecutive replicas.
        let at = usize::try_from(token).unwrap_or(0) % self.endpoints.len().max(1);
        let Some(endpoint) = self.endpoints.get(at).cloned() else {
            return Err(HostError::InternalFailure);
        };
        runtime.spawn(async move {
            let status = run_stream(endpoint, receiver, &inboxes, token).await;
            push(&inboxes, token, StreamEvent::Closed(status));
        });
        Ok(token)
    }

    /// Sends one encoded `ProxyMessage`.
    pub fn send(&self, token: u32, message: &[u8]) -> Result<(), HostError> {
        let message = ProxyMessage::decode(message).map_err(|_| HostError::BadArgument)?;
        let inboxes = lock(&self.inboxes);
        let sender = inboxes.senders.get(&token).ok_or(HostError::NotFound)?;
        sender
            .try_send(message)
            .map_err(|_| HostError::InternalFailure)
    }

    /// Closes a stream: nothing more is sent or delivered.
    pub fn close(&self, token: u32) -> Result<(), HostError> {
        let mut inboxes = lock(&self.inboxes);
        inboxes.events.remove(&token);
        // Dropping the sender ends the outbound half; the task ends with it.
        inboxes
            .senders
            .remove(&token)
            .map(drop)
            .ok_or(HostError::NotFound)
    }

    /// What arrived on `token` since the last call.
    pub fn take_events(&self, token: u32) -> Vec<StreamEvent> {
        let mut inboxes = lock(&self.inboxes);
        let events: Vec<StreamEvent> = inboxes
            .events
            .get_mut(&token)
            .map(|inbox| inbox.drain(..).collect())
            .unwrap_or_default();
        if events
            .iter()
            .any(|event| matches!(event, StreamEvent::Closed(_)))
        {
            inboxes.events.remove(&token);
            inboxes.senders.remove(&token);
        }
        events
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        // Envoy's main thread drops the configuration: do not wait for the
        // streams, just stop them.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn run_stream(
    endpoint: Endpoint,
    outbound: mpsc::Receiver<ProxyMessage>,
    inboxes: &Mutex<Inboxes>,
    token: u32,
) -> u32 {
    let Ok(channel) = endpoint.connect().await else {
        return UNAVAILABLE;
    };
    let mut client = DirectiveServiceClient::new(channel);
    let mut inbound = match client.stream(ReceiverStream::new(outbound)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return grpc_code(&status),
    };
    loop {
        match inbound.message().await {
            Ok(Some(message)) => push(
                inboxes,
                token,
                StreamEvent::Message(ControlMessage::encode_to_vec(&message), now_ms()),
            ),
            Ok(None) => return 0,
            Err(status) => return grpc_code(&status),
        }
    }
}

fn grpc_code(status: &tonic::Status) -> u32 {
    u32::try_from(i32::from(status.code())).unwrap_or(UNAVAILABLE)
}
