//! Entity tags and `If-Match` on every admin resource, in the
//! single-process default: a lost update answers 412 with a problem and
//! changes nothing; the tag follows the content. Adaptive specs are
//! written through the API too, validated like the limits file.

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
use serde_json::Value;
use sluice_control_plane::{AppState, Config, Settings, router};
use tower::ServiceExt;

fn app() -> Router {
    let config = Config::from_yaml(
        "limits:\n  - bucket: acme\n    limit_rps: 200\ntenants:\n  gold:\n    weight: 4\n",
        "test.yaml",
    )
    .unwrap();
    router(AppState::new(Settings::from_config(&config, None)))
}

struct Reply {
    status: StatusCode,
    etag: Option<String>,
    content_type: Option<String>,
    body: Value,
}

async fn send(
    router: &Router,
    method: Method,
    uri: &str,
    if_match: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(tag) = if_match {
        request = request.header(header::IF_MATCH, tag);
    }
    let request = request
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let header_text = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &header::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let (status, etag, content_type) = (
        response.status(),
        header_text(header::ETAG),
        header_text(header::CONTENT_TYPE),
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Reply {
        status,
        etag,
        content_type,
        body,
    }
}

fn assert_precondition_failed(reply: &Reply) {
    assert_eq!(
        reply.status,
        StatusCode::PRECONDITION_FAILED,
        "{:?}",
        reply.body
    );
    assert_eq!(
        reply.content_type.as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(reply.body["status"], 412);
}

#[tokio::test]
async fn a_limit_is_written_only_under_its_current_tag() {
    let app = app();
    let read = send(&app, Method::GET, "/v1/limits/acme", None, None).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body["limit_rps"], 200.0);
    let tag = read.etag.unwrap();

    let set = send(
        &app,
        Method::PUT,
        "/v1/limits/acme",
        Some(&tag),
        Some(r#"{"limit_rps": 300}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK);
    let new_tag = set.etag.unwrap();
    assert_ne!(new_tag, tag);

    // A second writer still holding the first tag lost the race.
    let lost = send(
        &app,
        Method::PUT,
        "/v1/limits/acme",
        Some(&tag),
        Some(r#"{"limit_rps": 50}"#),
    )
    .await;
    assert_precondition_failed(&lost);
    assert!(
        lost.body["detail"].as_str().unwrap().contains(&new_tag),
        "{:?}",
        lost.body
    );
    let after = send(&app, Method::GET, "/v1/limits/acme", None, None).await;
    assert_eq!(after.body["limit_rps"], 300.0, "nothing changed");
    assert_eq!(after.etag.as_deref(), Some(new_tag.as_str()));

    // Delete under a stale tag: refused; under the current one: done.
    let stale_delete = send(&app, Method::DELETE, "/v1/limits/acme", Some(&tag), None).await;
    assert_precondition_failed(&stale_delete);
    let delete = send(
        &app,
        Method::DELETE,
        "/v1/limits/acme",
        Some(&new_tag),
        None,
    )
    .await;
    assert_eq!(delete.status, StatusCode::NO_CONTENT);
    assert_eq!(
        send(&app, Method::GET, "/v1/limits/acme", None, None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // `If-Match: *` needs the resource to exist: creating is refused.
    let create = send(
        &app,
        Method::PUT,
        "/v1/limits/acme",
        Some("*"),
        Some(r#"{"limit_rps": 10}"#),
    )
    .await;
    assert_precondition_failed(&create);
    // Without the header, writes go ahead as before.
    let plain = send(
        &app,
        Method::PUT,
        "/v1/limits/acme",
        None,
        Some(r#"{"limit_rps": 10}"#),
    )
    .await;
    assert_eq!(plain.status, StatusCode::OK);
    // A malformed header is a bad request, not a write.
    let malformed = send(
        &app,
        Method::PUT,
        "/v1/limits/acme",
        Some("no-quotes"),
        Some(r#"{"limit_rps": 99}"#),
    )
    .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    let read = send(&app, Method::GET, "/v1/limits/acme", None, None).await;
    assert_eq!(read.body["limit_rps"], 10.0);
}

#[tokio::test]
async fn tenants_modes_and_overrides_carry_tags_too() {
    let app = app();
    let tenant = send(&app, Method::GET, "/v1/tenants/gold", None, None).await;
    assert_eq!(tenant.status, StatusCode::OK);
    assert_eq!(tenant.body["weight"], 4.0);
    let tenant_tag = tenant.etag.unwrap();
    let changed = send(
        &app,
        Method::PUT,
        "/v1/tenants/gold",
        Some(&tenant_tag),
        Some(r#"{"weight": 2}"#),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK);
    let stale = send(
        &app,
        Method::PUT,
        "/v1/tenants/gold",
        Some(&tenant_tag),
        Some(r#"{"weight": 8}"#),
    )
    .await;
    assert_precondition_failed(&stale);
    let stale_delete = send(
        &app,
        Method::DELETE,
        "/v1/tenants/gold",
        Some(&tenant_tag),
        None,
    )
    .await;
    assert_precondition_failed(&stale_delete);

    // The kill switch and the canary are part of the modes resource.
    let modes = send(&app, Method::GET, "/v1/modes", None, None).await;
    let modes_tag = modes.etag.unwrap();
    let on = send(&app, Method::PUT, "/v1/kill-switch", Some(&modes_tag), None).await;
    assert_eq!(on.status, StatusCode::OK);
    assert_eq!(on.body["kill_switch"], true);
    let canary = send(
        &app,
        Method::PUT,
        "/v1/canary",
        Some(&modes_tag),
        Some(r#"{"canary_fraction": 0.5}"#),
    )
    .await;
    assert_precondition_failed(&canary);
    let off = send(
        &app,
        Method::DELETE,
        "/v1/kill-switch",
        Some(on.etag.as_deref().unwrap()),
        None,
    )
    .await;
    assert_eq!(off.status, StatusCode::OK);
    // Back to the same content: back to the same tag.
    assert_eq!(off.etag.as_deref(), Some(modes_tag.as_str()));

    let overrides = send(&app, Method::GET, "/v1/overrides", None, None).await;
    let overrides_tag = overrides.etag.unwrap();
    let set = send(
        &app,
        Method::PUT,
        "/v1/overrides/limits/acme",
        Some(&overrides_tag),
        Some(r#"{"limit_rps": 20, "ttl_s": 60}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK);
    let stale = send(
        &app,
        Method::PUT,
        "/v1/overrides/tenants/gold",
        Some(&overrides_tag),
        Some(r#"{"weight": 1, "ttl_s": 60}"#),
    )
    .await;
    assert_precondition_failed(&stale);
    let listed = send(&app, Method::GET, "/v1/overrides", None, None).await;
    assert!(
        listed.body["tenants"]
            .as_object()
            .is_none_or(|t| t.is_empty())
    );
}

#[tokio::test]
async fn an_adaptive_spec_is_written_read_and_removed_under_its_tag() {
    use sluice_control_plane::Controller;
    use sluice_control_plane::serve::control_loop::step;

    let config = Config::from_yaml(
        "limits:\n  - bucket: acme\n    limit_rps: 200\n",
        "test.yaml",
    )
    .unwrap();
    let state = AppState::new(Settings::from_config(&config, None));
    let app = router(state.clone());
    let missing = send(&app, Method::GET, "/v1/adaptive/acme", None, None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // Bad bodies: a problem naming what is wrong, nothing changed.
    for (body, says) in [
        (r#"{"min_rps": 50}"#, "max_rps"),
        (
            r#"{"min_rps": 50, "max_rps": 10, "signal": "errors"}"#,
            "must be above min_rps",
        ),
        (r#"{"min_rps": 5, "max_rps": 10}"#, "target_p99_ms"),
        (
            r#"{"min_rps": 5, "max_rps": 10, "signal": "errors", "speed": 1}"#,
            "speed",
        ),
        (
            r#"{"bucket": "other", "min_rps": 5, "max_rps": 10, "signal": "errors"}"#,
            "path's bucket",
        ),
        (
            r#"{"min_rps": 5, "max_rps": 10, "signal": "errors", "decrease_factor": 1.5}"#,
            "decrease_factor",
        ),
    ] {
        let reply = send(&app, Method::PUT, "/v1/adaptive/acme", None, Some(body)).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {:?}",
            reply.body
        );
        assert_eq!(
            reply.content_type.as_deref(),
            Some("application/problem+json")
        );
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{body}: {detail}");
    }
    // `If-Match: *` needs the spec to exist: creating is refused.
    let refused = send(
        &app,
        Method::PUT,
        "/v1/adaptive/acme",
        Some("*"),
        Some(r#"{"signal": "errors", "min_rps": 20, "max_rps": 400}"#),
    )
    .await;
    assert_precondition_failed(&refused);
    let missing = send(&app, Method::GET, "/v1/adaptive/acme", None, None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    let set = send(
        &app,
        Method::PUT,
        "/v1/adaptive/acme",
        None,
        Some(r#"{"signal": "errors", "min_rps": 20, "max_rps": 400}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{:?}", set.body);
    assert_eq!(set.body["bucket"], "acme");
    assert_eq!(set.body["max_error_ratio"], 0.05);
    assert_eq!(set.body["increase_rps"], 19.0);
    let tag = set.etag.unwrap();

    // The control loop picks it up: the bucket starts from its limit.
    step(&state, &mut Controller::default());
    let read = send(&app, Method::GET, "/v1/adaptive/acme", None, None).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.etag.as_deref(), Some(tag.as_str()));
    assert_eq!(read.body["spec"]["max_rps"], 400.0);
    assert_eq!(read.body["status"]["limit_rps"], 200.0);
    assert_eq!(read.body["status"]["reason"], "no signal: holding");

    // A writer holding an old tag loses; the spec is as it was.
    let changed = send(
        &app,
        Method::PUT,
        "/v1/adaptive/acme",
        Some(&tag),
        Some(r#"{"signal": "errors", "min_rps": 20, "max_rps": 300}"#),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK);
    let lost = send(&app, Method::DELETE, "/v1/adaptive/acme", Some(&tag), None).await;
    assert_precondition_failed(&lost);
    let read = send(&app, Method::GET, "/v1/adaptive/acme", None, None).await;
    assert_eq!(read.body["spec"]["max_rps"], 300.0);

    let removed = send(
        &app,
        Method::DELETE,
        "/v1/adaptive/acme",
        changed.etag.as_deref(),
        None,
    )
    .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    step(&state, &mut Controller::default());
    let list = send(&app, Method::GET, "/v1/adaptive", None, None).await;
    assert_eq!(list.body["buckets"], Value::Array(Vec::new()));
    let again = send(&app, Method::DELETE, "/v1/adaptive/acme", None, None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
}
