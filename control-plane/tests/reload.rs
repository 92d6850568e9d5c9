//! Hot reload of the limits file: valid edits apply, invalid ones are
//! refused and the configuration in force stays, the control plane's own
//! writes are not reloaded, and every result is counted.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use sluice_control_plane::admin::auth::AuthPolicy;
use sluice_control_plane::config::ConfigError;
use sluice_control_plane::config::live::{LiveConfig, Reload};
use sluice_control_plane::config::overrides::unix_now;
use sluice_control_plane::{
    Admin, AppState, Config, Listeners, RunOptions, Settings, admin_router, run,
};
use tokio::net::TcpListener;
use tower::ServiceExt;

const LIMITS: &str = "limits:\n  - bucket: acme\n    limit_rps: 200\n";

fn setup(name: &str) -> (std::path::PathBuf, AppState, Arc<LiveConfig>) {
    let dir = std::env::temp_dir().join(format!("sluice-reload-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.yaml");
    std::fs::write(&file, LIMITS).unwrap();
    let config = Config::from_yaml(LIMITS, "limits.yaml").unwrap();
    let state = AppState::new(Settings::from_config(&config, None));
    let live = Arc::new(LiveConfig::with_file(
        state.clone(),
        config,
        file,
        LIMITS.as_bytes().to_vec(),
    ));
    (dir, state, live)
}

fn acme(state: &AppState) -> f64 {
    state.policy().limits.limit_for("acme").unwrap().get()
}

async fn reload_counts(live: &Arc<LiveConfig>) -> (String, String) {
    let router = admin_router(Admin::new(Arc::clone(live), AuthPolicy::default()));
    let response = router
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert!(text.contains("sluice_connected_proxies"), "{text}");
    let value = |result: &str| {
        let prefix = format!("sluice_config_reloads_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("{prefix} missing:\n{text}"))
            .to_owned()
    };
    (value("success"), value("failure"))
}

#[tokio::test]
async fn valid_edits_apply_and_invalid_ones_keep_the_previous_config() {
    let (dir, state, live) = setup("edits");
    let file = live.file().unwrap().to_path_buf();
    assert!(live.poll(unix_now()).is_none(), "unchanged file");

    std::fs::write(&file, "limits:\n  - bucket: acme\n    limit_rps: 300\n").unwrap();
    // A change is taken when a second poll reads it again.
    assert!(live.poll(unix_now()).is_none(), "seen once");
    assert_eq!(acme(&state), 200.0);
    assert!(matches!(live.poll(unix_now()), Some(Reload::Applied)));
    assert_eq!(acme(&state), 300.0);
    assert!(live.poll(unix_now()).is_none(), "applied once");

    std::fs::write(&file, "limits:\n  - bucket: acme\n    limit_rps: -1\n").unwrap();
    assert!(live.poll(unix_now()).is_none(), "seen once");
    let Some(Reload::Rejected(ConfigError::Invalid(err))) = live.poll(unix_now()) else {
        panic!("expected a rejected reload");
    };
    assert_eq!(err.field, "limits[0].limit_rps");
    assert_eq!(err.location, Some((3, 16)));
    assert_eq!(err.file, file.display().to_string());
    assert_eq!(acme(&state), 300.0, "previous config stays");
    assert!(
        live.poll(unix_now()).is_none(),
        "reported once, not every poll"
    );

    std::fs::remove_file(&file).unwrap();
    assert!(matches!(
        live.poll(unix_now()),
        Some(Reload::Rejected(ConfigError::Read { .. }))
    ));
    assert!(live.poll(unix_now()).is_none());
    assert_eq!(acme(&state), 300.0);

    assert_eq!(reload_counts(&live).await, ("1".into(), "2".into()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file rewritten in place is empty between its truncation and its
/// write, and an empty file is a valid "no limits": a poll that caught it
/// then put every limit out of force (a CI run of
/// tests/quotas.rs lost its quotas that way). Now a change must read the
/// same on two polls in a row; a file caught empty or cut short is read
/// whole by the next poll and never put in force.
#[tokio::test]
async fn a_file_caught_while_being_written_is_not_put_in_force() {
    let (dir, state, live) = setup("mid-write");
    let file = live.file().unwrap().to_path_buf();
    let edit =
        "limits:\n  - bucket: acme\n    limit_rps: 300\n  - bucket: beta\n    limit_rps: 9\n";
    for caught in ["", &edit[..edit.len() / 2], &edit[..30]] {
        std::fs::write(&file, caught).unwrap();
        assert!(live.poll(unix_now()).is_none(), "{caught:?} put in force");
        std::fs::write(&file, edit).unwrap();
        assert!(live.poll(unix_now()).is_none(), "{caught:?}, then the edit");
        assert_eq!(acme(&state), 200.0, "{caught:?}");
        // Back to the file in force: nothing pending.
        std::fs::write(&file, LIMITS).unwrap();
        assert!(live.poll(unix_now()).is_none());
        assert!(live.poll(unix_now()).is_none());
    }
    std::fs::write(&file, edit).unwrap();
    assert!(live.poll(unix_now()).is_none());
    assert!(matches!(live.poll(unix_now()), Some(Reload::Applied)));
    assert_eq!(acme(&state), 300.0);
    assert_eq!(state.policy().limits.limit_for("beta").unwrap().get(), 9.0);
    assert_eq!(reload_counts(&live).await, ("1".into(), "0".into()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn own_writes_do_not_trigger_a_reload() {
    let (dir, state, live) = setup("own");
    let changed = live
        .update(unix_now(), |config| {
            config.limits.set_exact(
                "beta".into(),
                sluice_control_plane::types::LimitRps::new(7.0)
                    .unwrap()
                    .into(),
            );
            Ok::<_, sluice_control_plane::config::live::PersistError>(())
        })
        .is_ok();
    assert!(changed);
    assert!(live.poll(unix_now()).is_none());
    assert_eq!(state.policy().limits.limit_for("beta").unwrap().get(), 7.0);
    assert_eq!(reload_counts(&live).await, ("0".into(), "0".into()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_running_control_plane_picks_up_an_edit() {
    let (dir, state, live) = setup("running");
    let file = live.file().unwrap().to_path_buf();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(
        Listeners::new(grpc, admin),
        RunOptions::new(Admin::new(Arc::clone(&live), AuthPolicy::default()))
            .reload_poll(Duration::from_millis(100)),
        async {
            let _ = stopped.await;
        },
    ));

    std::fs::write(&file, "limits:\n  - bucket: acme\n    limit_rps: 42\n").unwrap();
    let client = reqwest::Client::new();
    let mut seen = None;
    for _ in 0..50 {
        let body: serde_json::Value = client
            .get(format!("http://{admin_addr}/v1/limits"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        seen = Some(body["limits"][0]["limit_rps"].clone());
        if seen == Some(serde_json::json!(42.0)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, Some(serde_json::json!(42.0)));
    assert_eq!(acme(&state), 42.0);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
