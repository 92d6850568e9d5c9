//! The configuration replicas share through a real Redis: a write on one
//! replica is read back from another, two writes under the same `If-Match`
//! let exactly one through, a store outage answers 503 and changes
//! nothing, and `sluice config export|import` move it to and from a file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_integration_tests::paths;
use sluice_integration_tests::replicas::{ReplicaSet, ReplicaSetOptions};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 150
"#;

struct Reply {
    status: StatusCode,
    etag: Option<String>,
    content_type: Option<String>,
    body: Value,
}

async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    if_match: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut request = client.request(method, url);
    if let Some(tag) = if_match {
        request = request.header("if-match", tag);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (status, etag, content_type) = (response.status(), header("etag"), header("content-type"));
    let bytes = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        etag,
        content_type,
        body,
    }
}

fn limit_url(set: &ReplicaSet, replica: usize, bucket: &str) -> String {
    format!(
        "http://{}/v1/limits/{bucket}",
        set.replicas[replica].admin_addr()
    )
}

/// Reads `bucket`'s limit on `replica` until it is `want`, for up to 2 s.
async fn wait_for_limit(
    client: &reqwest::Client,
    set: &ReplicaSet,
    replica: usize,
    bucket: &str,
    want: f64,
) -> Reply {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let reply = send(
            client,
            reqwest::Method::GET,
            limit_url(set, replica, bucket),
            None,
            None,
        )
        .await;
        if reply.body["limit_rps"] == json!(want) || tokio::time::Instant::now() >= deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn replicas_share_one_versioned_configuration() {
    let set = ReplicaSet::start(ReplicaSetOptions::new(LIMITS, 2, 0))
        .await
        .unwrap();
    let client = reqwest::Client::new();

    // A write on r0 is read back from r1 (within one control interval of
    // r1's; 2 s bounds the wait), with the same entity tag.
    let written = send(
        &client,
        reqwest::Method::PUT,
        limit_url(&set, 0, "acme"),
        None,
        Some(json!({"limit_rps": 300})),
    )
    .await;
    assert_eq!(written.status, StatusCode::OK, "{:?}", written.body);
    let read = wait_for_limit(&client, &set, 1, "acme", 300.0).await;
    assert_eq!(
        read.body["limit_rps"],
        json!(300.0),
        "r1 did not see r0's write"
    );
    assert_eq!(read.etag, written.etag);

    // Two writes under the same If-Match, one on each replica, at once:
    // exactly one wins, the other gets 412 and changes nothing.
    let tag = read.etag.clone().unwrap();
    let (first, second) = tokio::join!(
        send(
            &client,
            reqwest::Method::PUT,
            limit_url(&set, 0, "acme"),
            Some(&tag),
            Some(json!({"limit_rps": 400})),
        ),
        send(
            &client,
            reqwest::Method::PUT,
            limit_url(&set, 1, "acme"),
            Some(&tag),
            Some(json!({"limit_rps": 500})),
        ),
    );
    let mut statuses = [first.status, second.status];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::PRECONDITION_FAILED],
        "{:?} / {:?}",
        first.body,
        second.body
    );
    let winner = if first.status == StatusCode::OK {
        400.0
    } else {
        500.0
    };
    for replica in 0..2 {
        let read = wait_for_limit(&client, &set, replica, "acme", winner).await;
        assert_eq!(read.body["limit_rps"], json!(winner), "replica {replica}");
    }

    // A limit written through r1 drives r0's buckets too: the policy, not
    // only the admin view, follows the store.
    let limits: Value = client
        .get(format!("http://{}/v1/limits", set.replicas[0].admin_addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        limits["limits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|rule| rule["bucket"] == "acme" && rule["limit_rps"] == json!(winner)),
        "{limits}"
    );
}

#[tokio::test]
async fn a_store_outage_fails_writes_cleanly_and_export_import_round_trip() {
    let mut set = ReplicaSet::start(ReplicaSetOptions::new(LIMITS, 2, 0))
        .await
        .unwrap();
    let client = reqwest::Client::new();

    set.redis.kill().unwrap();
    let refused = send(
        &client,
        reqwest::Method::PUT,
        limit_url(&set, 0, "acme"),
        None,
        Some(json!({"limit_rps": 999})),
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        refused.body
    );
    assert_eq!(
        refused.content_type.as_deref(),
        Some("application/problem+json")
    );
    for replica in 0..2 {
        let read = send(
            &client,
            reqwest::Method::GET,
            limit_url(&set, replica, "acme"),
            None,
            None,
        )
        .await;
        assert_eq!(
            read.body["limit_rps"],
            json!(150.0),
            "replica {replica} changed"
        );
    }

    // Back, empty: the next write stores the whole configuration again.
    set.redis.restart().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let written = loop {
        let reply = send(
            &client,
            reqwest::Method::PUT,
            limit_url(&set, 0, "beta"),
            None,
            Some(json!({"limit_rps": 7})),
        )
        .await;
        if reply.status == StatusCode::OK || tokio::time::Instant::now() >= deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(written.status, StatusCode::OK, "{:?}", written.body);
    let read = wait_for_limit(&client, &set, 1, "beta", 7.0).await;
    assert_eq!(read.body["limit_rps"], json!(7.0));

    // Export, edit, import: both replicas apply the imported file.
    let sluice = paths::sluice_bin().unwrap();
    let store = set.redis.url();
    let exported = std::process::Command::new(&sluice)
        .args(["config", "export", "--store", &store])
        .output()
        .unwrap();
    assert!(exported.status.success(), "{exported:?}");
    let text = String::from_utf8(exported.stdout).unwrap();
    assert!(text.contains("acme") && text.contains("beta"), "{text}");

    let bad = set.dir().join("bad-limits.yaml");
    std::fs::write(&bad, "limits:\n  - bucket: acme\n    limit_rps: -5\n").unwrap();
    let refused = std::process::Command::new(&sluice)
        .args(["config", "import", "--store", &store])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("bad-limits.yaml") && stderr.contains("limit_rps"),
        "{stderr}"
    );

    let good = set.dir().join("good-limits.yaml");
    std::fs::write(&good, text.replace("limit_rps: 7.0", "limit_rps: 70.0")).unwrap();
    let imported = std::process::Command::new(&sluice)
        .args(["config", "import", "--store", &store])
        .arg(&good)
        .output()
        .unwrap();
    assert!(imported.status.success(), "{imported:?}");
    for replica in 0..2 {
        let read = wait_for_limit(&client, &set, replica, "beta", 70.0).await;
        assert_eq!(read.body["limit_rps"], json!(70.0), "replica {replica}");
        assert_eq!(
            wait_for_limit(&client, &set, replica, "acme", 150.0)
                .await
                .body["limit_rps"],
            json!(150.0)
        );
    }
}
