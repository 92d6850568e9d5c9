//! Admin API writes: validation, effect on the shared policy, persistence
//! to the limits file, overrides and authentication.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_control_plane::admin::auth::{AuthPolicy, Token};
use sluice_control_plane::config::live::LiveConfig;
use sluice_control_plane::config::policy::Mode;
use sluice_control_plane::types::LimitRps;
use sluice_control_plane::{
    Admin, AppState, Config, Listeners, RunOptions, Settings, admin_router,
};
use tower::ServiceExt;

const LIMITS: &str = "\
# A comment the control plane will not keep.
default_limit_rps: 1000
limits:
  - bucket: acme
    limit_rps: 200
  - pattern: \"free-*\"
    limit_rps: 5
tenants:
  gold:
    weight: 4
";

struct Fixture {
    dir: PathBuf,
    file: PathBuf,
    state: AppState,
    live: Arc<LiveConfig>,
    router: Router,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str, auth: AuthPolicy) -> Fixture {
    let dir = std::env::temp_dir().join(format!("sluice-admin-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.yaml");
    std::fs::write(&file, LIMITS).unwrap();
    let config = Config::from_yaml(LIMITS, "limits.yaml").unwrap();
    let state = AppState::new(Settings::from_config(&config, None));
    let live = Arc::new(LiveConfig::with_file(
        state.clone(),
        config,
        file.clone(),
        LIMITS.as_bytes().to_vec(),
    ));
    let router = admin_router(Admin::new(Arc::clone(&live), auth));
    Fixture {
        dir,
        file,
        state,
        live,
        router,
    }
}

async fn send_as(
    router: &Router,
    token: Option<&str>,
    method: Method,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
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

async fn send(
    router: &Router,
    method: Method,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let (status, _, json) = send_as(router, None, method, uri, body).await;
    (status, json)
}

fn file_config(f: &Fixture) -> Config {
    Config::from_file(&f.file).unwrap()
}

/// The exact limit in force for `bucket` (overrides included), as text:
/// `200 rps` or `1200000 tokens/minute`.
fn exact_limit(limits: &sluice_control_plane::config::limits::LimitTable, bucket: &str) -> String {
    limits
        .rules()
        .into_iter()
        .find(|rule| {
            rule.selector
                == sluice_control_plane::config::limits::Selector::Bucket(bucket.to_owned())
        })
        .map(|rule| rule.limit.to_string())
        .unwrap_or_default()
}

fn assert_problem(status: StatusCode, content_type: Option<&str>, body: &Value) {
    assert!(status.is_client_error(), "{status}: {body}");
    assert_eq!(content_type, Some("application/problem+json"), "{body}");
    assert_eq!(body["status"], status.as_u16());
    assert!(!body["detail"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn limit_writes_are_persisted_and_survive_a_restart() {
    let f = fixture("limits", AuthPolicy::default());
    let (status, _) = send(
        &f.router,
        Method::PUT,
        "/v1/limits/beta",
        Some(r#"{"limit_rps": 150}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(&f.router, Method::DELETE, "/v1/limits/acme", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let text = std::fs::read_to_string(&f.file).unwrap();
    assert!(text.starts_with("# Sluice limits file."), "{text}");
    assert!(!text.contains("A comment"), "comments are not preserved");
    let persisted = file_config(&f);
    assert_eq!(persisted, f.live.config());
    // A restart builds its policy from the file alone.
    let restarted = persisted.policy();
    assert_eq!(restarted, *f.state.policy());
    assert_eq!(restarted.limits.limit_for("beta").unwrap().get(), 150.0);
    assert_eq!(restarted.limits.limit_for("acme").unwrap().get(), 1000.0);
    assert_eq!(restarted.limits.limit_for("free-x").unwrap().get(), 5.0);
    assert_eq!(restarted.tenants.policy_for("gold").weight.get(), 4.0);
    // Nothing left behind but the file itself.
    assert_eq!(std::fs::read_dir(&f.dir).unwrap().count(), 1);
}

#[tokio::test]
async fn tenants_put_get_delete() {
    let f = fixture("tenants", AuthPolicy::default());
    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/tenants/silver",
        Some(r#"{"weight": 2, "min_floor_rps": 10}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"tenant": "silver", "weight": 2.0, "burst": 1.0, "min_floor_rps": 10.0})
    );
    let (_, body) = send(&f.router, Method::GET, "/v1/tenants", None).await;
    assert_eq!(body["tenants"]["silver"]["weight"], 2.0);
    assert_eq!(body["tenants"]["gold"]["weight"], 4.0);
    assert_eq!(
        f.state
            .policy()
            .tenants
            .policy_for("silver")
            .min_floor_rps
            .get(),
        10.0
    );
    assert_eq!(
        file_config(&f).tenants.policy_for("silver").weight.get(),
        2.0
    );

    let (status, _) = send(&f.router, Method::DELETE, "/v1/tenants/silver", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        f.state.policy().tenants.policy_for("silver").weight.get(),
        1.0
    );
    let (status, _) = send(&f.router, Method::DELETE, "/v1/tenants/silver", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn invalid_writes_are_problems_and_change_nothing() {
    let f = fixture("invalid", AuthPolicy::default());
    let before_file = std::fs::read(&f.file).unwrap();
    let before_policy = f.state.policy().clone();
    let cases: &[(Method, &str, &str)] = &[
        (Method::PUT, "/v1/tenants/t", "{"),
        (Method::PUT, "/v1/tenants/t", r#"{"weight": -1}"#),
        (Method::PUT, "/v1/tenants/t", r#"{"weight": 0}"#),
        (Method::PUT, "/v1/tenants/t", r#"{"weight": NaN}"#),
        (Method::PUT, "/v1/tenants/t", r#"{"weight": 1e300}"#),
        (Method::PUT, "/v1/tenants/t", r#"{"weight": 1e400}"#),
        (Method::PUT, "/v1/tenants/t", r#"{"burst": 0.5}"#),
        (Method::PUT, "/v1/tenants/t", r#"{"min_floor_rps": -3}"#),
        (
            Method::PUT,
            "/v1/tenants/t",
            r#"{"weight": 1, "priority": 2}"#,
        ),
        (Method::PUT, "/v1/modes", r#"{"default": "off"}"#),
        (Method::PUT, "/v1/modes", r#"{"canary_fraction": 1.5}"#),
        (Method::PUT, "/v1/modes", r#"{"kill": true}"#),
        (Method::PUT, "/v1/modes", r#"{"buckets": {"": "shadow"}}"#),
        (Method::PUT, "/v1/modes/buckets/acme", r#"{"mode": "loud"}"#),
        (Method::PUT, "/v1/modes/buckets/acme", r#"{}"#),
        (Method::PUT, "/v1/canary", r#"{"canary_fraction": -0.1}"#),
        (Method::PUT, "/v1/canary", r#"{"canary_fraction": "half"}"#),
        (Method::PUT, "/v1/canary", r#"{}"#),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"limit_rps": 5, "ttl_s": 0}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"limit_rps": 5, "ttl_s": 99999999}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"limit_rps": 5}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"limit_rps": -5, "ttl_s": 60}"#,
        ),
        (Method::PUT, "/v1/overrides/limits/acme", r#"{"ttl_s": 60}"#),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"limit_rps": 5, "budget": {"amount": 5, "unit": "tokens", "per": "hour"}, "ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"budget": {"amount": 0, "unit": "tokens", "per": "hour"}, "ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"budget": {"amount": 5, "unit": "to kens", "per": "hour"}, "ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"budget": {"amount": 5, "unit": "tokens", "per": "day"}, "ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"budget": {"amount": 5, "unit": "tokens"}, "ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/limits/acme",
            r#"{"budget": {"amount": 5, "unit": "tokens", "per": "hour"}, "ttl_s": 0}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/tenants/gold",
            r#"{"ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/tenants/gold",
            r#"{"weight": 0, "ttl_s": 60}"#,
        ),
        (
            Method::PUT,
            "/v1/overrides/tenants/gold",
            r#"{"weight": 2, "ttl_s": -60}"#,
        ),
        (Method::DELETE, "/v1/overrides/limits/acme", ""),
        (Method::DELETE, "/v1/overrides/tenants/gold", ""),
        (Method::DELETE, "/v1/modes/buckets/acme", ""),
    ];
    for (method, uri, body) in cases {
        let body = (!body.is_empty()).then_some(*body);
        let (status, content_type, problem) =
            send_as(&f.router, None, method.clone(), uri, body).await;
        assert_problem(status, content_type.as_deref(), &problem);
    }
    let huge = format!(r#"{{"weight": 1{}}}"#, " ".repeat(70 * 1024));
    let (status, content_type, problem) =
        send_as(&f.router, None, Method::PUT, "/v1/tenants/t", Some(&huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_problem(status, content_type.as_deref(), &problem);

    assert_eq!(std::fs::read(&f.file).unwrap(), before_file);
    assert_eq!(*f.state.policy(), before_policy);
}

#[tokio::test]
async fn modes_kill_switch_and_canary() {
    let f = fixture("modes", AuthPolicy::default());
    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/modes/buckets/acme",
        Some(r#"{"mode": "shadow"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["buckets"], json!({"acme": "shadow"}));
    assert_eq!(f.state.policy().modes.mode_for("acme"), Mode::Shadow);

    let (_, body) = send(&f.router, Method::PUT, "/v1/kill-switch", None).await;
    assert_eq!(body["kill_switch"], true);
    assert!(f.state.policy().modes.kill_switch);
    assert!(file_config(&f).modes.kill_switch);
    let (_, body) = send(&f.router, Method::DELETE, "/v1/kill-switch", None).await;
    assert_eq!(body["kill_switch"], false);
    // The per-bucket mode survived the kill switch.
    assert_eq!(body["buckets"], json!({"acme": "shadow"}));

    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/canary",
        Some(r#"{"canary_fraction": 0.1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["canary_fraction"], 0.1);
    assert_eq!(f.state.policy().modes.canary_fraction.unwrap().get(), 0.1);
    let (_, body) = send(&f.router, Method::DELETE, "/v1/canary", None).await;
    assert_eq!(body["canary_fraction"], Value::Null);

    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/modes",
        Some(r#"{"default": "shadow", "buckets": {"checkout": "enforce"}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) = send(&f.router, Method::GET, "/v1/modes", None).await;
    assert_eq!(
        body,
        json!({"default": "shadow", "buckets": {"checkout": "enforce"},
               "kill_switch": false, "canary_fraction": null})
    );
    assert_eq!(file_config(&f).modes, f.state.policy().modes);
}

#[tokio::test]
async fn overrides_apply_then_expire_and_the_base_returns() {
    let f = fixture("overrides", AuthPolicy::default());
    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/overrides/limits/acme",
        Some(r#"{"limit_rps": 500, "ttl_s": 3600}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expires = body["expires_at_unix_s"].as_u64().unwrap();
    let now = sluice_control_plane::config::overrides::unix_now();
    assert!((now + 3599..=now + 3601).contains(&expires), "{body}");
    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/overrides/tenants/gold",
        Some(r#"{"min_floor_rps": 50, "ttl_s": 60}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    {
        let policy = f.state.policy();
        assert_eq!(policy.limits.limit_for("acme").unwrap().get(), 500.0);
        let gold = policy.tenants.policy_for("gold");
        assert_eq!(gold.min_floor_rps.get(), 50.0);
        assert_eq!(gold.weight.get(), 4.0, "not overridden: the base");
    }
    let (_, limits) = send(&f.router, Method::GET, "/v1/limits", None).await;
    assert_eq!(limits["overrides"]["acme"]["limit_rps"], 500.0);
    let (_, listed) = send(&f.router, Method::GET, "/v1/overrides", None).await;
    assert_eq!(listed["tenants"]["gold"]["min_floor_rps"], 50.0);
    // Persisted with their deadlines.
    assert_eq!(file_config(&f).overrides, f.live.config().overrides);

    // The base limit changes underneath; the override still wins.
    send(
        &f.router,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": 250}"#),
    )
    .await;
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        500.0
    );

    // The tenant override expires first, then the limit override.
    assert!(f.live.poll(now + 61).is_none(), "expiry is not a reload");
    assert_eq!(
        f.state
            .policy()
            .tenants
            .policy_for("gold")
            .min_floor_rps
            .get(),
        0.0
    );
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        500.0
    );
    f.live.poll(expires);
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        250.0
    );
    assert!(file_config(&f).overrides.is_empty());
    assert_eq!(file_config(&f).limits, f.live.config().limits);

    let (status, _) = send(&f.router, Method::DELETE, "/v1/overrides/limits/acme", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_budget_override_replaces_a_rate_until_it_expires() {
    let f = fixture("override-budget", AuthPolicy::default());
    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/overrides/limits/acme",
        Some(r#"{"budget": {"amount": 1200000, "unit": "tokens", "per": "minute"}, "ttl_s": 600}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["budget"],
        json!({"amount": 1_200_000.0, "unit": "tokens", "per": "minute"})
    );
    assert!(body.get("limit_rps").is_none(), "{body}");
    let expires = body["expires_at_unix_s"].as_u64().unwrap();
    {
        let policy = f.state.policy();
        assert_eq!(exact_limit(&policy.limits, "acme"), "1200000 tokens/minute");
        // Steered as tokens a second.
        assert_eq!(policy.limits.limit_for("acme").unwrap().get(), 20_000.0);
    }
    let (_, limits) = send(&f.router, Method::GET, "/v1/limits", None).await;
    assert_eq!(limits["overrides"]["acme"]["budget"]["per"], "minute");
    // The base rate stays in the file; the override is written beside it
    // as it was given and reads back the same.
    let written = file_config(&f);
    assert_eq!(written.overrides, f.live.config().overrides);
    assert_eq!(written.limits.exact("acme").unwrap().to_string(), "200 rps");

    // A bad budget answers a problem and leaves the override in force.
    let before = std::fs::read(&f.file).unwrap();
    let (status, content_type, problem) = send_as(
        &f.router,
        None,
        Method::PUT,
        "/v1/overrides/limits/acme",
        Some(r#"{"budget": {"amount": -1, "unit": "tokens", "per": "minute"}, "ttl_s": 600}"#),
    )
    .await;
    assert_problem(status, content_type.as_deref(), &problem);
    assert_eq!(std::fs::read(&f.file).unwrap(), before);
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        20_000.0
    );

    // At its deadline the base rate returns.
    f.live.poll(expires);
    let policy = f.state.policy();
    assert_eq!(exact_limit(&policy.limits, "acme"), "200 rps");
    assert_eq!(policy.limits.limit_for("acme").unwrap().get(), 200.0);
}

#[tokio::test]
async fn deleting_an_override_restores_the_base_at_once() {
    let f = fixture("override-delete", AuthPolicy::default());
    send(
        &f.router,
        Method::PUT,
        "/v1/overrides/tenants/gold",
        Some(r#"{"weight": 9, "ttl_s": 600}"#),
    )
    .await;
    assert_eq!(
        f.state.policy().tenants.policy_for("gold").weight.get(),
        9.0
    );
    let (status, _) = send(
        &f.router,
        Method::DELETE,
        "/v1/overrides/tenants/gold",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        f.state.policy().tenants.policy_for("gold").weight.get(),
        4.0
    );
}

#[tokio::test]
async fn a_write_that_cannot_be_persisted_changes_nothing() {
    let f = fixture("unwritable", AuthPolicy::default());
    std::fs::remove_dir_all(&f.dir).unwrap();
    let (status, content_type, body) = send_as(
        &f.router,
        None,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": 1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        200.0
    );
    assert_eq!(f.live.config().limits.as_slice().len(), 2);
}

fn token_auth(open_reads: bool) -> AuthPolicy {
    AuthPolicy {
        token: Some(Token::new("s3cret", "test").unwrap()),
        open_reads,
        open_metrics: false,
    }
}

#[tokio::test]
async fn writes_need_the_token() {
    let f = fixture("auth", token_auth(false));
    let put = Some(r#"{"limit_rps": 1}"#);
    let (status, content_type, body) =
        send_as(&f.router, None, Method::PUT, "/v1/limits/acme", put).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_problem(status, content_type.as_deref(), &body);
    let (status, content_type, body) = send_as(
        &f.router,
        Some("wrong"),
        Method::PUT,
        "/v1/limits/acme",
        put,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_problem(status, content_type.as_deref(), &body);
    assert!(!body.to_string().contains("s3cret"));
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        200.0
    );

    // Reads need it too unless opened; probes and scrapers never do.
    let (status, _, _) = send_as(&f.router, None, Method::GET, "/v1/limits", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send_as(&f.router, None, Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);

    let (status, _, body) = send_as(
        &f.router,
        Some("s3cret"),
        Method::PUT,
        "/v1/limits/acme",
        put,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        f.state.policy().limits.limit_for("acme").unwrap().get(),
        1.0
    );
    let (status, _, _) = send_as(&f.router, Some("s3cret"), Method::GET, "/v1/limits", None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn open_reads_still_guard_writes() {
    let f = fixture("open-reads", token_auth(true));
    let (status, _, _) = send_as(&f.router, None, Method::GET, "/v1/tenants", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send_as(&f.router, None, Method::PUT, "/v1/kill-switch", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send_as(&f.router, None, Method::DELETE, "/v1/kill-switch", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!f.state.policy().modes.kill_switch);
}

#[tokio::test]
async fn proxies_view() {
    use sluice_control_plane::fleet::StreamId;

    let f = fixture("proxies", AuthPolicy::default());
    let (status, body) = send(&f.router, Method::GET, "/v1/proxies", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"connected": 0, "proxies": []}));

    f.state
        .fleet()
        .connect_in_zone("envoy-b", 7, "eu-1", StreamId(1));
    f.state.fleet().connect("envoy-a", 3, StreamId(2));
    f.state.fleet().disconnect("envoy-a", StreamId(2));
    let (_, body) = send(&f.router, Method::GET, "/v1/proxies", None).await;
    assert_eq!(body["connected"], 1);
    let proxies = body["proxies"].as_array().unwrap();
    assert_eq!(proxies.len(), 2);
    assert_eq!(proxies[0]["proxy_id"], "envoy-a");
    assert_eq!(proxies[0]["connected"], false);
    assert_eq!(proxies[1]["proxy_id"], "envoy-b");
    assert_eq!(proxies[1]["zone"], "eu-1");
    assert_eq!(proxies[1]["instance_id"], 7);
    assert_eq!(proxies[1]["connected"], true);
    assert!(proxies[1]["since_last_report_ms"].is_u64());
    assert!(proxies[0]["directive_age_ms"].is_null(), "{body}");
    assert!(proxies[1]["directive_age_ms"].is_null(), "not reported yet");

    let report = sluice_proto::v1::Report {
        sequence: 0,
        window_ms: 250,
        directive_age_ms: Some(180),
        upstream: Vec::new(),
        buckets: vec![],
    };
    f.state
        .fleet()
        .report("envoy-b", StreamId(1), &report)
        .unwrap();
    let (_, body) = send(&f.router, Method::GET, "/v1/proxies", None).await;
    assert_eq!(body["proxies"][1]["directive_age_ms"], 180, "{body}");
}

#[tokio::test]
async fn writes_keep_hand_edits_not_yet_picked_up() {
    let f = fixture("hand-edit", AuthPolicy::default());
    // Edited by hand; the watcher has not polled yet.
    std::fs::write(&f.file, "limits:\n  - bucket: edited\n    limit_rps: 7\n").unwrap();
    let (status, body) = send(
        &f.router,
        Method::PUT,
        "/v1/limits/beta",
        Some(r#"{"limit_rps": 1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let on_disk = file_config(&f);
    assert_eq!(
        on_disk.limit_table().limit_for("edited").unwrap().get(),
        7.0
    );
    assert_eq!(on_disk.limit_table().limit_for("beta").unwrap().get(), 1.0);
    assert_eq!(
        on_disk.limit_table().limit_for("acme"),
        None,
        "the edit removed it"
    );
    assert_eq!(on_disk.policy(), *f.state.policy());

    // An invalid edit blocks writes (409) instead of being overwritten.
    let invalid = "limits:\n  - bucket: edited\n    limit_rps: lots\n";
    std::fs::write(&f.file, invalid).unwrap();
    let (status, content_type, body) = send_as(
        &f.router,
        None,
        Method::PUT,
        "/v1/limits/beta",
        Some(r#"{"limit_rps": 2}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_problem(status, content_type.as_deref(), &body);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("limits[0].limit_rps"),
        "{body}"
    );
    assert_eq!(std::fs::read_to_string(&f.file).unwrap(), invalid);
    assert_eq!(
        f.state.policy().limits.limit_for("beta").unwrap().get(),
        1.0
    );

    // Fixed by hand: writes work again.
    std::fs::write(&f.file, "limits: []\n").unwrap();
    let (status, _) = send(
        &f.router,
        Method::PUT,
        "/v1/limits/beta",
        Some(r#"{"limit_rps": 3}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(file_config(&f).limits.as_slice().len(), 1);
}

/// The filter cuts the bucket keys and tenants it builds at 256 bytes, so a
/// limit or tenant with a longer name could never match a request: the admin
/// API and the limits file refuse it, and accept exactly 256 bytes.
#[tokio::test]
async fn names_longer_than_the_filter_keeps_are_refused() {
    let f = fixture("name-length", AuthPolicy::default());
    let longest = "k".repeat(sluice_core::MAX_BUCKET_KEY_BYTES);
    let too_long = format!("{longest}k");
    let before_file = std::fs::read(&f.file).unwrap();
    for uri in [
        format!("/v1/limits/{too_long}"),
        format!("/v1/overrides/limits/{too_long}"),
    ] {
        let body = r#"{"limit_rps": 5, "ttl_s": 60}"#;
        let body = if uri.contains("overrides") {
            body
        } else {
            r#"{"limit_rps": 5}"#
        };
        let (status, content_type, problem) =
            send_as(&f.router, None, Method::PUT, &uri, Some(body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{uri}");
        assert_problem(status, content_type.as_deref(), &problem);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("at most 256 bytes"),
            "{problem}"
        );
    }
    let (status, _, problem) = send_as(
        &f.router,
        None,
        Method::PUT,
        &format!("/v1/tenants/{too_long}"),
        Some(r#"{"weight": 2}"#),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(std::fs::read(&f.file).unwrap(), before_file);

    for uri in [
        format!("/v1/limits/{longest}"),
        format!("/v1/tenants/{longest}"),
    ] {
        let body = if uri.contains("tenants") {
            r#"{"weight": 2}"#
        } else {
            r#"{"limit_rps": 5}"#
        };
        let (status, _, body) = send_as(&f.router, None, Method::PUT, &uri, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    }

    let yaml = format!(
        "limits:\n  - bucket: acme\n    limit_rps: 1\ntenants:\n  {too_long}: {{weight: 2}}\n"
    );
    let err = Config::from_yaml(&yaml, "limits.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("limits.yaml:"), "{err}");
    assert!(
        err.contains("tenants") && err.contains("at most 256 bytes"),
        "{err}"
    );
    let yaml = format!("limits:\n  - bucket: {too_long}\n    limit_rps: 1\n");
    let err = Config::from_yaml(&yaml, "limits.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("limits[0].bucket") && err.contains("at most 256 bytes"),
        "{err}"
    );
}

/// Everything in the fixture's file and policy, to check a refusal
/// changed nothing.
fn unchanged(f: &Fixture) -> (String, Config) {
    (std::fs::read_to_string(&f.file).unwrap(), f.live.config())
}

async fn refused(f: &Fixture, method: Method, uri: &str, body: Option<&str>, status: StatusCode) {
    let before = unchanged(f);
    let (got, content_type, json) = send_as(&f.router, None, method, uri, body).await;
    assert_eq!(got, status, "{uri}: {json}");
    assert_problem(got, content_type.as_deref(), &json);
    assert_eq!(unchanged(f), before, "{uri} changed something");
}

#[tokio::test]
async fn vanishing_weights_are_refused_wherever_they_enter() {
    let f = fixture("weights", AuthPolicy::default());
    for weight in ["1e-310", "0.0000001", "0.0009"] {
        let body = format!(r#"{{"weight": {weight}}}"#);
        refused(
            &f,
            Method::PUT,
            "/v1/tenants/default",
            Some(&body),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        let body = format!(r#"{{"weight": {weight}, "ttl_s": 60}}"#);
        refused(
            &f,
            Method::PUT,
            "/v1/overrides/tenants/gold",
            Some(&body),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        for yaml in [
            format!("tenants:\n  default: {{weight: {weight}}}\n"),
            format!(
                "overrides:\n  tenants:\n    gold: {{weight: {weight}, expires_at_unix_s: 4000000000}}\n"
            ),
        ] {
            let err = Config::from_yaml(&yaml, "limits.yaml")
                .unwrap_err()
                .to_string();
            assert!(err.contains("between 0.001 and 1000000"), "{err}");
        }
    }
    let (status, _) = send(
        &f.router,
        Method::PUT,
        "/v1/tenants/default",
        Some(r#"{"weight": 0.001}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn control_characters_are_refused_in_every_name() {
    let f = fixture("names", AuthPolicy::default());
    for name in [
        "a%00b",
        "line%0Abreak",
        "esc%1B%5B31m",
        "del%7F",
        "c1%C2%85",
    ] {
        let limit = Some(r#"{"limit_rps": 1}"#);
        let tenant = Some(r#"{"weight": 1}"#);
        let mode = Some(r#"{"mode": "shadow"}"#);
        let over = Some(r#"{"limit_rps": 1, "ttl_s": 60}"#);
        let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
        refused(
            &f,
            Method::PUT,
            &format!("/v1/limits/{name}"),
            limit,
            unprocessable,
        )
        .await;
        refused(
            &f,
            Method::PUT,
            &format!("/v1/tenants/{name}"),
            tenant,
            unprocessable,
        )
        .await;
        refused(
            &f,
            Method::PUT,
            &format!("/v1/modes/buckets/{name}"),
            mode,
            unprocessable,
        )
        .await;
        refused(
            &f,
            Method::PUT,
            &format!("/v1/overrides/limits/{name}"),
            over,
            unprocessable,
        )
        .await;
    }
    let before = unchanged(&f);
    let (status, _, body) = send_as(
        &f.router,
        None,
        Method::PUT,
        "/v1/modes",
        Some(r#"{"buckets": {"a\u0000b": "shadow"}}"#),
    )
    .await;
    assert!(status.is_client_error(), "{status}: {body}");
    assert_eq!(unchanged(&f), before);
    // The file: every kind of name, each error at its line.
    for (yaml, line) in [
        ("limits:\n  - bucket: \"a\\0b\"\n    limit_rps: 1\n", 2),
        ("limits:\n  - pattern: \"a\\x1b*\"\n    limit_rps: 1\n", 2),
        ("tenants:\n  \"a\\nb\": {weight: 1}\n", 2),
        ("modes:\n  buckets:\n    \"a\\tb\": shadow\n", 3),
        (
            "overrides:\n  limits:\n    \"a\\u0085\": {limit_rps: 1, expires_at_unix_s: 4000000000}\n",
            3,
        ),
        (
            "overrides:\n  tenants:\n    \"a\\rb\": {weight: 2, expires_at_unix_s: 4000000000}\n",
            3,
        ),
    ] {
        match Config::from_yaml(yaml, "limits.yaml") {
            Err(sluice_control_plane::ConfigError::Invalid(err)) => {
                assert!(err.message.contains("control characters"), "{err}");
                assert_eq!(err.location.map(|(l, _)| l), Some(line), "{err}");
            }
            other => panic!("{yaml:?} was accepted: {other:?}"),
        }
    }
    // Dots are names like any other.
    let (status, _) = send(
        &f.router,
        Method::PUT,
        "/v1/limits/%2E%2E",
        Some(r#"{"limit_rps": 3}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        file_config(&f).limits.exact("..").map(|l| l.rate()),
        Some(LimitRps::new(3.0).unwrap())
    );
}

#[tokio::test]
async fn whatif_spans_beyond_the_history_are_refused() {
    let f = fixture("whatif", AuthPolicy::default());
    let body = Some(r#"{"limits": [{"bucket": "acme", "limit_rps": 1}]}"#);
    for seconds in ["18446744073709551616", "301", "1e300", "0", "-1", "NaN"] {
        let uri = format!("/v1/whatif?seconds={seconds}");
        let (status, content_type, json) = send_as(&f.router, None, Method::POST, &uri, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{seconds}: {json}");
        assert_problem(status, content_type.as_deref(), &json);
        assert!(
            json["detail"].as_str().unwrap().contains("at most 300"),
            "{json}"
        );
    }
    let (status, json) = send(&f.router, Method::POST, "/v1/whatif?seconds=300", body).await;
    assert_eq!(status, StatusCode::OK, "{json}");
}

#[tokio::test]
async fn without_a_token_only_loopback_hosts_are_answered() {
    let f = fixture("hosts", AuthPolicy::default());
    for host in [
        "evil.example",
        "evil.example:8080",
        "127.0.0.1.nip.io",
        "10.0.0.1:8080",
        "localhost.evil.example",
    ] {
        let before = unchanged(&f);
        let request = Request::builder()
            .method(Method::PUT)
            .uri("/v1/limits/acme")
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"limit_rps": 1}"#))
            .unwrap();
        let response = f.router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{host}");
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        assert_eq!(unchanged(&f), before, "{host}");
        // Reads too: a rebound page could read tenants' names.
        let request = Request::builder()
            .uri("/v1/tenants")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        let response = f.router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{host}");
    }
    for host in [
        "localhost",
        "LOCALHOST:8080",
        "127.0.0.1:8080",
        "127.1.2.3",
        "[::1]:8080",
    ] {
        let request = Request::builder()
            .method(Method::PUT)
            .uri("/v1/limits/acme")
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"limit_rps": 7}"#))
            .unwrap();
        let response = f.router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{host}");
    }
    // With a token the host is not checked: the token is the guard.
    let f = fixture("hosts-token", token_auth(false));
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/v1/limits/acme")
        .header(header::HOST, "sluice.internal:8080")
        .header(header::AUTHORIZATION, "Bearer s3cret")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"limit_rps": 7}"#))
        .unwrap();
    let response = f.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn metrics_need_the_token_unless_opened() {
    let f = fixture("metrics-closed", token_auth(false));
    let (status, content_type, body) =
        send_as(&f.router, None, Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_problem(status, content_type.as_deref(), &body);
    let request = Request::builder()
        .uri("/metrics")
        .body(Body::empty())
        .unwrap();
    let response = f.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let request = Request::builder()
        .uri("/metrics")
        .header(header::AUTHORIZATION, "Bearer s3cret")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        f.router.clone().oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
    let request = Request::builder()
        .uri("/healthz")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        f.router.clone().oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );

    let open = AuthPolicy {
        open_metrics: true,
        ..token_auth(false)
    };
    let f = fixture("metrics-open", open);
    let request = Request::builder()
        .uri("/metrics")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        f.router.clone().oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
    // Only /metrics is opened.
    let (status, _, _) = send_as(&f.router, None, Method::GET, "/v1/tenants", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[cfg(unix)]
#[tokio::test]
async fn a_planted_link_redirects_no_write() {
    let f = fixture("links", AuthPolicy::default());
    let victim = f.dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    // The name the temporary file had before: predictable from the pid.
    let planted = f
        .dir
        .join(format!(".limits.yaml.{}.tmp", std::process::id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let (status, _) = send(
        &f.router,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": 9}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let meta = std::fs::symlink_metadata(&f.file).unwrap();
    assert!(
        meta.file_type().is_file(),
        "limits.yaml is no longer a regular file"
    );
    assert_eq!(
        file_config(&f).limits.exact("acme").map(|l| l.rate()),
        Some(LimitRps::new(9.0).unwrap())
    );
}

/// A log line sink for the audit-line test.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn audit_lines_follow_only_writes_that_happened() {
    let lines = Lines::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let f = fixture("audit", AuthPolicy::default());
    let stale = r#""0000000000000000""#;
    let precondition = |method: Method, uri: &'static str, body: Option<&'static str>| {
        let router = f.router.clone();
        async move {
            let mut request = Request::builder()
                .method(method)
                .uri(uri)
                .header(header::IF_MATCH, stale);
            if body.is_some() {
                request = request.header(header::CONTENT_TYPE, "application/json");
            }
            let request = request
                .body(body.map_or_else(Body::empty, Body::from))
                .unwrap();
            router.oneshot(request).await.unwrap().status()
        }
    };
    let failed = StatusCode::PRECONDITION_FAILED;
    assert_eq!(
        precondition(Method::PUT, "/v1/modes", Some(r#"{"default": "shadow"}"#)).await,
        failed
    );
    assert_eq!(
        precondition(
            Method::PUT,
            "/v1/modes/buckets/acme",
            Some(r#"{"mode": "shadow"}"#)
        )
        .await,
        failed
    );
    assert_eq!(
        precondition(Method::PUT, "/v1/kill-switch", None).await,
        failed
    );
    assert_eq!(
        precondition(Method::DELETE, "/v1/kill-switch", None).await,
        failed
    );
    assert_eq!(
        precondition(
            Method::PUT,
            "/v1/canary",
            Some(r#"{"canary_fraction": 0.5}"#)
        )
        .await,
        failed
    );
    assert_eq!(
        precondition(Method::DELETE, "/v1/canary", None).await,
        failed
    );
    let (status, _) = send(&f.router, Method::DELETE, "/v1/modes/buckets/none", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    for audit in [
        "modes set",
        "bucket mode set",
        "bucket mode removed",
        "kill switch on",
        "kill switch off",
        "canary fraction set",
        "canary fraction removed",
    ] {
        assert!(
            !logged.contains(audit),
            "{audit:?} logged for a refused write:\n{logged}"
        );
    }
    // A write that happened is logged.
    let (status, _) = send(&f.router, Method::PUT, "/v1/kill-switch", None).await;
    assert_eq!(status, StatusCode::OK);
    let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("kill switch on"), "{logged}");
}

/// A disk whose writes take `delay` (after saying they started): what an
/// fsync on a loaded disk looks like.
#[derive(Debug)]
struct SlowDisk {
    delay: std::time::Duration,
    started: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// Set once a write is on disk.
    finished: std::sync::atomic::AtomicBool,
}

impl SlowDisk {
    /// A disk that takes `delay` per write, and the signal of the first
    /// write's start.
    fn new(delay: std::time::Duration) -> (Arc<Self>, tokio::sync::oneshot::Receiver<()>) {
        let (started, write_started) = tokio::sync::oneshot::channel();
        let disk = Arc::new(Self {
            delay,
            started: std::sync::Mutex::new(Some(started)),
            finished: std::sync::atomic::AtomicBool::new(false),
        });
        (disk, write_started)
    }

    fn finished(&self) -> bool {
        self.finished.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl sluice_control_plane::config::live::Persist for SlowDisk {
    fn write(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(started) = self.started.lock().unwrap().take() {
            let _ = started.send(());
        }
        std::thread::sleep(self.delay);
        let written = sluice_control_plane::config::live::AtomicFile.write(path, bytes);
        self.finished
            .store(true, std::sync::atomic::Ordering::SeqCst);
        written
    }
}

/// `f`'s configuration on a disk whose writes take `delay`.
fn on_slow_disk(
    f: &Fixture,
    delay: std::time::Duration,
) -> (
    Arc<LiveConfig>,
    Arc<SlowDisk>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (disk, write_started) = SlowDisk::new(delay);
    let live = Arc::new(
        LiveConfig::with_file(
            f.state.clone(),
            f.live.config(),
            f.file.clone(),
            std::fs::read(&f.file).unwrap(),
        )
        .with_persist(Arc::clone(&disk) as Arc<dyn sluice_control_plane::config::live::Persist>),
    );
    (live, disk, write_started)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_wait_for_a_write_on_a_slow_disk() {
    let f = fixture("slow-disk", AuthPolicy::default());
    let (live, _disk, write_started) = on_slow_disk(&f, std::time::Duration::from_secs(3));
    let router = admin_router(Admin::new(Arc::clone(&live), AuthPolicy::default()));
    let writer = tokio::spawn({
        let router = router.clone();
        async move {
            send(
                &router,
                Method::PUT,
                "/v1/limits/acme",
                Some(r#"{"limit_rps": 42}"#),
            )
            .await
        }
    });
    write_started.await.unwrap();
    // Several readers at once, more than the runtime has workers: none of
    // them may park a worker on the writer's lock.
    let reads = [
        "/healthz",
        "/v1/limits",
        "/v1/tenants",
        "/v1/modes",
        "/v1/overrides",
        "/v1/limits/acme",
    ];
    let started_reading = std::time::Instant::now();
    let mut readers = tokio::task::JoinSet::new();
    for uri in reads {
        let router = router.clone();
        readers.spawn(async move { (uri, send(&router, Method::GET, uri, None).await) });
    }
    let answered = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        let mut answered = Vec::new();
        while let Some(joined) = readers.join_next().await {
            answered.push(joined.unwrap());
        }
        answered
    })
    .await
    .expect("a reader waited for the write's disk");
    assert!(started_reading.elapsed() < std::time::Duration::from_secs(2));
    for (uri, (status, body)) in answered {
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        if uri == "/v1/limits/acme" {
            // The write is not in force before it is on disk.
            assert_eq!(body["limit_rps"], 200.0, "{body}");
        }
    }
    let (status, _) = writer.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        live.config().limits.exact("acme").map(|l| l.rate()),
        Some(LimitRps::new(42.0).unwrap())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_of_the_file_during_a_write_does_not_undo_it() {
    // The watcher reads the file while a write is on its way to the disk:
    // what it read is older than the write, and must not be put in force
    // after it (the admin API would answer 200 and then serve, and push,
    // the old limit until the next poll).
    let f = fixture("poll-during-write", AuthPolicy::default());
    let (live, disk, write_started) = on_slow_disk(&f, std::time::Duration::from_secs(1));
    let router = admin_router(Admin::new(Arc::clone(&live), AuthPolicy::default()));
    let writer = tokio::spawn(async move {
        send(
            &router,
            Method::PUT,
            "/v1/limits/acme",
            Some(r#"{"limit_rps": 42}"#),
        )
        .await
    });
    write_started.await.unwrap();
    let poll = tokio::task::spawn_blocking({
        let live = Arc::clone(&live);
        move || live.poll(sluice_control_plane::config::overrides::unix_now())
    });
    let (status, body) = writer.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(disk.finished());
    let reload = poll.await.unwrap();
    assert!(reload.is_none(), "the poll reloaded the file: {reload:?}");
    assert_eq!(
        live.config().limits.exact("acme").map(|l| l.rate()),
        Some(LimitRps::new(42.0).unwrap())
    );
    assert_eq!(
        f.state.policy().limits.limit_for("acme"),
        Some(LimitRps::new(42.0).unwrap())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_grpc_stream_gets_its_first_batch_during_a_write_on_a_slow_disk() {
    use sluice_proto::v1::directive_service_client::DirectiveServiceClient;
    use sluice_proto::v1::{Hello, ProxyMessage, control_message, proxy_message};

    // The whole control plane on this runtime's two workers, its limits
    // file on a disk whose writes take 4 s (the fsyncs the issue slowed).
    let f = fixture("slow-disk-grpc", AuthPolicy::default());
    let (live, disk, write_started) = on_slow_disk(&f, std::time::Duration::from_secs(4));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc_addr, admin_addr) = (grpc.local_addr().unwrap(), admin.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sluice_control_plane::run(
        Listeners::new(grpc, admin),
        RunOptions::new(Admin::new(Arc::clone(&live), AuthPolicy::default()))
            .reload_poll(std::time::Duration::from_millis(200)),
        async {
            let _ = stopped.await;
        },
    ));
    let http = reqwest::Client::new();
    let writer = tokio::spawn({
        let http = http.clone();
        async move {
            http.put(format!("http://{admin_addr}/v1/limits/acme"))
                .json(&json!({"limit_rps": 42}))
                .send()
                .await
                .map(|response| response.status())
        }
    });
    write_started.await.unwrap();
    // Readers keep arriving meanwhile, more than the runtime has workers:
    // none may park a worker on the writer's lock.
    let mut readers = tokio::task::JoinSet::new();
    for path in ["/healthz", "/v1/limits", "/v1/tenants", "/v1/modes"]
        .into_iter()
        .cycle()
        .take(12)
    {
        let http = http.clone();
        readers.spawn(async move {
            let response = http
                .get(format!("http://{admin_addr}{path}"))
                .send()
                .await
                .unwrap();
            (path, response.status())
        });
    }
    // A proxy connects: its snapshot comes now, not after the disk.
    let asked = std::time::Instant::now();
    let first_batch = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (outbound, receiver) = tokio::sync::mpsc::channel(4);
        outbound
            .send(ProxyMessage {
                kind: Some(proxy_message::Kind::Hello(Hello {
                    proxy_id: "during-the-write".into(),
                    instance_id: 1,
                    ..Default::default()
                })),
            })
            .await
            .unwrap();
        let mut inbound = DirectiveServiceClient::new(channel)
            .stream(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
            .unwrap()
            .into_inner();
        let message = inbound.message().await.unwrap().unwrap();
        (message, outbound, inbound)
    })
    .await
    .expect("the new stream waited for the write's disk");
    let waited = asked.elapsed();
    assert!(
        !disk.finished(),
        "the first batch came only after the write was on disk ({waited:?})"
    );
    assert!(
        matches!(
            first_batch.0.kind,
            Some(control_message::Kind::Directives(_))
        ),
        "{:?}",
        first_batch.0
    );
    while let Some(joined) = readers.join_next().await {
        let (path, status) = joined.unwrap();
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    assert_eq!(writer.await.unwrap().unwrap(), StatusCode::OK);
    assert!(disk.finished());

    assert_eq!(
        live.config().limits.exact("acme").map(|l| l.rate()),
        Some(LimitRps::new(42.0).unwrap())
    );
    drop(first_batch);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

// Threads and channels rather than tasks: a read parked on a lock would
// park a runtime worker (and the test's own timeout with it).
#[test]
fn a_deeply_nested_file_is_refused_at_once_and_the_old_one_stays() {
    let f = fixture("nested", AuthPolicy::default());
    let before = f.live.config();
    std::fs::write(&f.file, format!("limits: {}\n", "[".repeat(200_000))).unwrap();
    // The watcher's poll, on a thread of its own: it once took 95 s to
    // reject this file, holding the lock every read took meanwhile.
    let (done, rejected) = std::sync::mpsc::channel();
    std::thread::spawn({
        let live = Arc::clone(&f.live);
        move || {
            // The first poll sees the change; the second takes it.
            let seen = live.poll(0);
            let _ = done.send(seen.or_else(|| live.poll(0)));
        }
    });
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let (answer, answers) = std::sync::mpsc::channel();
    std::thread::spawn({
        let router = f.router.clone();
        move || {
            let runtime = runtime();
            for uri in ["/healthz", "/v1/limits", "/v1/limits/acme"] {
                let reply = runtime.block_on(send(&router, Method::GET, uri, None));
                let _ = answer.send((uri, reply));
            }
        }
    });
    for _ in 0..3 {
        let (uri, (status, body)) = answers
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("a read waited for the reload");
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    }
    let reload = rejected
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the nested file was not rejected within 10 s");
    match reload {
        Some(sluice_control_plane::config::live::Reload::Rejected(err)) => {
            let err = err.to_string();
            assert!(err.contains("nested more than 32 levels deep"), "{err}");
            assert!(err.contains(":1:"), "names the line: {err}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(f.live.config(), before);
    // Writes wait for a fixed file, as for any invalid hand edit.
    let (status, _) = runtime().block_on(send(
        &f.router,
        Method::PUT,
        "/v1/limits/acme",
        Some(r#"{"limit_rps": 5}"#),
    ));
    assert_eq!(status, StatusCode::CONFLICT);
}
