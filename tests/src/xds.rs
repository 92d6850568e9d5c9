//! A state-of-the-world ADS server (`envoy.service.discovery.v3`
//! AggregatedDiscoveryService) on loopback: it serves Envoy the resources a
//! test sets, per type URL, pushes a new version to every stream when they
//! change, and records what each Envoy acknowledged or refused. It stands
//! in for istiod's xDS port in the tests of Istio's delivery contract
//! ([`crate::mesh`]), which feed it exactly what istiod would send.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// The type URL of ECDS resources.
pub const EXTENSION_CONFIG_TYPE: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// What the server serves: named resources per type URL, and one version
/// for all of them (bumped on every change).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Bumped by every [`XdsServer::set`].
    pub version: u64,
    resources: BTreeMap<String, Vec<(String, Any)>>,
}

impl Snapshot {
    fn version_info(&self) -> String {
        self.version.to_string()
    }

    /// The resources of `type_url` named in `names` (all when empty).
    fn select(&self, type_url: &str, names: &[String]) -> Vec<Any> {
        self.resources
            .get(type_url)
            .into_iter()
            .flatten()
            .filter(|(name, _)| names.is_empty() || names.contains(name))
            .map(|(_, resource)| resource.clone())
            .collect()
    }
}

/// One acknowledgement (or refusal) of a response by an Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The node id the stream identified itself with.
    pub node_id: String,
    /// The type URL acknowledged.
    pub type_url: String,
    /// The version of the response this answers.
    pub version: String,
    /// Envoy's error, when it refused the response (a NACK).
    pub error: Option<String>,
}

/// A running ADS server; dropping it stops it.
#[derive(Debug)]
pub struct XdsServer {
    addr: SocketAddr,
    snapshot: Arc<watch::Sender<Snapshot>>,
    acks: Arc<Mutex<Vec<Ack>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl XdsServer {
    /// Binds `127.0.0.1:0` and serves an empty snapshot.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the xDS server")?;
        let addr = listener.local_addr()?;
        let snapshot = Arc::new(watch::Sender::new(Snapshot::default()));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let service = Ads {
            snapshot: snapshot.clone(),
            acks: acks.clone(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(err) = served {
                eprintln!("xDS server: {err}");
            }
        });
        Ok(Self {
            addr,
            snapshot,
            acks,
            stop: Some(stop),
            task,
        })
    }

    /// The gRPC address (Envoy's `ads_config` cluster points here).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the resources of `type_url` and pushes them to every stream
    /// subscribed to it; returns the new version.
    pub fn set(&self, type_url: &str, resources: Vec<(String, Any)>) -> u64 {
        let mut version = 0;
        self.snapshot.send_modify(|snapshot| {
            snapshot.version += 1;
            version = snapshot.version;
            snapshot.resources.insert(type_url.to_owned(), resources);
        });
        version
    }

    /// Every acknowledgement and refusal so far, in arrival order.
    pub fn acks(&self) -> Vec<Ack> {
        self.acks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `node_id` acknowledged `version` of `type_url`; fails at
    /// once if it refused it (with Envoy's error), or after `timeout`.
    pub async fn wait_for_ack(
        &self,
        node_id: &str,
        type_url: &str,
        version: u64,
        timeout: Duration,
    ) -> Result<()> {
        let version = version.to_string();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let answer = self.acks().into_iter().find(|ack| {
                ack.node_id == node_id && ack.type_url == type_url && ack.version == version
            });
            match answer {
                Some(Ack { error: None, .. }) => return Ok(()),
                Some(Ack {
                    error: Some(error), ..
                }) => bail!("{node_id} refused version {version} of {type_url}: {error}"),
                None => {}
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{node_id} did not acknowledge version {version} of {type_url} within {timeout:?}; acks: {:?}",
                    self.acks()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

struct Ads {
    snapshot: Arc<watch::Sender<Snapshot>>,
    acks: Arc<Mutex<Vec<Ack>>>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponseStream =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaResponseStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let requests = request.into_inner();
        let (responses, outgoing) = mpsc::channel(16);
        let stream = AdsStream {
            snapshot: self.snapshot.subscribe(),
            acks: self.acks.clone(),
            responses,
            node_id: String::new(),
            subscribed: BTreeMap::new(),
            sent: BTreeMap::new(),
            versions_by_nonce: BTreeMap::new(),
            nonce: 0,
        };
        tokio::spawn(stream.run(requests));
        Ok(Response::new(Box::pin(ReceiverStream::new(outgoing))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "this server speaks state-of-the-world ADS only",
        ))
    }
}

/// One Envoy's ADS stream.
struct AdsStream {
    snapshot: watch::Receiver<Snapshot>,
    acks: Arc<Mutex<Vec<Ack>>>,
    responses: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    node_id: String,
    /// Resource names per subscribed type URL.
    subscribed: BTreeMap<String, Vec<String>>,
    /// Version last sent per type URL.
    sent: BTreeMap<String, String>,
    /// The version each response (by nonce) carried.
    versions_by_nonce: BTreeMap<String, String>,
    nonce: u64,
}

impl AdsStream {
    async fn run(mut self, mut requests: Streaming<DiscoveryRequest>) {
        loop {
            tokio::select! {
                request = requests.message() => match request {
                    Ok(Some(request)) => {
                        if self.on_request(request).await.is_err() {
                            return;
                        }
                    }
                    // The Envoy went away (or broke the stream).
                    Ok(None) | Err(_) => return,
                },
                changed = self.snapshot.changed() => {
                    if changed.is_err() || self.push_all().await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    async fn on_request(&mut self, request: DiscoveryRequest) -> Result<(), ()> {
        if let Some(node) = &request.node
            && self.node_id.is_empty()
        {
            self.node_id.clone_from(&node.id);
        }
        if let Some(version) = self.versions_by_nonce.get(&request.response_nonce) {
            let ack = Ack {
                node_id: self.node_id.clone(),
                type_url: request.type_url.clone(),
                version: version.clone(),
                error: request
                    .error_detail
                    .as_ref()
                    .map(|status| status.message.clone()),
            };
            self.acks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(ack);
        }
        let previous = self
            .subscribed
            .insert(request.type_url.clone(), request.resource_names.clone());
        let current = self.snapshot.borrow().version_info();
        // A first request, or one that names other resources: answer. An
        // acknowledgement of what was sent needs no answer.
        let names_changed = previous.as_ref() != Some(&request.resource_names);
        if self.sent.get(&request.type_url) != Some(&current) || names_changed {
            self.push(&request.type_url).await?;
        }
        Ok(())
    }

    async fn push_all(&mut self) -> Result<(), ()> {
        let types: Vec<String> = self.subscribed.keys().cloned().collect();
        let current = self.snapshot.borrow().version_info();
        for type_url in types {
            if self.sent.get(&type_url) != Some(&current) {
                self.push(&type_url).await?;
            }
        }
        Ok(())
    }

    async fn push(&mut self, type_url: &str) -> Result<(), ()> {
        let (version, resources) = {
            let snapshot = self.snapshot.borrow();
            let names = self.subscribed.get(type_url).cloned().unwrap_or_default();
            (snapshot.version_info(), snapshot.select(type_url, &names))
        };
        self.nonce += 1;
        let response = DiscoveryResponse {
            version_info: version.clone(),
            resources,
            type_url: type_url.to_owned(),
            nonce: self.nonce.to_string(),
            ..DiscoveryResponse::default()
        };
        self.versions_by_nonce
            .insert(response.nonce.clone(), version.clone());
        self.sent.insert(type_url.to_owned(), version);
        self.responses.send(Ok(response)).await.map_err(drop)
    }
}

/// Packs a message as `Any` with its type URL.
pub fn to_any<M: prost::Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}
