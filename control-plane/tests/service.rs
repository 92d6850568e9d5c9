//! The control plane in-process: real listeners on port 0, a tonic client in
//! the role of the filter, and the admin API over HTTP.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_control_plane::types::ControlInterval;
use sluice_control_plane::{AppState, Config, RunError, Settings, run};
use sluice_proto::v1::directive_service_client::DirectiveServiceClient;
use sluice_proto::v1::{
    BucketCount, ControlMessage, DirectiveBatch, Hello, ProxyMessage, Report, control_message,
    proxy_message,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Endpoint;

const INTERVAL_MS: u64 = 50;
/// How often the simulated filters report, and the window they cover.
const REPORT_MS: u64 = 25;
const WAIT: Duration = Duration::from_secs(5);

const LIMITS: &str = "\
limits:
  - bucket: acme
    limit_rps: 200
";

/// A control plane running in this process.
struct ControlPlane {
    grpc: SocketAddr,
    admin: SocketAddr,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RunError>>,
}

impl ControlPlane {
    async fn start(yaml: &str) -> Self {
        let config = Config::from_yaml(yaml, "test.yaml").unwrap();
        let interval = ControlInterval::from_millis(INTERVAL_MS).unwrap();
        let state = AppState::new(Settings::from_config(&config, Some(interval)));
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, admin_addr) = (grpc.local_addr().unwrap(), admin.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(grpc, admin, state, async {
            let _ = stopped.await;
        }));
        Self {
            grpc: grpc_addr,
            admin: admin_addr,
            http: reqwest::Client::new(),
            stop: Some(stop),
            task,
        }
    }

    async fn connect(&self, proxy_id: &str) -> Proxy {
        let channel = Endpoint::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (outbound, receiver) = mpsc::channel(64);
        outbound
            .send(ProxyMessage {
                kind: Some(proxy_message::Kind::Hello(Hello {
                    proxy_id: proxy_id.to_owned(),
                    instance_id: 7,
                })),
            })
            .await
            .unwrap();
        let inbound = DirectiveServiceClient::new(channel)
            .stream(ReceiverStream::new(receiver))
            .await
            .unwrap()
            .into_inner();
        Proxy {
            outbound,
            inbound,
            reporter: None,
        }
    }

    async fn get(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("http://{}{path}", self.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "GET {path}");
        response.json().await.unwrap()
    }

    async fn put_limit(&self, bucket: &str, limit_rps: f64) {
        let response = self
            .http
            .put(format!("http://{}/v1/limits/{bucket}", self.admin))
            .json(&serde_json::json!({ "limit_rps": limit_rps }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }

    /// Polls `GET /v1/buckets` until `bucket` satisfies `check`.
    async fn wait_for_bucket(&self, bucket: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let reply = self.get("/v1/buckets").await;
            let found = reply["buckets"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["bucket"] == bucket)
                .cloned();
            if let Some(found) = found.filter(|b| check(b)) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "bucket {bucket} never matched: {reply}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the control plane and returns how long that took.
    async fn shutdown(mut self) -> Duration {
        let started = Instant::now();
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .unwrap()
            .unwrap();
        started.elapsed()
    }
}

/// The filter's side of a stream.
struct Proxy {
    outbound: mpsc::Sender<ProxyMessage>,
    inbound: Streaming<ControlMessage>,
    reporter: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Reports `rps` offered requests per second for `bucket` every
    /// `REPORT_MS`, admitting them all, in the background.
    fn report_steadily(&mut self, bucket: &str, rps: u64) {
        let outbound = self.outbound.clone();
        let bucket = bucket.to_owned();
        let per_window = rps * REPORT_MS / 1000;
        self.reporter = Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(REPORT_MS));
            for sequence in 0.. {
                ticker.tick().await;
                let report = ProxyMessage {
                    kind: Some(proxy_message::Kind::Report(Report {
                        sequence,
                        window_ms: REPORT_MS,
                        buckets: vec![BucketCount {
                            bucket: bucket.clone(),
                            offered: per_window,
                            admitted: per_window,
                        }],
                    })),
                };
                if outbound.send(report).await.is_err() {
                    return;
                }
            }
        }));
    }

    fn stop_reporting(&mut self) {
        if let Some(reporter) = self.reporter.take() {
            reporter.abort();
        }
    }

    async fn next_batch(&mut self) -> DirectiveBatch {
        let message = tokio::time::timeout(WAIT, self.inbound.message())
            .await
            .expect("no batch in time")
            .expect("stream failed")
            .expect("stream ended");
        match message.kind {
            Some(control_message::Kind::Directives(batch)) => batch,
            None => panic!("empty control message"),
        }
    }

    /// Reads batches until one sets `bucket`'s drop ratio near `expected`.
    async fn wait_for_ratio(&mut self, bucket: &str, expected: f64) -> DirectiveBatch {
        let deadline = Instant::now() + WAIT;
        loop {
            let batch = self.next_batch().await;
            let hit = batch
                .directives
                .iter()
                .any(|d| d.bucket == bucket && (d.drop_ratio - expected).abs() < 0.01);
            if hit {
                return batch;
            }
            assert!(
                Instant::now() < deadline,
                "no drop ratio {expected} for {bucket}"
            );
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop_reporting();
    }
}

fn ratio_of(batch: &DirectiveBatch, bucket: &str) -> f64 {
    batch
        .directives
        .iter()
        .find(|d| d.bucket == bucket)
        .unwrap()
        .drop_ratio
}

#[tokio::test]
async fn snapshot_first_then_drop_ratio_for_three_times_the_limit() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;

    let snapshot = proxy.next_batch().await;
    assert!(
        snapshot.directives.is_empty(),
        "nothing known yet: {snapshot:?}"
    );
    let epoch = cp.get("/v1/buckets").await["epoch"].as_u64().unwrap();
    assert_eq!(snapshot.epoch, epoch);

    proxy.report_steadily("acme", 600);
    let batch = proxy.wait_for_ratio("acme", 2.0 / 3.0).await;
    assert_eq!(batch.epoch, epoch);
    assert!(batch.version > snapshot.version);
    assert!(batch.issued_at_unix_ms > 0);
    let acme = batch
        .directives
        .iter()
        .find(|d| d.bucket == "acme")
        .unwrap();
    assert_eq!(acme.limit_rps, 200.0);

    let bucket = cp
        .wait_for_bucket("acme", |b| b["proxies_reporting"] == 1)
        .await;
    assert_eq!(bucket["limit_rps"], 200.0);
    assert_eq!(bucket["offered_rps"], 600.0);
    assert!((bucket["drop_ratio"].as_f64().unwrap() - 2.0 / 3.0).abs() < 0.01);
    cp.shutdown().await;
}

#[tokio::test]
async fn uneven_proxies_are_limited_by_the_fleet_sum() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut a = cp.connect("envoy-a").await;
    let mut b = cp.connect("envoy-b").await;
    a.next_batch().await;
    b.next_batch().await;
    a.report_steadily("acme", 480);
    b.report_steadily("acme", 120);

    // Each proxy alone would be at 0.58 and 0.0; the fleet is at 600 rps.
    let batch_a = a.wait_for_ratio("acme", 2.0 / 3.0).await;
    let batch_b = b.wait_for_ratio("acme", 2.0 / 3.0).await;
    assert_eq!(ratio_of(&batch_a, "acme"), ratio_of(&batch_b, "acme"));

    let bucket = cp
        .wait_for_bucket("acme", |b| b["proxies_reporting"] == 2)
        .await;
    assert_eq!(bucket["offered_rps"], 600.0);
    assert_eq!(bucket["admitted_rps"], 600.0);
    cp.shutdown().await;
}

#[tokio::test]
async fn limit_changes_through_the_admin_api_are_pushed() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;
    proxy.next_batch().await;
    proxy.report_steadily("acme", 600);
    proxy.wait_for_ratio("acme", 2.0 / 3.0).await;

    let changed_at = Instant::now();
    cp.put_limit("acme", 300.0).await;
    let batch = proxy.wait_for_ratio("acme", 0.5).await;
    assert!(
        changed_at.elapsed() < Duration::from_secs(1),
        "took {:?}",
        changed_at.elapsed()
    );
    assert_eq!(batch.directives[0].limit_rps, 300.0);

    // Removing the exact limit leaves the bucket unlimited: ratio 0, and 0 on
    // the wire for the limit.
    let response = cp
        .http
        .delete(format!("http://{}/v1/limits/acme", cp.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let batch = proxy.wait_for_ratio("acme", 0.0).await;
    assert_eq!(batch.directives[0].limit_rps, 0.0);
    cp.wait_for_bucket("acme", |b| b["limit_rps"].is_null())
        .await;
    cp.shutdown().await;
}

#[tokio::test]
async fn a_late_stream_starts_with_the_current_directives() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut reporter = cp.connect("envoy-a").await;
    reporter.next_batch().await;
    reporter.report_steadily("acme", 600);
    reporter.wait_for_ratio("acme", 2.0 / 3.0).await;

    let mut late = cp.connect("envoy-b").await;
    let snapshot = late.next_batch().await;
    assert!(
        (ratio_of(&snapshot, "acme") - 2.0 / 3.0).abs() < 0.01,
        "{snapshot:?}"
    );
    cp.shutdown().await;
}

#[tokio::test]
async fn a_reconnecting_proxy_replaces_its_old_stream() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut old = cp.connect("envoy-a").await;
    old.next_batch().await;
    old.report_steadily("acme", 600);
    cp.wait_for_bucket("acme", |b| b["offered_rps"] == 600.0)
        .await;

    // Same proxy id: the old stream's reports no longer count, so the fleet
    // rate is the new stream's alone, not the sum of both.
    let mut new = cp.connect("envoy-a").await;
    new.next_batch().await;
    new.report_steadily("acme", 400);
    let bucket = cp
        .wait_for_bucket("acme", |b| b["offered_rps"] == 400.0)
        .await;
    assert_eq!(bucket["proxies_reporting"], 1);
    tokio::time::sleep(Duration::from_millis(3 * INTERVAL_MS)).await;
    cp.wait_for_bucket("acme", |b| b["offered_rps"] == 400.0)
        .await;
    drop(old);
    cp.shutdown().await;
}

#[tokio::test]
async fn a_stream_must_start_with_hello() {
    let cp = ControlPlane::start(LIMITS).await;
    let channel = Endpoint::from_shared(format!("http://{}", cp.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let report = ProxyMessage {
        kind: Some(proxy_message::Kind::Report(Report {
            sequence: 1,
            window_ms: 100,
            buckets: vec![],
        })),
    };
    let (outbound, receiver) = mpsc::channel(1);
    outbound.send(report).await.unwrap();
    let mut inbound = DirectiveServiceClient::new(channel)
        .stream(ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    let status = tokio::time::timeout(WAIT, inbound.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    cp.shutdown().await;
}

#[tokio::test]
async fn shutdown_is_prompt_with_streams_open() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;
    proxy.next_batch().await;
    proxy.report_steadily("acme", 600);
    proxy.wait_for_ratio("acme", 2.0 / 3.0).await;

    let took = cp.shutdown().await;
    assert!(took < Duration::from_secs(1), "shutdown took {took:?}");
    // The proxy sees its stream end (cleanly or reset), not a hang.
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match proxy.inbound.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "stream still open after shutdown");
}

#[tokio::test]
async fn healthz_and_limits_shape() {
    let cp = ControlPlane::start(
        "default_limit_rps: 100\nlimits:\n  - bucket: acme\n    limit_rps: 200\n  - pattern: \"free-*\"\n    limit_rps: 5\n",
    )
    .await;
    assert_eq!(
        cp.get("/healthz").await,
        serde_json::json!({"status": "ok"})
    );
    assert_eq!(
        cp.get("/v1/limits").await,
        serde_json::json!({
            "default_limit_rps": 100.0,
            "limits": [
                {"bucket": "acme", "limit_rps": 200.0},
                {"pattern": "free-*", "limit_rps": 5.0},
            ],
        })
    );
    let buckets = cp.get("/v1/buckets").await;
    assert_eq!(buckets["control_interval_ms"], INTERVAL_MS);
    assert_eq!(buckets["buckets"], serde_json::json!([]));
    cp.shutdown().await;
}

#[tokio::test]
async fn stopped_traffic_lifts_the_directive() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;
    proxy.next_batch().await;
    proxy.report_steadily("acme", 600);
    proxy.wait_for_ratio("acme", 2.0 / 3.0).await;

    // Silent proxies are carried for three intervals, then the bucket has no
    // traffic and its directive is lifted explicitly (proxies keep unnamed
    // buckets' last directive).
    proxy.stop_reporting();
    let batch = proxy.wait_for_ratio("acme", 0.0).await;
    assert_eq!(batch.directives.len(), 1);
    let deadline = Instant::now() + WAIT;
    while !cp.get("/v1/buckets").await["buckets"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "bucket still listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cp.shutdown().await;
}
