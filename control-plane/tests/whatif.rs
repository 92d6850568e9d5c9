//! `POST /v1/whatif` through `router()`: a proposed limit replayed over
//! recorded fleet totals, without changing anything.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_control_plane::fleet::health::UpstreamHealth;
use sluice_control_plane::fleet::{BucketLoad, BucketTraffic, CellLoad, FleetLoad};
use sluice_control_plane::{AppState, Config, Settings, router};
use sluice_core::Priority;
use tower::ServiceExt;

fn cell(priority: Priority, offered: f64) -> CellLoad {
    CellLoad {
        tenant: Arc::from(""),
        priority,
        load: BucketLoad {
            offered_rps: offered,
            admitted_rps: offered,
            proxies_reporting: 2,
            stale_share: 0.0,
            requests_rps: 0.0,
        },
        shadow_dropped_rps: 0.0,
        charges: None,
    }
}

async fn post(router: &axum::Router, uri: &str, body: &str) -> (StatusCode, String, Value) {
    let request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        serde_json::from_slice(&bytes).unwrap(),
    )
}

#[tokio::test]
async fn a_proposed_limit_is_replayed_over_the_recorded_minutes_and_changes_nothing() {
    let config = Config::from_yaml("limits: []\n", "test.yaml").unwrap();
    let state = AppState::new(Settings::from_config(&config, None));
    // 20 s at 300 rps (100 CRITICAL, 200 BULK), all admitted: no limit yet;
    // the upstream answered half of the sampled requests with a 5xx.
    let failing = HashMap::from([(
        "acme".to_owned(),
        UpstreamHealth {
            responses: 100,
            errors: 50,
            ..UpstreamHealth::default()
        },
    )]);
    for _ in 0..40 {
        let mut bucket = BucketTraffic::from_cells(
            "acme",
            vec![cell(Priority::Critical, 100.0), cell(Priority::Bulk, 200.0)],
        );
        bucket.load.proxies_reporting = 2;
        state.record_history(&FleetLoad::new(vec![bucket]), &failing);
    }
    let app = router(state.clone());

    let proposal = json!({"limits": [{"bucket": "acme", "limit_rps": 150}]}).to_string();
    let (status, _, whatif) = post(&app, "/v1/whatif", &proposal).await;
    assert_eq!(status, StatusCode::OK, "{whatif}");
    assert_eq!(whatif["intervals"], 40);
    let acme = &whatif["buckets"][0];
    assert_eq!(acme["bucket"], "acme");
    assert_eq!(acme["limit_rps"], 150.0);
    let admitted = acme["would_admit_rps"].as_f64().unwrap();
    assert!((admitted - 150.0).abs() < 15.0, "{acme}");
    assert_eq!(acme["cells"][0]["priority"], "critical");
    assert!(
        acme["cells"][0]["would_drop_rps"].as_f64().unwrap() < 0.01,
        "{acme}"
    );
    assert_eq!(whatif["critical_dropped"], false);

    // The last 5 s only; a limit under the CRITICAL traffic is flagged.
    let tight = json!({"limits": [{"bucket": "acme", "limit_rps": 50}]}).to_string();
    let (status, _, whatif) = post(&app, "/v1/whatif?seconds=5", &tight).await;
    assert_eq!(status, StatusCode::OK, "{whatif}");
    assert_eq!(whatif["intervals"], 10);
    assert_eq!(whatif["critical_dropped"], true);

    // A bad proposal names its field; nothing changed either way.
    let bad = json!({"limits": [{"bucket": "acme", "limit_rps": -1}]}).to_string();
    let (status, content_type, problem) = post(&app, "/v1/whatif", &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(content_type, "application/problem+json");
    assert!(
        problem["detail"].as_str().unwrap().contains("limit_rps"),
        "{problem}"
    );
    // An adaptive spec moves on the recorded signals: with half the
    // answers 5xx the limit falls from its maximum, within its bounds.
    let adaptive = json!({"adaptive": [{"bucket": "acme", "signal": "errors", "min_rps": 10, "max_rps": 100}]})
        .to_string();
    let (status, _, whatif) = post(&app, "/v1/whatif", &adaptive).await;
    assert_eq!(status, StatusCode::OK, "{whatif}");
    let path = &whatif["buckets"][0]["adaptive"];
    let (first, min, last) = (
        path["first_rps"].as_f64().unwrap(),
        path["min_rps"].as_f64().unwrap(),
        path["last_rps"].as_f64().unwrap(),
    );
    assert!(first <= 100.0 && last < first && min >= 10.0, "{whatif}");
    assert!(state.policy().adaptive.is_empty(), "no spec was set");
    let (status, _, _) = post(&app, "/v1/whatif?seconds=-2", &proposal).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        state.policy().limits.limit_for("acme"),
        None,
        "no limit was set"
    );
}
