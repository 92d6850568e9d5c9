//! Upgrades: filters and control planes one minor version apart must work
//! together. `sluice.v1` has had no earlier minor (the proto only ever
//! gained fields, and every build so far shipped together), so what is
//! tested is the rule the protocol keeps: fields are only added, never
//! renumbered or retyped, and each side ignores fields it does not know.
//! Here a proxy of a newer minor, whose Hello, Reports and bucket counts
//! carry fields this build does not define, streams to the real control
//! plane: its counts are summed and it gets directives. The other
//! direction (a newer control plane's batches, directives with unknown
//! fields, applied by this filter) is the filter's agent test
//! `directives_with_fields_this_build_does_not_know_apply`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use prost::Message;
use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::raw_grpc::RawCodec;
use sluice_proto::v1::{BucketCount, ControlMessage, Hello, Report, control_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const LIMITS: &str = "limits:\n  - bucket: acme\n    limit_rps: 200\n";
/// Reports every this often, each counting 100 requests: 500 rps.
const REPORT_EVERY: Duration = Duration::from_millis(200);

/// Appends a field this build's protocol does not define.
fn with_unknown_field(mut encoded: Vec<u8>, field: u32, value: &str) -> Vec<u8> {
    prost::encoding::string::encode(field, &value.to_owned(), &mut encoded);
    encoded
}

/// `ProxyMessage { <field>: <message> }` plus a field of its own this build
/// does not know.
fn proxy_message(field: u32, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::bytes::encode(field, &message.to_vec(), &mut out);
    with_unknown_field(out, 1100, "future proxy message field")
}

fn hello() -> Vec<u8> {
    let hello = Hello {
        proxy_id: "next-minor".into(),
        instance_id: 7,
        ..Hello::default()
    };
    proxy_message(
        1,
        &with_unknown_field(hello.encode_to_vec(), 1000, "future hello field"),
    )
}

fn report(sequence: u64) -> Vec<u8> {
    let count = BucketCount {
        bucket: "acme".into(),
        offered: 100,
        admitted: 100,
        ..BucketCount::default()
    };
    let count = with_unknown_field(count.encode_to_vec(), 1001, "future count field");
    let report = Report {
        sequence,
        window_ms: 200,
        ..Report::default()
    };
    let mut report = with_unknown_field(report.encode_to_vec(), 1002, "future report field");
    // `repeated BucketCount buckets = 3`, by hand to keep its unknown field.
    prost::encoding::bytes::encode(3, &count, &mut report);
    proxy_message(2, &report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_of_a_newer_minor_is_counted_and_directed() {
    let fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS))
        .await
        .unwrap();
    let control_plane = &fleet.control_plane;
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", control_plane.grpc_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let (outbound, receiver) = mpsc::channel::<Vec<u8>>(16);
    outbound.send(hello()).await.unwrap();
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/sluice.v1.DirectiveService/Stream");
    let mut inbound = client
        .streaming(
            tonic::Request::new(ReceiverStream::new(receiver)),
            path,
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    // The stream must be read, or the control plane stops reading it.
    let reader = tokio::spawn(async move {
        let mut acme_drop_ratios = Vec::new();
        while let Ok(Some(bytes)) = inbound.message().await {
            let message = ControlMessage::decode(bytes.as_slice()).unwrap();
            if let Some(control_message::Kind::Directives(batch)) = message.kind {
                acme_drop_ratios.extend(
                    batch
                        .directives
                        .iter()
                        .filter(|d| d.bucket == "acme")
                        .map(|d| d.drop_ratio),
                );
            }
        }
        acme_drop_ratios
    });
    // Wait one window before the first report: windows may not claim more
    // time than the stream has been open.
    let mut ticker = tokio::time::interval(REPORT_EVERY);
    ticker.tick().await;
    for sequence in 1..=15 {
        ticker.tick().await;
        outbound.send(report(sequence)).await.unwrap();
    }
    let buckets = control_plane.admin().buckets().await.unwrap();
    let proxies = control_plane.admin().proxies().await.unwrap();
    drop(outbound);
    let drop_ratios = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .unwrap()
        .unwrap();
    let summary = format!("{buckets:?}\n{proxies:?}\ndrop ratios pushed: {drop_ratios:?}");
    let acme = buckets.bucket("acme").unwrap_or_else(|| {
        control_plane.print_log();
        panic!("acme not counted\n{summary}")
    });
    assert_eq!(acme.proxies_reporting, 1, "{summary}");
    assert!(
        (acme.offered_rps - 500.0).abs() < 75.0,
        "offered {} rps, sent 500\n{summary}",
        acme.offered_rps
    );
    let proxy = proxies.proxies.iter().find(|p| p.proxy_id == "next-minor");
    assert!(proxy.is_some_and(|p| p.connected), "{summary}");
    // 500 rps offered against 200: the proxy is told to drop about 0.6.
    let last = drop_ratios.last().copied().unwrap_or_default();
    assert!((0.45..=0.75).contains(&last), "{summary}");
}
