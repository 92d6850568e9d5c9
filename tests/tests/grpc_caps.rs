//! What one connection, one peer or one Hello may cost the control plane,
//! against its real gRPC listener (the clients are written here, as an
//! attacker would write them):
//! - 1,000 streams on one HTTP/2 connection: the first few are served, the
//!   rest refused with `RESOURCE_EXHAUSTED`, counted;
//! - connections from one address beyond the cap are closed at accept,
//!   and under mutual TLS one identity's connections beyond its cap are
//!   refused, counted;
//! - a 4,000,000-byte `proxy_id`, an oversized zone, or control characters
//!   in either are refused with `INVALID_ARGUMENT`, counted; `/v1/proxies`
//!   and `/metrics` stay small;
//! - the node ids Istio and Envoy Gateway give their proxies are accepted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_integration_tests::certs;
use sluice_integration_tests::control_plane::sample;
use sluice_integration_tests::fake_proxy::{self, ClientTls, FakeProxy};
use sluice_integration_tests::fleet::{Fleet, FleetOptions};
use sluice_integration_tests::wait;
use sluice_proto::v1::Hello;

const LIMITS: &str = "limits:\n  - bucket: \"acme\"\n    limit_rps: 10\n";
/// The default cap on one connection's streams.
const STREAMS_PER_CONNECTION: usize = 16;

/// The control plane with `LIMITS`, no Envoy.
fn control_plane_only() -> FleetOptions {
    FleetOptions::control_plane_only(LIMITS)
}

/// Every stream's first reply: `Ok` once served, else its status.
async fn first_replies(streams: &mut [FakeProxy]) -> Vec<Result<(), tonic::Status>> {
    let mut replies = Vec::with_capacity(streams.len());
    for stream in streams {
        replies.push(stream.first_reply(Duration::from_secs(20)).await.unwrap());
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_on_one_connection_are_refused_beyond_the_cap() {
    let fleet = Fleet::start(control_plane_only()).await.unwrap();
    let control_plane = &fleet.control_plane;
    let channel = fake_proxy::channel(control_plane.grpc_addr(), None)
        .await
        .unwrap();
    let mut streams = Vec::new();
    for i in 0..1_000 {
        streams.push(
            FakeProxy::open(&channel, fake_proxy::hello(&format!("flood-{i:04}")))
                .await
                .unwrap(),
        );
    }
    let replies = first_replies(&mut streams).await;
    let admin = control_plane.admin();
    let proxies_body = reqwest::get(format!("http://{}/v1/proxies", control_plane.admin_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let proxies = admin.proxies().await.unwrap();
    let exposition = admin.metrics().await.unwrap();

    let served = replies.iter().filter(|reply| reply.is_ok()).count();
    let refused: Vec<&tonic::Status> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
    let summary = format!(
        "served {served}, refused {}: first refusal {:?}\n/v1/proxies: {} bytes, {} connected\n/metrics: {} bytes",
        refused.len(),
        refused.first(),
        proxies_body.len(),
        proxies.connected,
        exposition.len()
    );
    println!("{summary}");
    assert_eq!(served, STREAMS_PER_CONNECTION, "{summary}");
    assert!(
        refused
            .iter()
            .all(|status| status.code() == tonic::Code::ResourceExhausted
                && status.message().contains("streams on this connection")),
        "{summary}"
    );
    assert_eq!(proxies.connected, STREAMS_PER_CONNECTION, "{summary}");
    assert!(proxies_body.len() < 8 * 1024, "{summary}");
    assert!(exposition.len() < 128 * 1024, "{summary}");
    assert_eq!(
        sample(
            &exposition,
            r#"sluice_streams_refused_total{reason="streams_per_connection"}"#
        ),
        (1_000 - STREAMS_PER_CONNECTION) as f64,
        "{exposition}"
    );
    // A served stream that ends frees its place on the connection.
    let served_at = replies.iter().position(Result::is_ok).unwrap();
    drop(streams.remove(served_at));
    let freed = wait::until(
        "a place freed by a closed stream to serve a new one",
        Duration::from_secs(5),
        Duration::from_millis(100),
        || async {
            let mut next = FakeProxy::open(&channel, fake_proxy::hello("flood-next")).await?;
            Ok(next
                .first_reply(Duration::from_secs(5))
                .await?
                .is_ok()
                .then_some(next))
        },
    )
    .await;
    freed.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_from_one_address_beyond_the_cap_are_closed() {
    let fleet = Fleet::start(control_plane_only().args(["--grpc-max-connections-per-ip", "4"]))
        .await
        .unwrap();
    let control_plane = &fleet.control_plane;
    let grpc = control_plane.grpc_addr();
    let mut held = Vec::new();
    for i in 0..4 {
        let mut proxy = FakeProxy::connect(grpc, &format!("edge-{i}"), None)
            .await
            .unwrap();
        proxy
            .first_reply(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap_or_else(|status| panic!("connection {i} is within the cap: {status:?}"));
        held.push(proxy);
    }
    // The fifth connection is closed as it is accepted: whether the client
    // notices at its handshake or at its first call, it is not served.
    let fifth = match FakeProxy::connect(grpc, "edge-4", None).await {
        Err(err) => format!("connect: {err:#}"),
        Ok(mut proxy) => match proxy.first_reply(Duration::from_secs(5)).await.unwrap() {
            Ok(()) => panic!("a fifth connection from 127.0.0.1 was served"),
            Err(status) => format!("stream: {status:?}"),
        },
    };
    println!("the fifth connection: {fifth}");
    let exposition = control_plane.admin().metrics().await.unwrap();
    assert!(
        sample(
            &exposition,
            r#"sluice_connections_refused_total{reason="per_ip"}"#
        ) >= 1.0,
        "{exposition}"
    );
    // A connection that closes makes room for another.
    drop(held.pop());
    let again = wait::until(
        "a new connection once one closed",
        Duration::from_secs(5),
        Duration::from_millis(200),
        || async {
            let Ok(mut proxy) = FakeProxy::connect(grpc, "edge-again", None).await else {
                return Ok(None);
            };
            Ok(proxy
                .first_reply(Duration::from_secs(5))
                .await?
                .is_ok()
                .then_some(proxy))
        },
    )
    .await;
    again.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mutual_tls_one_identitys_connections_beyond_the_cap_are_refused() {
    let fleet = Fleet::start(control_plane_only().mutual_tls().args([
        "--grpc-identity".to_owned(),
        format!("{}=rogue-*", certs::OTHER_IDENTITY),
        "--grpc-max-connections-per-identity".to_owned(),
        "2".to_owned(),
    ]))
    .await
    .unwrap();
    let (control_plane, certs) = (&fleet.control_plane, fleet.certs().unwrap());
    let grpc = control_plane.grpc_addr();
    let other = ClientTls {
        ca: &certs.path(certs::CA),
        cert: &certs.path(certs::OTHER_CERT),
        key: &certs.path(certs::OTHER_KEY),
    };
    let own = ClientTls {
        ca: &certs.path(certs::CA),
        cert: &certs.path(certs::CLIENT_CERT),
        key: &certs.path(certs::CLIENT_KEY),
    };
    let mut replies = Vec::new();
    let mut held = Vec::new();
    for i in 0..3 {
        let mut proxy = FakeProxy::connect(grpc, &format!("rogue-{i}"), Some(other))
            .await
            .unwrap();
        replies.push(proxy.first_reply(Duration::from_secs(5)).await.unwrap());
        held.push(proxy);
    }
    // Another identity is not held back by this one's connections.
    let mut edge = FakeProxy::connect(grpc, "edge-a", Some(own)).await.unwrap();
    let edge_reply = edge.first_reply(Duration::from_secs(5)).await.unwrap();
    let exposition = control_plane.admin().metrics().await.unwrap();
    println!("replies: {replies:?}\nedge: {edge_reply:?}");
    assert!(replies[0].is_ok() && replies[1].is_ok(), "{replies:?}");
    let third = replies[2]
        .as_ref()
        .expect_err("a third connection of one identity");
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    assert!(third.message().contains(certs::OTHER_IDENTITY), "{third:?}");
    edge_reply.expect("another identity's connection");
    assert_eq!(
        sample(
            &exposition,
            r#"sluice_streams_refused_total{reason="connections_per_identity"}"#
        ),
        1.0,
        "{exposition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_or_garbled_hello_is_refused_and_costs_nothing() {
    let fleet = Fleet::start(control_plane_only()).await.unwrap();
    let control_plane = &fleet.control_plane;
    let grpc = control_plane.grpc_addr();
    let huge = "x".repeat(4_000_000);
    let cases: Vec<(&str, Hello, &str)> = vec![
        (
            "a 4,000,000-byte proxy_id",
            Hello {
                proxy_id: huge.clone(),
                instance_id: 1,
                ..Hello::default()
            },
            "proxy_id_too_long",
        ),
        (
            "a newline in the proxy_id",
            Hello {
                proxy_id: "edge\nsluice: forged log line".to_owned(),
                instance_id: 2,
                ..Hello::default()
            },
            "proxy_id_characters",
        ),
        (
            "a 4,000,000-byte zone",
            Hello {
                proxy_id: "edge-zone".to_owned(),
                instance_id: 3,
                zone: huge.clone(),
                ..Hello::default()
            },
            "zone_too_long",
        ),
        (
            "a space in the zone",
            Hello {
                proxy_id: "edge-zone".to_owned(),
                instance_id: 4,
                zone: "eu west".to_owned(),
                ..Hello::default()
            },
            "zone_characters",
        ),
    ];
    let mut outcomes = Vec::new();
    for (what, hello, reason) in &cases {
        let mut proxy = FakeProxy::connect_with(grpc, hello.clone(), None)
            .await
            .unwrap();
        let reply = proxy.first_reply(Duration::from_secs(10)).await.unwrap();
        // Kept open until the views below are read.
        outcomes.push((*what, *reason, reply, proxy));
    }
    // What Istio and Envoy Gateway name their proxies (`--service-node`),
    // and a SPIFFE ID, are fine.
    let node_ids = [
        "sidecar~10.1.2.3~pod-abc-1.ns~ns.svc.cluster.local",
        "router~10.1.2.3~envoy-gw-xyz-5d8f7c9b4-abcde.envoy-gateway-system~envoy-gateway-system.svc.cluster.local",
        "sidecar~fd00:10:244::7~reviews-v1-6c8b6bc5f4-x7k2p.bookinfo~bookinfo.svc.cluster.local",
        "spiffe://cluster.local/ns/edge/sa/envoy",
        "rlqs@127.0.0.1:43210",
    ];
    let mut accepted = Vec::new();
    for (i, node_id) in node_ids.iter().enumerate() {
        let mut proxy = FakeProxy::connect_with(
            grpc,
            Hello {
                proxy_id: (*node_id).to_owned(),
                instance_id: 100 + i as u64,
                zone: "europe-west1-b".to_owned(),
                ..Hello::default()
            },
            None,
        )
        .await
        .unwrap();
        let reply = proxy.first_reply(Duration::from_secs(5)).await.unwrap();
        accepted.push((*node_id, reply, proxy));
    }
    let admin = control_plane.admin();
    let proxies_body = reqwest::get(format!("http://{}/v1/proxies", control_plane.admin_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exposition = admin.metrics().await.unwrap();
    let log = std::fs::read_to_string(control_plane.log_path()).unwrap_or_default();
    let replies: Vec<_> = outcomes
        .iter()
        .map(|(what, _, reply, _)| (*what, reply.as_ref().map_err(tonic::Status::code)))
        .collect();
    let summary = format!(
        "refusals: {replies:?}\n/v1/proxies: {} bytes\n/metrics: {} bytes\nlog: {} bytes",
        proxies_body.len(),
        exposition.len(),
        log.len()
    );
    println!("{summary}");
    for (what, reason, reply, _) in &outcomes {
        let status = reply
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{what} was accepted\n{summary}"));
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        assert!(status.message().len() < 512, "{what}: a short status");
        let series = format!("sluice_streams_refused_total{{reason=\"{reason}\"}}");
        assert!(
            sample(&exposition, &series) >= 1.0,
            "{what}: {series}\n{exposition}"
        );
    }
    for (node_id, reply, _) in &accepted {
        assert!(reply.is_ok(), "{node_id}: {reply:?}");
        assert!(proxies_body.contains(node_id), "{node_id}\n{proxies_body}");
    }
    assert!(proxies_body.len() < 8 * 1024, "{summary}");
    assert!(exposition.len() < 128 * 1024, "{summary}");
    assert!(!exposition.contains("xxxxxxxxxxxxxxxx"), "{summary}");
    assert!(log.len() < 256 * 1024, "{summary}");
    assert!(
        !log.lines().any(|line| line.starts_with("sluice: forged")),
        "{log}"
    );
}
