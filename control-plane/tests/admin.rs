//! The admin API through `router()` directly, without a socket.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_control_plane::{AppState, Config, Settings, router};
use tower::ServiceExt;

fn app() -> (AppState, Router) {
    let config = Config::from_yaml(
        "limits:\n  - bucket: acme\n    limit_rps: 200\n  - pattern: \"free-*\"\n    limit_rps: 5\n",
        "test.yaml",
    )
    .unwrap();
    let state = AppState::new(Settings::from_config(&config, None));
    let router = router(state.clone());
    (state, router)
}

async fn send(
    router: &Router,
    method: Method,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("not JSON: {bytes:?}"))
    };
    (status, content_type, json)
}

async fn limits(router: &Router) -> Value {
    send(router, Method::GET, "/v1/limits", None).await.2
}

fn assert_problem(
    status: StatusCode,
    content_type: Option<&str>,
    body: &Value,
    expected: StatusCode,
) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(content_type, Some("application/problem+json"));
    assert_eq!(body["status"], expected.as_u16());
    assert_eq!(body["type"], "about:blank");
    assert_eq!(body["title"], expected.canonical_reason().unwrap());
    assert!(!body["detail"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn put_then_get_then_delete() {
    let (state, router) = app();
    let (status, _, body) = send(
        &router,
        Method::PUT,
        "/v1/limits/beta",
        Some(r#"{"limit_rps": 150}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"bucket": "beta", "limit_rps": 150.0}));
    assert_eq!(
        state.policy().limits.limit_for("beta").unwrap().get(),
        150.0
    );

    // Replacing an existing limit, and a bucket key containing the default
    // separator, percent-encoded in the path.
    let (status, _, _) = send(
        &router,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": 0}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = send(
        &router,
        Method::PUT,
        "/v1/limits/acme%2Fapi",
        Some(r#"{"limit_rps": 1.5}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["bucket"], "acme/api");

    assert_eq!(
        limits(&router).await,
        json!({
            "default_limit_rps": null,
            "limits": [
                {"bucket": "acme", "limit_rps": 0.0},
                {"bucket": "acme/api", "limit_rps": 1.5},
                {"bucket": "beta", "limit_rps": 150.0},
                {"pattern": "free-*", "limit_rps": 5.0},
            ],
        })
    );

    let (status, _, body) = send(&router, Method::DELETE, "/v1/limits/beta", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(body, Value::Null);
    assert_eq!(state.policy().limits.limit_for("beta"), None);
}

#[tokio::test]
async fn bad_bodies_are_problems_and_change_nothing() {
    let (_, router) = app();
    let before = limits(&router).await;
    let cases: &[(&str, StatusCode)] = &[
        ("{", StatusCode::BAD_REQUEST),
        ("", StatusCode::BAD_REQUEST),
        (r#"{"limit_rps": -1}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"limit_rps": 2e9}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"limit_rps": "100"}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"limit_rps": null}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (
            r#"{"limit_rps": 5, "burst": 1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for &(body, expected) in cases {
        let (status, content_type, problem) =
            send(&router, Method::PUT, "/v1/limits/acme", Some(body)).await;
        assert_problem(status, content_type.as_deref(), &problem, expected);
    }
    // Out of f64 range: rejected by the JSON parser.
    let (status, content_type, problem) = send(
        &router,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": 1e400}"#),
    )
    .await;
    assert!(status.is_client_error());
    assert_problem(status, content_type.as_deref(), &problem, status);
    assert_eq!(limits(&router).await, before);
}

#[tokio::test]
async fn negative_limit_detail_says_why() {
    let (_, router) = app();
    let (_, _, problem) = send(
        &router,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": -1}"#),
    )
    .await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("must be a finite number >= 0"), "{detail}");
}

#[tokio::test]
async fn oversized_body_is_refused() {
    let (_, router) = app();
    let padding = " ".repeat(70 * 1024);
    let body = format!(r#"{{"limit_rps": 5{padding}}}"#);
    let (status, content_type, problem) =
        send(&router, Method::PUT, "/v1/limits/acme", Some(&body)).await;
    assert_problem(
        status,
        content_type.as_deref(),
        &problem,
        StatusCode::PAYLOAD_TOO_LARGE,
    );
    assert_eq!(limits(&router).await["limits"][0]["limit_rps"], 200.0);
}

#[tokio::test]
async fn wrong_content_type_is_a_problem() {
    let (_, router) = app();
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/v1/limits/acme")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(r#"{"limit_rps": 5}"#))
        .unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
}

#[tokio::test]
async fn unknown_things_are_problems() {
    let (_, router) = app();
    let (status, content_type, problem) =
        send(&router, Method::DELETE, "/v1/limits/nobody", None).await;
    assert_problem(
        status,
        content_type.as_deref(),
        &problem,
        StatusCode::NOT_FOUND,
    );
    // A pattern is not an exact limit and cannot be deleted by name.
    let (status, _, _) = send(&router, Method::DELETE, "/v1/limits/free-*", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, content_type, problem) = send(&router, Method::GET, "/v2/nothing", None).await;
    assert_problem(
        status,
        content_type.as_deref(),
        &problem,
        StatusCode::NOT_FOUND,
    );

    let (status, content_type, problem) =
        send(&router, Method::POST, "/v1/limits/acme", Some("{}")).await;
    assert_problem(
        status,
        content_type.as_deref(),
        &problem,
        StatusCode::METHOD_NOT_ALLOWED,
    );

    let long = "x".repeat(2000);
    let (status, content_type, problem) = send(
        &router,
        Method::PUT,
        &format!("/v1/limits/{long}"),
        Some(r#"{"limit_rps": 1}"#),
    )
    .await;
    assert_problem(
        status,
        content_type.as_deref(),
        &problem,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
}

#[tokio::test]
async fn buckets_view_shape() {
    let (state, router) = app();
    let (status, content_type, body) = send(&router, Method::GET, "/v1/buckets", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type.as_deref(), Some("application/json"));
    assert_eq!(
        body,
        json!({"epoch": state.epoch(), "control_interval_ms": 500, "buckets": []})
    );
}

async fn get_metrics(router: &Router) -> String {
    let request = Request::get("/metrics").body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        sluice_control_plane::metrics::CONTENT_TYPE
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn metrics_show_what_the_control_loop_decided() {
    use sluice_control_plane::Controller;
    use sluice_control_plane::fleet::StreamId;
    use sluice_control_plane::serve::control_loop::step;
    use sluice_proto::v1::{BucketCount, Report};

    let (state, router) = app();
    let text = get_metrics(&router).await;
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("\nsluice_connected_proxies 0\n"), "{text}");
    assert!(
        !text.contains("sluice_bucket_offered_rps{"),
        "no buckets yet: {text}"
    );

    // 600 requests in one second for a bucket limited to 200.
    state.fleet().connect("envoy-a", 1, StreamId(1));
    let report = Report {
        sequence: 0,
        window_ms: 1000,
        directive_age_ms: None,
        upstream: Vec::new(),
        buckets: vec![BucketCount {
            bucket: "acme".to_owned(),
            offered: 600,
            admitted: 600,
            ..Default::default()
        }],
    };
    state
        .fleet()
        .report("envoy-a", StreamId(1), &report)
        .unwrap();
    let mut controller = Controller::default();
    step(&state, &mut controller);
    let text = get_metrics(&router).await;
    for line in [
        "sluice_bucket_offered_rps{bucket=\"acme\"} 600.0",
        "sluice_bucket_limit_rps{bucket=\"acme\"} 200.0",
        "sluice_bucket_drop_ratio{bucket=\"acme\"} 0.6666666666666666",
        "sluice_directive_batches_published_total 1",
        "sluice_control_loop_tick_duration_seconds_count 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
    }

    let (status, content_type, body) = send(&router, Method::POST, "/metrics", None).await;
    assert_problem(
        status,
        content_type.as_deref(),
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
    );
}
