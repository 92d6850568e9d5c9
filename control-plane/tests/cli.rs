//! The `sluice` binary: ready file, admin API, SIGTERM, `check-config`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/limits.yaml")
}

/// A minimal HTTP/1.1 GET, enough for a smoke test without a client crate.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Waits for `sluice serve`'s ready file and parses it; a process that
/// does not get ready is killed.
fn wait_ready(child: &mut Child, ready: &Path) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(ready) {
            return serde_json::from_str(&text).unwrap();
        }
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice did not get ready");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGTERM and waits at most `bound` for the exit: its status and
/// how long it took (past the bound the process is killed and the test
/// fails).
fn terminate(child: &mut Child, bound: Duration) -> (ExitStatus, Duration) {
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, sent.elapsed());
        }
        if sent.elapsed() > bound {
            child.kill().unwrap();
            panic!("sluice did not stop within {bound:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn example_configs_are_valid() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for example in [example(), examples.join("llm-budget.yaml")] {
        let output = Command::new(SLUICE)
            .arg("check-config")
            .arg(&example)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}: {output:?}", example.display());
        assert_eq!(String::from_utf8(output.stdout).unwrap().trim(), "OK");
    }
}

#[test]
fn check_config_refuses_a_deeply_nested_file_at_once() {
    // 200 KB of nested `[` once took check-config minutes (the parser's
    // time grew with the square of the depth); refused before parsing now.
    let dir = temp_dir("nested");
    let file = dir.join("limits.yaml");
    std::fs::write(&file, format!("limits: {}\n", "[".repeat(200_000))).unwrap();
    let mut child = Command::new(SLUICE)
        .arg("check-config")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("check-config still parsing after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:1:", file.display()))
            && stderr.contains("nested more than 32 levels deep"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_reports_file_line_column_and_field() {
    let dir = temp_dir("check");
    let file = dir.join("limits.yaml");
    std::fs::write(&file, "limits:\n  - bucket: acme\n    limit_rps: -1\n").unwrap();
    let output = Command::new(SLUICE)
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr.trim(),
        format!(
            "{}:3:16: limits[0].limit_rps: must be a finite number >= 0",
            file.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serve_writes_ready_file_and_stops_on_sigterm() {
    let dir = temp_dir("serve");
    let ready = dir.join("ready.json");
    let mut child = Command::new(SLUICE)
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(example())
        .arg("--ready-file")
        .arg(&ready)
        .args(["--control-interval-ms", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let addrs = wait_ready(&mut child, &ready);
    let grpc: SocketAddr = addrs["grpc"].as_str().unwrap().parse().unwrap();
    let admin: SocketAddr = addrs["admin"].as_str().unwrap().parse().unwrap();
    assert_ne!(grpc.port(), 0);
    assert_ne!(admin.port(), 0);

    let health = http_get(admin, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with(r#"{"status":"ok"}"#), "{health}");
    let buckets = http_get(admin, "/v1/buckets");
    assert!(
        buckets.contains(r#""control_interval_ms":100"#),
        "{buckets}"
    );

    let (status, took) = terminate(&mut child, Duration::from_secs(5));
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A client that opens HTTP/2 connections and then never reads again (a
/// hung or partitioned Envoy) cannot hold SIGTERM past the drain: the
/// graceful shutdown waits for every connection, and each waits for its
/// client's answer to a last ping.
#[test]
fn serve_stops_after_the_drain_whatever_its_clients_do() {
    let dir = temp_dir("drain");
    let ready = dir.join("ready.json");
    let quotas = dir.join("quotas.yaml");
    std::fs::write(
        &quotas,
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
    )
    .unwrap();
    let mut child = Command::new(SLUICE)
        .args(["serve", "--grpc-listen", "127.0.0.1:0"])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--rls-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(example())
        .arg("--quotas")
        .arg(&quotas)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addrs = wait_ready(&mut child, &ready);
    // The client preface and an empty SETTINGS frame, then silence.
    let mut silent = Vec::new();
    for listener in ["grpc", "rls"] {
        let addr: SocketAddr = addrs[listener].as_str().unwrap().parse().unwrap();
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .unwrap();
        silent.push(stream);
    }
    std::thread::sleep(Duration::from_millis(200));

    let bound = sluice_control_plane::DRAIN_TIMEOUT + Duration::from_secs(5);
    let (status, took) = terminate(&mut child, bound);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status}\n{stderr}");
    assert!(took >= sluice_control_plane::DRAIN_TIMEOUT, "took {took:?}");
    assert!(
        stderr.contains("connections still open after the drain"),
        "{stderr}"
    );
    drop(silent);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn serve_output(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(SLUICE);
    command
        .args(["serve", "--grpc-listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(config)
        .args(extra);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // These must all fail before serving; never leave one running.
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("sluice serve did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn serve_refuses_an_invalid_limits_file() {
    let dir = temp_dir("serve-invalid");
    let file = dir.join("limits.yaml");
    std::fs::write(&file, "limits:\n  - bucket: acme\n    limit_rps: -1\n").unwrap();
    let output = serve_output(&file, &["--admin-listen", "127.0.0.1:0"], &[]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains(&format!(
            "{}:3:16: limits[0].limit_rps: must be a finite number >= 0",
            file.display()
        )),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serve_refuses_an_open_admin_api_off_loopback_and_an_empty_token() {
    let output = serve_output(&example(), &["--admin-listen", "0.0.0.0:0"], &[]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("refusing an unauthenticated admin API on 0.0.0.0:0"),
        "{stderr}"
    );

    let output = serve_output(
        &example(),
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token-env",
            "SLUICE_TEST_TOKEN",
        ],
        &[("SLUICE_TEST_TOKEN", "  \n")],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("admin token from SLUICE_TEST_TOKEN is empty"),
        "{stderr}"
    );
}

/// A minimal HTTP/1.1 request with an optional bearer token and JSON body.
fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_with_a_token_file_guards_writes_and_persists_them() {
    let dir = temp_dir("serve-token");
    let limits = dir.join("limits.yaml");
    std::fs::copy(example(), &limits).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let ready = dir.join("ready.json");
    let mut child = Command::new(SLUICE)
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&limits)
        .arg("--ready-file")
        .arg(&ready)
        .arg("--admin-token-file")
        .arg(&token)
        .arg("--admin-open-reads")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addrs = wait_ready(&mut child, &ready);
    let admin: SocketAddr = addrs["admin"].as_str().unwrap().parse().unwrap();

    let body = Some(r#"{"limit_rps": 75}"#);
    let refused = http_request(admin, "PUT", "/v1/limits/acme", None, body);
    let wrong = http_request(admin, "PUT", "/v1/limits/acme", Some("nope"), body);
    let read = http_request(admin, "GET", "/v1/limits", None, None);
    let accepted = http_request(admin, "PUT", "/v1/limits/acme", Some("t0ken"), body);
    child.kill().unwrap();
    child.wait().unwrap();

    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(refused.contains("application/problem+json"), "{refused}");
    assert!(wrong.starts_with("HTTP/1.1 403"), "{wrong}");
    assert!(read.starts_with("HTTP/1.1 200"), "{read}");
    assert!(accepted.starts_with("HTTP/1.1 200"), "{accepted}");
    // Persisted: a restart would read the new limit.
    let persisted = std::fs::read_to_string(&limits).unwrap();
    assert!(persisted.contains("limit_rps: 75.0"), "{persisted}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `sluice serve` with the gRPC listener on `grpc_listen` and `extra`
/// arguments; waits until it exits or writes its ready file, and returns
/// the exit status (`None`: it was serving and was stopped) and stderr.
fn serve_grpc(grpc_listen: &str, extra: &[&str]) -> (Option<i32>, String) {
    let dir = temp_dir(&format!("grpc-{}", extra.len()));
    let ready = dir.join("ready.json");
    let _ = std::fs::remove_file(&ready);
    let mut child = Command::new(SLUICE)
        .args([
            "serve",
            "--grpc-listen",
            grpc_listen,
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(example())
        .arg("--ready-file")
        .arg(&ready)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if ready.exists() || Instant::now() > deadline {
            child.kill().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (code, String::from_utf8(output.stderr).unwrap())
}

#[test]
fn serve_refuses_a_grpc_listener_off_loopback_without_mutual_tls() {
    let (code, stderr) = serve_grpc("0.0.0.0:0", &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("refusing to serve the filters' gRPC API on 0.0.0.0:0 over plaintext"),
        "{stderr}"
    );
    assert!(stderr.contains("--grpc-tls-client-ca"), "{stderr}");
    assert!(
        stderr.contains("--grpc-insecure-accept-any-proxy"),
        "{stderr}"
    );

    let (code, stderr) = serve_grpc("0.0.0.0:0", &["--grpc-insecure-accept-any-proxy"]);
    assert_eq!(code, None, "serves with the flag: {stderr}");
    assert!(
        stderr.contains("WARN") && stderr.contains("accepts any client on the network"),
        "and says so: {stderr}"
    );
}

#[test]
fn serve_refuses_contradictory_trust_settings() {
    let (code, stderr) = serve_grpc(
        "127.0.0.1:0",
        &["--proxy-share-cap", "4", "--proxy-share-ignore", "2"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--proxy-share-ignore (2)"), "{stderr}");
    let (code, stderr) = serve_grpc("127.0.0.1:0", &["--grpc-identity", "x=y"]);
    assert_eq!(code, Some(2), "needs client certificates: {stderr}");
    assert!(stderr.contains("--grpc-tls-client-ca"), "{stderr}");
}

#[test]
fn serve_refuses_a_rate_limit_service_listener_without_quotas() {
    // The example serves no quotas; its exit code and message.
    let refused = |extra: &[&str]| {
        let mut args = vec!["--admin-listen", "127.0.0.1:0"];
        args.extend(extra);
        let output = serve_output(&example(), &args, &[]);
        (
            output.status.code(),
            String::from_utf8(output.stderr).unwrap(),
        )
    };
    let (code, stderr) = refused(&["--rls-listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--rls-listen serves quotas: give --quotas"),
        "{stderr}"
    );
    // Threads for a listener that is not there, or none: usage errors.
    let (code, stderr) = refused(&["--rls-threads", "2"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--rls-listen"), "{stderr}");
    let (code, stderr) = refused(&["--rls-listen", "127.0.0.1:0", "--rls-threads", "0"]);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn serve_refuses_a_store_it_cannot_use_and_never_shows_its_password() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let unreachable = format!("redis://sluice:hunter2@127.0.0.1:{closed_port}/0");
    for (url, expected) in [
        (
            "redis://sluice:hunter2@cache.internal".to_owned(),
            "store URL redis://sluice:***@cache.internal: expected HOST:PORT".to_owned(),
        ),
        (
            "memcached://cache:11211".to_owned(),
            "store URL memcached://cache:11211: expected redis://".to_owned(),
        ),
        (
            unreachable,
            format!("cannot connect to the store at redis://sluice:***@127.0.0.1:{closed_port}/0"),
        ),
    ] {
        let started = Instant::now();
        let output = serve_output(
            &example(),
            &["--admin-listen", "127.0.0.1:0", "--store", &url],
            &[("SLUICE_STORE_PASSWORD", "from-the-environment")],
        );
        assert_eq!(output.status.code(), Some(1), "{url}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(&expected), "{url}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(!stderr.contains("from-the-environment"), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(5), "{url}");
    }
    let output = serve_output(
        &example(),
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--store",
            "redis://127.0.0.1:6379",
            "--store-password-file",
            "/nonexistent/sluice-store-password",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("store password file /nonexistent/sluice-store-password"),
        "{stderr}"
    );
}
