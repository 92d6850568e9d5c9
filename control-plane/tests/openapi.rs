//! The OpenAPI document describes exactly the routes the router serves.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_control_plane::admin::{OPENAPI_JSON, routes};
use sluice_control_plane::{AppState, Config, Settings, router};
use tower::ServiceExt;

fn document() -> Value {
    serde_json::from_str(OPENAPI_JSON).unwrap()
}

#[test]
fn every_route_is_documented_and_every_documented_route_exists() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect();
    let routed: BTreeSet<(String, String)> = routes()
        .into_iter()
        .map(|(method, path)| (method.to_string(), path.to_owned()))
        .collect();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty(),
        "not in openapi.json: {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "in openapi.json but not routed: {unrouted:?}"
    );
}

#[test]
fn every_reference_resolves_and_every_path_parameter_is_declared() {
    let doc = document();
    fn walk(value: &Value, doc: &Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    let pointer = target.strip_prefix('#').unwrap();
                    assert!(doc.pointer(pointer).is_some(), "dangling {target}");
                }
                map.values().for_each(|v| walk(v, doc));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, doc)),
            _ => {}
        }
    }
    walk(&doc, &doc);
    for (path, item) in doc["paths"].as_object().unwrap() {
        let wanted: BTreeSet<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        for (method, op) in item.as_object().unwrap() {
            // Path parameters only (header parameters such as If-Match are
            // shared components, referenced by `$ref`).
            let declared: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| match p["$ref"].as_str() {
                            Some(target) => doc.pointer(target.trim_start_matches('#')).unwrap(),
                            None => p,
                        })
                        .filter(|p| p["in"] == "path")
                        .map(|p| p["name"].as_str().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(declared, wanted, "{method} {path}");
            assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()));
        }
    }
}

#[tokio::test]
async fn the_document_is_served() {
    let state = AppState::new(Settings::from_config(&Config::default(), None));
    let response = router(state)
        .oneshot(
            Request::get("/v1/openapi.json")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let served: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(served, document());
}
