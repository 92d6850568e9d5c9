//! `sluice ctl` (the real binary) against an in-process control plane.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_control_plane::admin::auth::{AuthPolicy, Token};
use sluice_control_plane::config::live::LiveConfig;
use sluice_control_plane::config::policy::Mode;
use sluice_control_plane::{
    Admin, AppState, Config, Listeners, RunError, RunOptions, Settings, run,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const TOKEN: &str = "ctl-test-token";
const LIMITS: &str = "limits:\n  - bucket: acme\n    limit_rps: 200\n";

struct Server {
    dir: PathBuf,
    addr: SocketAddr,
    state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), RunError>>>,
}

impl Server {
    async fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-ctl-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("limits.yaml");
        std::fs::write(&file, LIMITS).unwrap();
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
        let config = Config::from_yaml(LIMITS, "limits.yaml").unwrap();
        let state = AppState::new(Settings::from_config(&config, None));
        let live = LiveConfig::with_file(state.clone(), config, file, LIMITS.as_bytes().to_vec());
        let auth = AuthPolicy {
            token: Some(Token::new(TOKEN, "test").unwrap()),
            open_reads: false,
            open_metrics: false,
        };
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = admin.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(
            Listeners::new(grpc, admin),
            RunOptions::new(Admin::new(Arc::new(live), auth))
                .reload_poll(Duration::from_millis(200)),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            dir,
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Runs `sluice ctl ARGS` with the URL and token in the environment.
    async fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        self.ctl_with(args, Some(TOKEN)).await
    }

    async fn ctl_with(&self, args: &[&str], token: Option<&str>) -> (i32, String, String) {
        let mut command = tokio::process::Command::new(SLUICE);
        command
            .arg("ctl")
            .args(args)
            .env("SLUICE_ADMIN_URL", format!("http://{}", self.addr))
            .env_remove("SLUICE_ADMIN_TOKEN")
            .kill_on_drop(true);
        if let Some(token) = token {
            command.env("SLUICE_ADMIN_TOKEN", token);
        }
        let output = tokio::time::timeout(Duration::from_secs(20), command.output())
            .await
            .expect("sluice ctl timed out")
            .unwrap();
        (
            output.status.code().unwrap(),
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.ctl(args).await;
        assert_eq!(code, 0, "sluice ctl {args:?}: {stderr}");
        stdout
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).unwrap();
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_tenants_and_tables() {
    let server = Server::start("limits").await;
    server.ok(&["limit", "set", "beta/api", "150"]).await;
    assert_eq!(
        server
            .state
            .policy()
            .limits
            .limit_for("beta/api")
            .unwrap()
            .get(),
        150.0
    );
    let table = server.ok(&["limits"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("kind"), "{table}");
    assert!(
        lines
            .iter()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["bucket", "beta/api", "150.0", "-"]),
        "{table}"
    );
    server.ok(&["limit", "rm", "beta/api"]).await;
    assert_eq!(server.state.policy().limits.limit_for("beta/api"), None);

    server
        .ok(&["tenant", "set", "gold", "--weight", "4", "--floor", "10"])
        .await;
    let policy = server.state.policy().tenants.policy_for("gold");
    assert_eq!(
        (policy.weight.get(), policy.min_floor_rps.get()),
        (4.0, 10.0)
    );
    let table = server.ok(&["tenants"]).await;
    assert!(
        table.lines().any(
            |l| l.split_whitespace().collect::<Vec<_>>() == ["gold", "4.0", "1.0", "10.0", "-"]
        ),
        "{table}"
    );

    let json: Value = serde_json::from_str(&server.ok(&["--json", "buckets"]).await).unwrap();
    assert_eq!(json["buckets"], serde_json::json!([]));
    let table = server.ok(&["proxies"]).await;
    assert!(table.starts_with("proxy_id"), "{table}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_kill_switch_canary_and_overrides() {
    let server = Server::start("modes").await;
    server.ok(&["mode", "set", "acme", "shadow"]).await;
    server.ok(&["mode", "default", "shadow"]).await;
    {
        let modes = &server.state.policy().modes;
        assert_eq!(modes.mode_for("acme"), Mode::Shadow);
        assert_eq!(modes.default, Mode::Shadow);
    }
    let out = server.ok(&["kill-switch", "on"]).await;
    assert!(out.contains("kill_switch: true"), "{out}");
    assert!(server.state.policy().modes.kill_switch);
    server.ok(&["kill-switch", "off"]).await;
    assert!(!server.state.policy().modes.kill_switch);
    server.ok(&["canary", "0.25"]).await;
    assert_eq!(
        server.state.policy().modes.canary_fraction.unwrap().get(),
        0.25
    );
    server.ok(&["canary", "off"]).await;
    assert_eq!(server.state.policy().modes.canary_fraction, None);

    server
        .ok(&["override", "limit", "acme", "500", "--for", "1h"])
        .await;
    server
        .ok(&[
            "override", "tenant", "gold", "--weight", "8", "--for", "15m",
        ])
        .await;
    assert_eq!(
        server
            .state
            .policy()
            .limits
            .limit_for("acme")
            .unwrap()
            .get(),
        500.0
    );
    assert_eq!(
        server
            .state
            .policy()
            .tenants
            .policy_for("gold")
            .weight
            .get(),
        8.0
    );
    let table = server.ok(&["overrides"]).await;
    assert!(table.contains("limit   acme"), "{table}");
    assert!(table.contains("weight=8.0"), "{table}");
    server.ok(&["override", "rm", "limit", "acme"]).await;
    assert_eq!(
        server
            .state
            .policy()
            .limits
            .limit_for("acme")
            .unwrap()
            .get(),
        200.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_are_set_and_overridden_from_the_command_line() {
    let server = Server::start("budgets").await;
    server
        .ok(&["limit", "set", "llm", "--budget", "1200000 tokens/minute"])
        .await;
    {
        let policy = server.state.policy();
        assert_eq!(exact_limit(&policy.limits, "llm"), "1200000 tokens/minute");
        assert_eq!(policy.limits.limit_for("llm").unwrap().get(), 20_000.0);
    }
    let table = server.ok(&["limits"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["bucket", "llm", "1200000", "tokens/minute", "-"]),
        "{table}"
    );

    // An override with a budget on a bucket whose base is a rate.
    server
        .ok(&[
            "override",
            "limit",
            "acme",
            "--budget",
            "30000tokens/second",
            "--for",
            "1h",
        ])
        .await;
    assert_eq!(
        exact_limit(&server.state.policy().limits, "acme"),
        "30000 tokens/second"
    );
    let table = server.ok(&["overrides"]).await;
    assert!(table.contains("budget=30000 tokens/second"), "{table}");
    server.ok(&["override", "rm", "limit", "acme"]).await;
    assert_eq!(
        server
            .state
            .policy()
            .limits
            .limit_for("acme")
            .unwrap()
            .get(),
        200.0
    );

    // A budget the control plane refuses: its problem, nothing changed.
    let before = server.ok(&["--json", "limits"]).await;
    for args in [
        &["limit", "set", "llm", "--budget", "5 tokens/day"][..],
        &["limit", "set", "llm", "--budget", "0 tokens/minute"],
        &[
            "override",
            "limit",
            "llm",
            "--budget",
            "5 tok,ens/hour",
            "--for",
            "1h",
        ],
    ] {
        let (code, _, stderr) = server.ctl(args).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("sluice ctl: 422 Unprocessable Entity: "),
            "{args:?}: {stderr}"
        );
    }
    // Not a budget, or a rate and a budget at once: usage errors, nothing
    // sent.
    for args in [
        &["limit", "set", "llm", "--budget", "tokens/minute"][..],
        &["limit", "set", "llm", "5", "--budget", "5 tokens/minute"],
        &["limit", "set", "llm"],
        &["override", "limit", "llm", "--for", "1h"],
    ] {
        let (code, _, stderr) = server.ctl(args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
    }
    assert_eq!(server.ok(&["--json", "limits"]).await, before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_non_zero_with_the_problem_detail() {
    let server = Server::start("errors").await;
    let (code, stdout, stderr) = server.ctl(&["limit", "set", "acme", "-5"]).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.starts_with("sluice ctl: 422 Unprocessable Entity: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("limit_rps: must be a finite number >= 0"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let (code, _, stderr) = server.ctl(&["override", "rm", "tenant", "nobody"]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("404 Not Found: no override for tenant"),
        "{stderr}"
    );

    let (code, _, stderr) = server.ctl_with(&["limits"], None).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("401 Unauthorized"), "{stderr}");
    let (code, _, stderr) = server.ctl_with(&["kill-switch", "on"], Some("wrong")).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("403 Forbidden"), "{stderr}");
    assert!(!server.state.policy().modes.kill_switch);

    // The token from a file instead of the environment.
    let token_file = server.dir.join("token");
    let (code, _, stderr) = server
        .ctl_with(
            &[
                "--token-file",
                token_file.to_str().unwrap(),
                "kill-switch",
                "on",
            ],
            None,
        )
        .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(server.state.policy().modes.kill_switch);

    let (code, _, stderr) = server
        .ctl(&["override", "limit", "acme", "1", "--for", "1y"])
        .await;
    assert_eq!(code, 2, "usage error: {stderr}");
    let (code, _, stderr) = server.ctl(&["canary", "half"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("neither a fraction nor `off`"), "{stderr}");

    // A write under a stale entity tag changes nothing.
    let (code, _, stderr) = server
        .ctl(&[
            "--if-match",
            "\"0000000000000000\"",
            "limit",
            "set",
            "acme",
            "7",
        ])
        .await;
    assert_eq!(code, 1);
    assert!(stderr.contains("412 Precondition Failed"), "{stderr}");
    assert!(stderr.contains("entity tag is now"), "{stderr}");
    let limits = server.ok(&["--json", "limits"]).await;
    assert!(!limits.contains("7.0"), "{limits}");

    let addr = server.addr;
    server.stop().await;
    let output = tokio::process::Command::new(SLUICE)
        .args(["ctl", "--url", &format!("http://{addr}"), "buckets"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .starts_with("sluice ctl: GET http://"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_whatif_replays_a_proposal_and_changes_nothing() {
    use sluice_control_plane::fleet::{BucketLoad, BucketTraffic, FleetLoad};

    let server = Server::start("whatif").await;
    for _ in 0..20 {
        server.state.record_history(
            &FleetLoad::new(vec![BucketTraffic::single(
                "acme",
                BucketLoad {
                    offered_rps: 400.0,
                    admitted_rps: 200.0,
                    proxies_reporting: 2,
                    stale_share: 0.0,
                    requests_rps: 0.0,
                },
            )]),
            &std::collections::HashMap::new(),
        );
    }
    let proposal = server.dir.join("proposal.yaml");
    std::fs::write(&proposal, "limits:\n  - bucket: acme\n    limit_rps: 100\n").unwrap();
    let printed = server
        .ok(&["whatif", proposal.to_str().unwrap(), "--seconds", "4"])
        .await;
    let header = printed.lines().next().unwrap();
    assert!(header.starts_with("bucket"), "{printed}");
    assert!(header.contains("would_admit_rps"), "{printed}");
    let row = printed.lines().nth(1).unwrap();
    assert!(row.starts_with("acme"), "{printed}");
    assert!(row.contains("100.0"), "the proposed limit: {printed}");
    assert!(printed.contains("replayed 4 s"), "{printed}");

    std::fs::write(
        &proposal,
        "limits:\n  - bucket: acme\n    limit_rps: nope\n",
    )
    .unwrap();
    let (code, _, stderr) = server.ctl(&["whatif", proposal.to_str().unwrap()]).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("422") && stderr.contains("limit_rps"),
        "{stderr}"
    );
    assert_eq!(
        server
            .state
            .policy()
            .limits
            .limit_for("acme")
            .map(|l| l.get()),
        Some(200.0),
        "the limit in force is untouched"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_adaptive_sets_lists_and_removes_a_spec() {
    let server = Server::start("adaptive").await;
    let spec = server.dir.join("adaptive.yaml");
    std::fs::write(&spec, "signal: errors\nmin_rps: 20\nmax_rps: 400\n").unwrap();
    let printed = server
        .ok(&["adaptive", "set", "acme", spec.to_str().unwrap()])
        .await;
    let written: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(written["bucket"], "acme");
    assert_eq!(written["max_rps"], 400.0);
    assert!(server.state.policy().adaptive.contains("acme"));
    // The limits file holds it, as if written by hand.
    let file = std::fs::read_to_string(server.dir.join("limits.yaml")).unwrap();
    assert!(file.contains("adaptive:"), "{file}");

    // A bad spec: the problem's detail, non-zero, nothing changed.
    std::fs::write(&spec, "signal: errors\nmin_rps: 20\nmax_rps: 10\n").unwrap();
    let (code, _, stderr) = server
        .ctl(&["adaptive", "set", "acme", spec.to_str().unwrap()])
        .await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("422") && stderr.contains("must be above min_rps"),
        "{stderr}"
    );
    assert_eq!(
        server
            .state
            .policy()
            .adaptive
            .iter()
            .map(|s| s.max_rps)
            .collect::<Vec<_>>(),
        vec![400.0]
    );

    let listed = server.ok(&["adaptive"]).await;
    assert!(
        listed.lines().next().unwrap().starts_with("bucket"),
        "{listed}"
    );
    server.ok(&["adaptive", "rm", "acme"]).await;
    assert!(!server.state.policy().adaptive.contains("acme"));
    server.stop().await;
}

#[tokio::test]
async fn dot_buckets_can_be_set_and_removed() {
    let server = Server::start("dots").await;
    // `..` once became `PUT /v1/`, and `%2E%2E` the bucket `..`.
    for bucket in ["..", ".", "%2E%2E", "a/../b"] {
        server.ok(&["limit", "set", bucket, "5"]).await;
        assert_eq!(
            server
                .state
                .policy()
                .limits
                .limit_for(bucket)
                .map(|l| l.get()),
            Some(5.0),
            "{bucket}"
        );
        server.ok(&["mode", "set", bucket, "shadow"]).await;
        server.ok(&["mode", "rm", bucket]).await;
        server.ok(&["limit", "rm", bucket]).await;
        assert_eq!(
            server.state.policy().limits.limit_for(bucket),
            None,
            "{bucket}"
        );
    }
}
