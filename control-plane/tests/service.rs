//! The control plane in-process: real listeners on port 0, a tonic client in
//! the role of the filter, and the admin API over HTTP.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_control_plane::config::policy::Fraction;
use sluice_control_plane::fleet::FleetCaps;
use sluice_control_plane::types::ControlInterval;
use sluice_control_plane::{AppState, Config, Listeners, RunError, RunOptions, Settings, run};
use sluice_core::Priority;
use sluice_integration_tests::prometheus::Exposition;
use sluice_proto::v1::directive_service_client::DirectiveServiceClient;
use sluice_proto::v1::{
    BucketCount, ControlMessage, DirectiveBatch, Hello, ProxyMessage, Reason, Report,
    control_message, proxy_message,
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
    state: AppState,
    grpc: SocketAddr,
    admin: SocketAddr,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RunError>>,
}

impl ControlPlane {
    async fn start(yaml: &str) -> Self {
        Self::start_with(yaml, |_| {}).await
    }

    async fn start_with(yaml: &str, tweak: impl FnOnce(&mut Settings)) -> Self {
        let config = Config::from_yaml(yaml, "test.yaml").unwrap();
        let interval = ControlInterval::from_millis(INTERVAL_MS).unwrap();
        let mut settings = Settings::from_config(&config, Some(interval));
        tweak(&mut settings);
        let state = AppState::new(settings);
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, admin_addr) = (grpc.local_addr().unwrap(), admin.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let options = RunOptions::in_memory(state.clone());
        let task = tokio::spawn(run(Listeners::new(grpc, admin), options, async {
            let _ = stopped.await;
        }));
        Self {
            state,
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
                    ..Default::default()
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
            follows: None,
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
    /// A bucket whose pushed drop ratio the batches it reads set in an
    /// [`Admitted`].
    follows: Option<(String, Admitted)>,
}

/// The fraction of a bucket's requests the fake proxies admit: 1 − the
/// last drop ratio pushed for it, shared by the proxies that report it.
#[derive(Clone)]
struct Admitted(Arc<AtomicU64>);

impl Admitted {
    /// Everything, as before the first directive.
    fn all() -> Self {
        Self(Arc::new(AtomicU64::new(1.0_f64.to_bits())))
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, fraction: f64) {
        self.0.store(fraction.to_bits(), Ordering::Relaxed);
    }
}

impl Proxy {
    /// Reports `rps` offered requests per second for `bucket` every
    /// `REPORT_MS`, admitting them all, in the background.
    fn report_steadily(&mut self, bucket: &str, rps: u64) {
        self.report_cells_steadily(&[(bucket, "", Priority::Unspecified, rps)]);
    }

    /// Reports every (bucket, tenant, priority, rps) cell every `REPORT_MS`,
    /// admitting everything, in the background.
    fn report_cells_steadily(&mut self, cells: &[(&str, &str, Priority, u64)]) {
        let outbound = self.outbound.clone();
        let counts: Vec<BucketCount> = cells
            .iter()
            .map(|&(bucket, tenant, priority, rps)| BucketCount {
                bucket: bucket.to_owned(),
                tenant: tenant.to_owned(),
                priority: priority as i32,
                offered: rps * REPORT_MS / 1000,
                admitted: rps * REPORT_MS / 1000,
                ..Default::default()
            })
            .collect();
        self.reporter = Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(REPORT_MS));
            for sequence in 0.. {
                ticker.tick().await;
                let report = ProxyMessage {
                    kind: Some(proxy_message::Kind::Report(Report {
                        sequence,
                        window_ms: REPORT_MS,
                        directive_age_ms: None,
                        upstream: Vec::new(),
                        buckets: counts.clone(),
                    })),
                };
                if outbound.send(report).await.is_err() {
                    return;
                }
            }
        }));
    }

    /// Reports `rps` requests a second for `bucket`, each costing `cost`
    /// (estimated) and charged `charged`, every `REPORT_MS`, admitting the
    /// fraction `admitted` says (the pushed ratio's, as a filter would), in
    /// the background.
    fn report_cost_steadily(
        &mut self,
        bucket: &str,
        (rps, cost, charged): (u64, f64, f64),
        admitted: Admitted,
    ) {
        let outbound = self.outbound.clone();
        let requests = rps * REPORT_MS / 1000;
        let bucket = bucket.to_owned();
        self.reporter = Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(REPORT_MS));
            // The fraction of a request not yet admitted, carried so that
            // the windows admit the fraction on average.
            let mut carried = 0.0;
            for sequence in 0.. {
                ticker.tick().await;
                let due = requests as f64 * admitted.get().clamp(0.0, 1.0) + carried;
                let whole = due.floor();
                carried = due - whole;
                let admitted = whole as u64;
                let count = BucketCount {
                    bucket: bucket.clone(),
                    offered: requests,
                    admitted,
                    offered_cost: requests as f64 * cost,
                    admitted_cost: admitted as f64 * cost,
                    charged_cost: admitted as f64 * charged,
                    settled_cost: admitted as f64 * cost,
                    ..Default::default()
                };
                let report = ProxyMessage {
                    kind: Some(proxy_message::Kind::Report(Report {
                        sequence,
                        window_ms: REPORT_MS,
                        buckets: vec![count],
                        ..Default::default()
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
        let batch = match message.kind {
            Some(control_message::Kind::Directives(batch)) => batch,
            None => panic!("empty control message"),
        };
        if let Some((bucket, admitted)) = &self.follows
            && let Some(directive) = batch.directives.iter().find(|d| &d.bucket == bucket)
        {
            admitted.set(1.0 - directive.drop_ratio);
        }
        batch
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
    assert_eq!(acme.limit_rps, Some(200.0));

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
    assert_eq!(batch.directives[0].limit_rps, Some(300.0));

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
    assert_eq!(batch.directives[0].limit_rps, None);
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
            directive_age_ms: None,
            upstream: Vec::new(),
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
    // Until then the bucket is listed with its held cell, offered 0.
    let held = cp
        .wait_for_bucket("acme", |b| {
            b["offered_rps"] == 0.0 && b["cells"][0]["quiet_s"].is_number()
        })
        .await;
    assert!(held["drop_ratio"].as_f64().unwrap() > 0.5, "{held}");
    assert_eq!(held["proxies_reporting"], 0, "{held}");
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

/// A `/metrics` page read by the shared parser, with the lookup these
/// tests use.
#[derive(Debug)]
struct Metrics(Exposition);

impl Metrics {
    /// The value of the one sample of `name` whose labels include
    /// `labels`, if present.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self.0.matching(name, labels);
        let sample = found.next()?;
        assert!(found.next().is_none(), "several {name} {labels:?}");
        Some(sample.value)
    }
}

impl ControlPlane {
    /// `GET /metrics`, checking the status and content type.
    async fn metrics(&self) -> Metrics {
        let response = self
            .http
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let text = response.text().await.unwrap();
        assert!(text.ends_with("# EOF\n"), "no EOF marker:\n{text}");
        Metrics(Exposition::parse(&text).unwrap())
    }

    /// Polls `GET /metrics` until `check` holds.
    async fn wait_for_metrics(&self, what: &str, check: impl Fn(&Metrics) -> bool) -> Metrics {
        let deadline = Instant::now() + WAIT;
        loop {
            let metrics = self.metrics().await;
            if check(&metrics) {
                return metrics;
            }
            assert!(Instant::now() < deadline, "{what} never held: {metrics:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn metrics_follow_buckets_proxies_and_pushes() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;
    proxy.next_batch().await;
    proxy.report_steadily("acme", 600);
    proxy.wait_for_ratio("acme", 2.0 / 3.0).await;

    let acme = [("bucket", "acme")];
    let metrics = cp
        .wait_for_metrics("acme at 3x its limit, pushed", |m| {
            m.value("sluice_bucket_offered_rps", &acme) == Some(600.0)
                && m.value("sluice_bucket_drop_ratio", &acme)
                    .is_some_and(|r| (r - 2.0 / 3.0).abs() < 0.01)
                && m.value("sluice_push_latency_seconds_count", &[])
                    .is_some_and(|n| n > 0.0)
        })
        .await;
    for (family, kind) in [
        ("sluice_bucket_offered_rps", "gauge"),
        ("sluice_bucket_drop_ratio", "gauge"),
        ("sluice_connected_proxies", "gauge"),
        ("sluice_proxy_report_age_seconds", "gauge"),
        ("sluice_reports_received", "counter"),
        ("sluice_directive_batches_pushed", "counter"),
        ("sluice_push_latency_seconds", "histogram"),
        ("sluice_control_loop_tick_duration_seconds", "histogram"),
        ("sluice_build", "info"),
    ] {
        assert_eq!(metrics.0.kind(family), Some(kind), "{family}");
    }
    // The filter stand-in admits everything it offers.
    assert_eq!(
        metrics.value("sluice_bucket_admitted_rps", &acme),
        Some(600.0)
    );
    assert_eq!(metrics.value("sluice_bucket_limit_rps", &acme), Some(200.0));
    assert_eq!(
        metrics.value("sluice_bucket_proxies_reporting", &acme),
        Some(1.0)
    );
    assert_eq!(metrics.value("sluice_buckets_tracked", &[]), Some(1.0));
    assert_eq!(metrics.value("sluice_connected_proxies", &[]), Some(1.0));
    let age = metrics
        .value("sluice_proxy_report_age_seconds", &[("proxy", "envoy-a")])
        .unwrap();
    assert!((0.0..1.0).contains(&age), "report age {age}");
    assert!(metrics.value("sluice_reports_received_total", &[]).unwrap() > 0.0);
    assert!(
        metrics
            .value(
                "sluice_directive_batches_pushed_total",
                &[("kind", "delta")]
            )
            .unwrap()
            >= 1.0
    );
    assert_eq!(
        metrics.value(
            "sluice_directive_batches_pushed_total",
            &[("kind", "snapshot")]
        ),
        Some(1.0)
    );
    assert!(
        metrics
            .value("sluice_directive_batches_published_total", &[])
            .unwrap()
            >= 1.0
    );
    assert!(
        metrics
            .value("sluice_control_loop_tick_duration_seconds_count", &[])
            .unwrap()
            > 0.0
    );
    // The histogram's +Inf bucket holds every observation.
    assert_eq!(
        metrics.value("sluice_push_latency_seconds_bucket", &[("le", "+Inf")]),
        metrics.value("sluice_push_latency_seconds_count", &[])
    );
    let epoch = cp.get("/v1/buckets").await["epoch"].as_u64().unwrap();
    assert_eq!(
        metrics.value("sluice_epoch_info", &[("epoch", &epoch.to_string())]),
        Some(1.0)
    );
    assert_eq!(
        metrics.value(
            "sluice_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );

    // A report that cannot become a rate is counted as rejected.
    proxy
        .outbound
        .send(ProxyMessage {
            kind: Some(proxy_message::Kind::Report(Report {
                sequence: 0,
                window_ms: 0,
                directive_age_ms: None,
                upstream: Vec::new(),
                buckets: vec![],
            })),
        })
        .await
        .unwrap();
    cp.wait_for_metrics("the empty-window report counted", |m| {
        m.value(
            "sluice_reports_rejected_total",
            &[("reason", "empty_window")],
        ) == Some(1.0)
    })
    .await;

    // Once the proxy is gone and its rates expire, its series and the
    // bucket's go away.
    drop(proxy);
    let metrics = cp
        .wait_for_metrics("acme and envoy-a gone", |m| {
            m.value("sluice_connected_proxies", &[]) == Some(0.0)
                && !m.0.samples().iter().any(|s| {
                    s.labels.get("bucket").is_some_and(|b| b == "acme")
                        || s.labels.get("proxy").is_some_and(|p| p == "envoy-a")
                })
        })
        .await;
    assert_eq!(metrics.value("sluice_buckets_tracked", &[]), Some(0.0));
    cp.shutdown().await;
}

const TENANTS: &str = "\
directive_ttl_ms: 4000
limits:
  - bucket: api
    limit_rps: 1000
tenants:
  gold: {weight: 4, burst: 2}
  silver: {weight: 1}
  light: {weight: 0.25}
";

#[tokio::test]
async fn tenants_get_weighted_fair_shares_over_the_stream() {
    let cp = ControlPlane::start(TENANTS).await;
    let mut proxy = cp.connect("envoy-a").await;
    let snapshot = proxy.next_batch().await;
    assert_eq!(snapshot.ttl_ms, 4000);
    assert!(snapshot.modes.is_some());
    let offered = [("gold", 2000), ("silver", 900), ("light", 40)];
    let cells: Vec<_> = offered
        .iter()
        .map(|&(tenant, rps)| ("api", tenant, Priority::Unspecified, rps))
        .collect();
    proxy.report_cells_steadily(&cells);

    // The fair shares of 1000: `light` fits (40), the other 960 goes 4:1.
    let fair = [("gold", 768.0), ("silver", 192.0), ("light", 40.0)];
    let mut held = std::collections::HashMap::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let batch = proxy.next_batch().await;
        assert_eq!(batch.ttl_ms, 4000, "every batch carries the TTL");
        for d in batch.directives.iter().filter(|d| d.bucket == "api") {
            held.insert(d.tenant.clone(), d.clone());
        }
        let admitted = |tenant: &str, rps: f64| {
            held.get(tenant)
                .map(|d: &sluice_proto::v1::Directive| rps * (1.0 - d.drop_ratio))
        };
        let converged = offered.iter().zip(fair).all(|(&(tenant, rps), (_, fair))| {
            admitted(tenant, rps as f64).is_some_and(|a| (a - fair).abs() <= 0.05 * fair)
        });
        if converged {
            break;
        }
        assert!(Instant::now() < deadline, "never converged: {held:#?}");
    }
    let gold = &held["gold"];
    assert_eq!(gold.reason, Reason::TenantQuotaExceeded as i32);
    assert_eq!(gold.burst, 2.0);
    assert_eq!(gold.limit_rps, Some(1000.0));
    assert_eq!(gold.reporting_proxies, 1);
    assert!(gold.retry_after_ms >= 1000);
    assert!((gold.share_rps - 768.0).abs() < 0.05 * 768.0);
    assert_eq!(held["light"].drop_ratio, 0.0);

    let api = cp
        .wait_for_bucket("api", |b| {
            b["cells"].as_array().is_some_and(|c| c.len() == 3)
        })
        .await;
    let gold = &api["cells"][0];
    assert_eq!(gold["tenant"], "gold");
    assert_eq!(gold["priority"], "unspecified");
    assert_eq!(gold["reason"], "tenant_quota_exceeded");
    assert!(gold["share_rps"].as_f64().unwrap() > 700.0);

    let metrics = cp
        .wait_for_metrics("per-tenant series", |m| {
            m.value(
                "sluice_tenant_share_rps",
                &[("bucket", "api"), ("tenant", "gold")],
            )
            .is_some()
        })
        .await;
    assert!(
        metrics
            .value(
                "sluice_tenant_admitted_rps",
                &[("bucket", "api"), ("tenant", "silver")]
            )
            .is_some()
    );
    cp.shutdown().await;
}

#[tokio::test]
async fn bulk_is_shed_before_critical_over_the_stream() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;
    proxy.next_batch().await;
    proxy.report_cells_steadily(&[
        ("acme", "", Priority::Critical, 160),
        ("acme", "", Priority::Bulk, 400),
    ]);
    let deadline = Instant::now() + WAIT;
    let (mut critical, mut bulk) = (None, None);
    while critical.is_none() || bulk.is_none() {
        for d in proxy.next_batch().await.directives {
            if d.priority == Priority::Critical as i32 {
                critical = Some(d);
            } else if d.priority == Priority::Bulk as i32 {
                bulk = Some(d);
            }
        }
        assert!(Instant::now() < deadline);
    }
    let (critical, bulk) = (critical.unwrap(), bulk.unwrap());
    assert_eq!(critical.drop_ratio, 0.0);
    // 40 of BULK's 400 fit under the limit of 200.
    assert!((bulk.drop_ratio - 0.9).abs() < 0.01, "{bulk:?}");
    assert_eq!(bulk.reason, Reason::PriorityShed as i32);
    cp.shutdown().await;
}

#[tokio::test]
async fn the_kill_switch_reaches_a_connected_stream_within_one_push() {
    let cp = ControlPlane::start(LIMITS).await;
    let mut proxy = cp.connect("envoy-a").await;
    let snapshot = proxy.next_batch().await;
    assert!(!snapshot.modes.unwrap().kill_switch);

    cp.state.policy_mut().modes.kill_switch = true;
    let batch = proxy.next_batch().await;
    let modes = batch.modes.unwrap();
    assert!(modes.kill_switch, "the next batch carries it: {batch:?}");
    assert!(batch.directives.is_empty(), "no directive had to change");

    cp.state.policy_mut().modes.canary_fraction = Some(Fraction::new(0.25).unwrap());
    let batch = proxy.next_batch().await;
    assert_eq!(batch.modes.unwrap().canary_fraction, Some(0.25));
    assert!(batch.modes.unwrap().kill_switch);

    // A proxy connecting later starts from the same modes.
    let mut late = cp.connect("envoy-b").await;
    let snapshot = late.next_batch().await;
    assert!(snapshot.modes.unwrap().kill_switch);
    cp.shutdown().await;
}

#[tokio::test]
async fn heartbeats_keep_an_idle_stream_fresh() {
    let cp = ControlPlane::start(TENANTS).await;
    let mut proxy = cp.connect("envoy-a").await;
    let snapshot = proxy.next_batch().await;
    // Nothing changes: only heartbeats arrive, each an empty batch with the
    // TTL, each a new version.
    let mut version = snapshot.version;
    for _ in 0..2 {
        let heartbeat = proxy.next_batch().await;
        assert!(heartbeat.directives.is_empty());
        assert_eq!(heartbeat.ttl_ms, 4000);
        assert_eq!(heartbeat.epoch, snapshot.epoch);
        assert!(heartbeat.version > version);
        version = heartbeat.version;
    }
    let metrics = cp.metrics().await;
    assert!(
        metrics
            .value("sluice_heartbeats_published_total", &[])
            .unwrap()
            >= 2.0
    );
    let age = metrics
        .value("sluice_directive_batch_age_seconds", &[])
        .unwrap();
    assert!(age < 2.0, "a heartbeat went out recently: {age}");
    cp.shutdown().await;
}

#[tokio::test]
async fn a_cardinality_flood_keeps_the_state_bounded() {
    let caps = FleetCaps {
        max_cells_per_proxy: 500,
        max_cells: 800,
        ..FleetCaps::default()
    };
    let cp = ControlPlane::start_with(LIMITS, |settings| settings.fleet_caps = caps).await;
    let mut steady = cp.connect("envoy-a").await;
    steady.next_batch().await;
    steady.report_steadily("acme", 600);
    steady.wait_for_ratio("acme", 2.0 / 3.0).await;

    let flood = cp.connect("flood").await;
    for round in 0..10_u64 {
        let buckets = (0..5_000)
            .map(|i| BucketCount {
                bucket: format!("flood-{round}-{i}"),
                tenant: format!("tenant-{i}"),
                offered: 1,
                admitted: 1,
                ..Default::default()
            })
            .collect();
        flood
            .outbound
            .send(ProxyMessage {
                kind: Some(proxy_message::Kind::Report(Report {
                    sequence: round,
                    window_ms: 100,
                    directive_age_ms: None,
                    upstream: Vec::new(),
                    buckets,
                })),
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(INTERVAL_MS)).await;
        let metrics = cp.metrics().await;
        let tracked = metrics.value("sluice_cells_tracked", &[]).unwrap();
        assert!(tracked <= 800.0, "round {round}: {tracked} cells");
    }
    // 50,000 entries, at most 500 accepted per window: the rest refused by
    // the proxy's cap, by the share of either cap unlimited buckets may
    // fill, or once the fleet is full, by the fleet's.
    let refused = |m: &Metrics| {
        ["proxy_cap", "fleet_cap", "unlimited_share"]
            .iter()
            .filter_map(|reason| m.value("sluice_cells_rejected_total", &[("reason", reason)]))
            .sum::<f64>()
    };
    let metrics = cp
        .wait_for_metrics("refusals counted", |m| refused(m) >= 45_000.0)
        .await;
    assert!(
        metrics
            .value(
                "sluice_cells_rejected_total",
                &[("reason", "unlimited_share")]
            )
            .unwrap()
            > 0.0
    );
    assert!(
        metrics
            .value("sluice_cells_evicted_total", &[("reason", "idle")])
            .unwrap()
            > 0.0
    );
    let buckets = cp.get("/v1/buckets").await;
    assert!(buckets["buckets"].as_array().unwrap().len() <= 800);
    // The steady bucket kept its directive throughout.
    cp.wait_for_bucket("acme", |b| b["offered_rps"] == 600.0)
        .await;
    drop(flood);
    cp.shutdown().await;
}

/// A budget whose proxies report requests but no cost (no cost rule of
/// the filter applies to them) cannot be steered: the control plane says
/// so on /metrics, and stops saying it once the proxies count cost.
#[tokio::test]
async fn a_budget_whose_proxies_count_no_cost_is_shown_on_metrics() {
    let cp = ControlPlane::start(
        "limits:\n  - bucket: llm\n    budget: {amount: 1200000, unit: tokens, per: minute}\n",
    )
    .await;
    let mut proxy = cp.connect("envoy-a").await;
    proxy.next_batch().await;
    proxy.report_steadily("llm", 600);
    let without_cost = |metrics: &Metrics| metrics.value("sluice_budget_cells_without_cost", &[]);
    cp.wait_for_metrics("one budget cell without cost", |m| {
        without_cost(m) == Some(1.0)
    })
    .await;
    // Listed with its requests, though it has no cost to show or steer.
    let llm = cp
        .wait_for_bucket("llm", |b| b["cost"]["cells_without_cost"] == 1)
        .await;
    assert_eq!(llm["cells"], serde_json::json!([]), "{llm}");
    assert_eq!(llm["cost"]["offered_requests_rps"], 600.0, "{llm}");
    assert_eq!(llm["limit_rps"], 20_000.0, "{llm}");
    proxy.stop_reporting();
    proxy.report_cost_steadily("llm", (600, 25.0, 25.0), Admitted::all());
    cp.wait_for_metrics("no budget cell without cost", |m| {
        without_cost(m) == Some(0.0)
    })
    .await;
    cp.wait_for_bucket("llm", |b| {
        b["cost"]["cells_without_cost"] == 0 && b["cells"].as_array().is_some_and(|c| !c.is_empty())
    })
    .await;
    cp.shutdown().await;
}

#[tokio::test]
async fn a_token_budget_is_steered_on_reported_cost_over_the_stream() {
    let cp = ControlPlane::start(
        "limits:\n  - bucket: llm\n    budget: {amount: 1200000, unit: tokens, per: minute}\n",
    )
    .await;
    let mut proxies = Vec::new();
    // 60/30/10 of 2,400 requests a second of 25 tokens each: 60,000
    // tokens/s of estimates offered, three times the budget of 20,000
    // tokens/s; each proxy alone is under it or near it. Every request is
    // charged 30 tokens, 1.2 times its estimate, which tightens the budget
    // from the first charges: 72,000 tokens/s offered as charged, a drop
    // of 1 - 20,000 / 72,000. They admit what the ratio the first one
    // reads asks: a fixed share would leave the budget's balance a debt or
    // a credit it never repays.
    let admitted = Admitted::all();
    for (proxy_id, rps) in [("envoy-a", 1440), ("envoy-b", 720), ("envoy-c", 240)] {
        let mut proxy = cp.connect(proxy_id).await;
        proxy.next_batch().await;
        proxy.report_cost_steadily("llm", (rps, 25.0, 30.0), admitted.clone());
        proxies.push(proxy);
    }
    proxies[0].follows = Some(("llm".to_owned(), admitted));
    // Two proxies' demand with the balance's repayment can ask near the
    // same ratio; the one to check is the whole fleet's.
    let deadline = Instant::now() + WAIT;
    let llm = loop {
        let batch = proxies[0].wait_for_ratio("llm", 1.0 - 20.0 / 72.0).await;
        let llm = batch.directives.into_iter().find(|d| d.bucket == "llm");
        match llm {
            Some(llm) if llm.reporting_proxies == 3 => break llm,
            other => assert!(Instant::now() < deadline, "{other:?}"),
        }
    };
    assert_eq!(llm.cost_unit, "tokens");
    assert_eq!(llm.budget_period_s, 60);
    assert_eq!(llm.limit_rps, Some(20_000.0));
    assert!((llm.charge_factor - 1.2).abs() < 1e-9, "{llm:?}");
    assert!((llm.offered_rps - 60_000.0).abs() < 1.0, "{llm:?}");

    // The budget's 20,000 tokens/s charged, once the proxies admit what
    // the ratio asks.
    let near_20000 = |rate: Option<f64>| rate.is_some_and(|r| (r / 20_000.0 - 1.0).abs() < 0.1);
    let bucket = cp
        .wait_for_bucket("llm", |b| {
            b["proxies_reporting"] == 3 && near_20000(b["cost"]["charged_per_s"].as_f64())
        })
        .await;
    assert_eq!(bucket["limit_rps"], 20_000.0);
    assert_eq!(bucket["offered_rps"], 60_000.0);
    let cost = &bucket["cost"];
    assert_eq!(cost["budget"]["unit"], "tokens");
    assert_eq!(cost["budget"]["per"], "minute");
    assert_eq!(cost["offered_requests_rps"], 2400.0);
    assert!((cost["charged_to_estimate"].as_f64().unwrap() - 1.2).abs() < 1e-9);
    let metrics = cp
        .http
        .get(format!("http://{}/metrics", cp.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exposition = Exposition::parse(&metrics).unwrap();
    let exported = exposition.value(
        "sluice_bucket_charged_cost_per_second",
        &[("bucket", "llm"), ("unit", "tokens")],
    );
    assert!(near_20000(exported), "{metrics}");

    // A budget changed through the admin API reaches the stream; a bad one
    // is refused with a problem and changes nothing.
    let put = |body: Value| {
        cp.http
            .put(format!("http://{}/v1/limits/llm", cp.admin))
            .json(&body)
            .send()
    };
    for bad in [
        serde_json::json!({"budget": {"amount": 0, "unit": "tokens", "per": "minute"}}),
        serde_json::json!({"budget": {"amount": 5, "unit": "to kens", "per": "minute"}}),
        serde_json::json!({"budget": {"amount": 5, "unit": "tokens", "per": "day"}}),
        serde_json::json!({"limit_rps": 5, "budget": {"amount": 5, "unit": "t", "per": "hour"}}),
        serde_json::json!({}),
    ] {
        let response = put(bad.clone()).await.unwrap();
        assert_eq!(response.status(), 422, "{bad}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{bad}"
        );
    }
    let limit = cp.get("/v1/limits/llm").await;
    assert_eq!(limit["budget"]["amount"], 1_200_000.0, "{limit}");
    let response =
        put(serde_json::json!({"budget": {"amount": 30000, "unit": "tokens", "per": "second"}}))
            .await
            .unwrap();
    assert_eq!(response.status(), 200);
    proxies[1].follows = proxies[0].follows.take();
    let batch = proxies[1].wait_for_ratio("llm", 1.0 - 30.0 / 72.0).await;
    let llm = batch.directives.iter().find(|d| d.bucket == "llm").unwrap();
    assert_eq!(llm.budget_period_s, 1);
    assert_eq!(llm.limit_rps, Some(30_000.0));
    drop(proxies);
    cp.shutdown().await;
}
