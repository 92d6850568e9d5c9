//! The rate limit service with its counters in a real `redis-server`
//! (`--store`): exact answers shared by several control planes, and the
//! failure policies while Redis is stalled, killed and restarted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_integration_tests::certs::{self, DevCerts};
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::quotas::{self, Store};
use sluice_integration_tests::redis::{RedisCluster, RedisSentinel, RedisServer};
use sluice_integration_tests::replicas;
use tonic::transport::Channel;

use super::{client, unix_ms};

/// Any tenant: 100 per second, each its own counter.
const PER_TENANT: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n";
const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

async fn connect(grpc: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap()
}

async fn ask(client: &mut RateLimitServiceClient<Channel>, tenant: &str) -> RateLimitResponse {
    try_ask(client, tenant).await.unwrap()
}

async fn try_ask(
    client: &mut RateLimitServiceClient<Channel>,
    tenant: &str,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "api".to_owned(),
            descriptors: vec![client::descriptor("tenant", tenant)],
            hits_addend: 0,
        })
        .await
        .map(tonic::Response::into_inner)
}

fn error_header(response: &RateLimitResponse) -> Option<&str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "x-ratelimit-error")
        .map(|h| h.value.as_str())
}

/// Two calls for a new tenant within one second (a few tries): the
/// second is counted in Redis and leaves 98 of 100.
async fn counts_two_calls(client: &mut RateLimitServiceClient<Channel>, prefix: &str) {
    for attempt in 0..3 {
        let tenant = format!("{prefix}-{attempt}");
        let second = unix_ms() / 1_000;
        ask(client, &tenant).await;
        let answer = ask(client, &tenant).await;
        assert_eq!(error_header(&answer), None, "{answer:?}");
        if unix_ms() / 1_000 == second {
            assert_eq!(answer.statuses[0].limit_remaining, 98, "{answer:?}");
            return;
        }
    }
    panic!("no pair of calls fitted in one second");
}

/// Starts a control plane on `url` with `args` that must refuse to
/// start; its log.
async fn refused_start(dir: &std::path::Path, name: &str, url: &str, args: &[&str]) -> String {
    let options = ControlPlaneOptions::new("limits: []\n", &dir.join(name))
        .args(args.iter().map(|a| (*a).to_owned()));
    let refused = quotas::control_plane(
        &dir.join(name),
        options,
        PER_TENANT,
        None,
        Store::Redis(url),
    )
    .await;
    let err = format!("{:#}", refused.unwrap_err());
    assert!(err.contains("exited"), "{err}");
    std::fs::read_to_string(dir.join(name).join("sluice.log")).unwrap()
}

async fn start(
    dir: &std::path::Path,
    name: &str,
    algorithm: &str,
    url: &str,
    extra: &[&str],
) -> ControlPlane {
    let options = ControlPlaneOptions::new("limits: []\n", &dir.join(name))
        .args(extra.iter().map(|a| (*a).to_owned()));
    quotas::control_plane(
        &dir.join(name),
        options,
        PER_TENANT,
        Some(algorithm),
        Store::Redis(url),
    )
    .await
    .unwrap()
}

/// 300 calls for one tenant as fast as 16 in flight allow, alternating
/// between the control planes, started just after a second boundary:
/// admitted calls, and how long the burst took.
async fn burst(grpc: &[SocketAddr], tenant: &str) -> (usize, Duration, bool) {
    let into_second = unix_ms() % 1_000;
    tokio::time::sleep(Duration::from_millis((1_050 - into_second) % 1_000)).await;
    let start_ms = unix_ms();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let addr = grpc[worker % grpc.len()];
        let tenant = tenant.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(addr).await;
            let mut admitted = 0;
            for _ in 0..300 / 16 + usize::from(worker < 300 % 16) {
                let answer = ask(&mut client, &tenant).await;
                assert_eq!(error_header(&answer), None, "{answer:?}");
                if answer.overall_code == OK {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let one_window = unix_ms() / 1_000 == start_ms / 1_000;
    (admitted, started.elapsed(), one_window)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_on_one_redis_admit_exactly_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    two_control_planes_admit_exactly_the_quota(dir.path(), &redis.url()).await;
}

/// The same on a Redis Cluster of three masters with a replica each
/// (`redis+cluster://` naming the first node): the quota counters (a slot
/// per descriptor) and the replicas' keys (slot of `{fleet}`) live wherever
/// the cluster puts them, and the two control planes, which are also
/// replicas of one fleet, elect one leader there without a failed exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_on_a_redis_cluster_admit_exactly_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start(dir.path(), 3, 1).await.unwrap();
    let (a, b) = two_control_planes_admit_exactly_the_quota(dir.path(), &cluster.url()).await;
    let leader = replicas::wait_for_leader(&[&a, &b], Duration::from_secs(10)).await;
    let keys = cluster.keys_per_node().await.unwrap();
    if leader.is_err() {
        a.print_log();
        b.print_log();
        cluster.print_logs();
    }
    let (index, fence) = leader.unwrap();
    println!("replica {index} leads with fence {fence}; keys per node {keys:?}");
    assert!(keys.iter().sum::<u64>() > 0, "{keys:?}");
    for replica in [&a, &b] {
        let metrics = replica.admin().metrics().await.unwrap();
        assert!(
            !metrics
                .lines()
                .any(|l| l.starts_with("sluice_store_failures_total") && !l.ends_with(" 0")),
            "{metrics}"
        );
    }
}

/// Two control planes on the store at `url` admit exactly a tenant's quota
/// between them, per algorithm; returns the last pair.
async fn two_control_planes_admit_exactly_the_quota(
    dir: &std::path::Path,
    url: &str,
) -> (ControlPlane, ControlPlane) {
    let mut last = None;
    // Counting, not the store's latency on a shared machine, is what this
    // checks: a generous store timeout.
    let timeout = ["--store-timeout-ms", "2000"];
    for algorithm in ["fixed_window", "sliding_window", "gcra"] {
        let a = start(dir, &format!("{algorithm}-a"), algorithm, url, &timeout).await;
        // b serves its quotas on a listener of their own, from two threads
        // with a store connection each.
        let own = [
            "--rls-listen",
            "127.0.0.1:0",
            "--rls-threads",
            "2",
            "--store-timeout-ms",
            "2000",
        ];
        let b = start(dir, &format!("{algorithm}-b"), algorithm, url, &own).await;
        let grpc = [a.rls_addr(), b.rls_addr()];
        // A fresh tenant per attempt: a burst that straddles a second
        // boundary says nothing exact about fixed and sliding windows.
        let mut measured = None;
        for attempt in 0..3 {
            let (admitted, took, one_window) =
                burst(&grpc, &format!("{algorithm}-{attempt}")).await;
            if one_window {
                measured = Some((admitted, took));
                break;
            }
        }
        let (admitted, took) = measured.expect("no burst fitted in one second");
        println!("{algorithm}: {admitted} of 300 admitted in {took:?}");
        match algorithm {
            // A window that starts empty admits the quota exactly (the
            // sliding window's previous window is empty for a new tenant).
            "fixed_window" | "sliding_window" => assert_eq!(admitted, 100, "{algorithm}"),
            // GCRA: the burst (100) plus one hit per 10 ms of the burst.
            _ => {
                let refill = took.as_millis() as usize / 10 + 1;
                assert!(
                    (100..=100 + refill).contains(&admitted),
                    "gcra: {admitted} in {took:?}"
                );
            }
        }
        last = Some((a, b));
    }
    last.expect("three algorithms ran")
}

/// Behind Redis Sentinel (`redis+sentinel://`): the master is killed, the
/// sentinel promotes its replica, and the control plane follows it. Every
/// call meanwhile is answered at once by the failure policy (a gRPC error,
/// the default); counting resumes on the new master within seconds, with
/// the counts the replica had copied, and the control plane (a replica of
/// its fleet on the same store) leads again there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_to_the_new_master() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisSentinel::start(dir.path()).await.unwrap();
    let cp = start(dir.path(), "sentinel", "fixed_window", &redis.url(), &[]).await;
    let mut client = connect(cp.grpc_addr()).await;
    let counted = ask(&mut client, "failover").await;
    assert_eq!(error_header(&counted), None, "{counted:?}");
    assert!(counted.statuses[0].current_limit.is_some(), "{counted:?}");
    replicas::wait_for_leader(&[&cp], Duration::from_secs(10))
        .await
        .unwrap();

    redis.master.kill().unwrap();
    let killed = Instant::now();
    let bound = Duration::from_millis(50 + 250);
    let mut slowest = Duration::ZERO;
    let mut failed = 0;
    let recovered = loop {
        let asked = Instant::now();
        let answer = try_ask(&mut client, "failover").await;
        slowest = slowest.max(asked.elapsed());
        match answer {
            Ok(answer) => {
                assert_eq!(answer.overall_code, OK, "{answer:?}");
                assert_eq!(error_header(&answer), None, "{answer:?}");
                break killed.elapsed();
            }
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
        }
        failed += 1;
        if killed.elapsed() > Duration::from_secs(20) {
            redis.print_logs();
            cp.print_log();
            panic!("no new master followed within 20 s ({failed} calls failed)");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let master = redis.master_port().await.unwrap();
    println!(
        "counting again {recovered:?} after the master was killed ({failed} calls answered by \
         the failure policy meanwhile, the slowest in {slowest:?}); master now on {master}"
    );
    assert_eq!(
        master,
        redis.replica_port(),
        "the sentinel promoted the replica"
    );
    assert!(failed > 0, "the kill was noticed");
    assert!(slowest <= bound, "a call took {slowest:?}");
    replicas::wait_for_leader(&[&cp], Duration::from_secs(10))
        .await
        .unwrap_or_else(|err| {
            cp.print_log();
            panic!("{err:#}")
        });
    let log = std::fs::read_to_string(cp.log_path()).unwrap();
    assert!(log.contains("store master moved"), "{log}");
}

/// Redis stalled (SIGSTOP), then killed, then restarted empty, under the
/// three answers to a hit that cannot be counted: a gRPC error (the
/// default, as envoyproxy/ratelimit's), OK (`--quota-store-failure allow`)
/// and over limit (`deny`, here through `--quota-fail-closed`, which
/// existing command lines keep). Every call is answered within the store
/// timeout (plus a debug build's round trip); with Redis killed, at once,
/// as unavailable; and counting resumes after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_killed_and_restarted_fails_open_or_closed_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start(dir.path()).await.unwrap();
    let url = redis.url();
    let error = start(
        dir.path(),
        "error",
        "fixed_window",
        &url,
        &["--store-timeout-ms", "50"],
    )
    .await;
    let open_args = ["--store-timeout-ms", "50", "--quota-store-failure", "allow"];
    let open = start(dir.path(), "open", "fixed_window", &url, &open_args).await;
    // The third serves its quotas on a listener and thread of its own,
    // over a store connection of that thread's own.
    let closed_args = [
        "--store-timeout-ms",
        "50",
        "--quota-fail-closed",
        "--rls-listen",
        "127.0.0.1:0",
    ];
    let closed = start(dir.path(), "closed", "fixed_window", &url, &closed_args).await;
    assert_ne!(closed.rls_addr(), closed.grpc_addr());
    let mut error_client = connect(error.grpc_addr()).await;
    let mut open_client = connect(open.rls_addr()).await;
    let mut closed_client = connect(closed.rls_addr()).await;
    let counted = ask(&mut open_client, "outage").await;
    assert_eq!(error_header(&counted), None, "{counted:?}");
    assert!(counted.statuses[0].current_limit.is_some(), "{counted:?}");

    // Bounded: the store's timeout plus the round trip of a debug build.
    let bound = Duration::from_millis(50 + 250);
    let mut slowest = Duration::ZERO;
    let mut killed_reasons = Vec::new();
    for (outage, expected_reason) in [
        ("stalled", "store_timeout"),
        ("killed", "store_unavailable"),
    ] {
        if outage == "stalled" {
            redis.pause().unwrap();
        } else {
            redis.resume().unwrap();
            redis.kill().unwrap();
        }
        for _ in 0..10 {
            let asked = Instant::now();
            let refused = try_ask(&mut error_client, "outage").await.unwrap_err();
            slowest = slowest.max(asked.elapsed());
            assert_eq!(
                refused.code(),
                tonic::Code::Unavailable,
                "{outage}: {refused}"
            );
            let asked = Instant::now();
            let answer = ask(&mut open_client, "outage").await;
            let took = asked.elapsed();
            slowest = slowest.max(took);
            assert_eq!(answer.overall_code, OK, "{outage}: {answer:?}");
            let reason = error_header(&answer);
            assert!(reason.is_some(), "{outage}: {answer:?}");
            assert_eq!(reason, Some(expected_reason), "{outage}: {answer:?}");
            if outage == "killed" {
                // Refused at once, not after the store timeout.
                assert!(
                    took < Duration::from_millis(50),
                    "killed: a call took {took:?}"
                );
                killed_reasons.push(took);
            }
            let asked = Instant::now();
            let answer = ask(&mut closed_client, "outage").await;
            slowest = slowest.max(asked.elapsed());
            assert_eq!(answer.overall_code, OVER_LIMIT, "{outage}: {answer:?}");
            assert!(error_header(&answer).is_some(), "{outage}: {answer:?}");
        }
        assert!(slowest <= bound, "{outage}: a call took {slowest:?}");
    }
    println!("slowest call during the outages: {slowest:?}; with Redis killed: {killed_reasons:?}");
    let metrics = open.admin().metrics().await.unwrap();
    for reason in ["store_timeout", "store_unavailable"] {
        let series = format!(r#"sluice_quota_store_errors_total{{reason="{reason}"}}"#);
        assert!(metrics.contains(&series), "{series}\n{metrics}");
    }

    // Back (empty): all count again, each within a few seconds.
    redis
        .restart()
        .await
        .unwrap_or_else(|err| panic!("{err:#}"));
    let back = Instant::now();
    for client in [&mut error_client, &mut open_client, &mut closed_client] {
        loop {
            let answer = try_ask(client, "after").await;
            if let Ok(answer) = &answer
                && error_header(answer).is_none()
            {
                assert!(answer.statuses[0].current_limit.is_some(), "{answer:?}");
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(10),
                "no recovery: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    println!("counting again {:?} after the restart", back.elapsed());
    // Counting resumed in the shared store: the planes' hits add up (in
    // one window: a set that straddles a boundary is tried again).
    for attempt in 0..3 {
        let tenant = format!("resumed-{attempt}");
        let second = unix_ms() / 1_000;
        ask(&mut error_client, &tenant).await;
        ask(&mut open_client, &tenant).await;
        let answer = ask(&mut closed_client, &tenant).await;
        if unix_ms() / 1_000 == second {
            assert_eq!(answer.statuses[0].limit_remaining, 97, "{answer:?}");
            return;
        }
    }
    panic!("no set of calls fitted in one second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_store_with_a_password_counts_and_an_untrusted_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(&dir.path().join("certs")).unwrap();
    let password = "s3cret-store-password";
    let redis = RedisServer::start_tls(dir.path(), &certs, password)
        .await
        .unwrap();
    let password_file = dir.path().join("store-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let ca = certs.path(certs::CA).display().to_string();
    let password_arg = password_file.display().to_string();
    let trusted = [
        "--store-tls-ca",
        ca.as_str(),
        "--store-password-file",
        password_arg.as_str(),
    ];
    let control_plane = start(dir.path(), "tls", "fixed_window", &redis.url(), &trusted).await;
    let mut client = connect(control_plane.grpc_addr()).await;
    counts_two_calls(&mut client, "tls").await;
    // The system's roots do not know the test CA: no start.
    let log = refused_start(
        dir.path(),
        "untrusted",
        &redis.url(),
        &["--store-password-file", password_arg.as_str()],
    )
    .await;
    let expected = format!(
        "cannot connect to the store at {}",
        redis.url().replace("localhost", ":***@localhost")
    );
    assert!(log.contains(&expected), "{expected}\n{log}");
    assert!(log.contains("invalid peer certificate"), "{log}");
    assert!(!log.contains(password), "{log}");
}

/// Behind sentinels that speak only TLS and require a password of their
/// own (`rediss+sentinel://`, `--store-sentinel-password-file`), the
/// master's password in `--store-password-file`: the control plane finds
/// the master and counts there. Without the sentinels' password it does not
/// start, and its log says why without showing either password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinels_with_a_password_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(&dir.path().join("certs")).unwrap();
    let (password, sentinel_password) = ("s3cret-master", "s3cret-sentinel");
    let redis = RedisSentinel::start_tls(dir.path(), &certs, password, sentinel_password)
        .await
        .unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{text}\n")).unwrap();
        path.display().to_string()
    };
    let password_arg = write("store-password", password);
    let sentinel_password_arg = write("sentinel-password", sentinel_password);
    let ca = certs.path(certs::CA).display().to_string();
    let args = [
        "--store-tls-ca",
        ca.as_str(),
        "--store-password-file",
        password_arg.as_str(),
        "--store-sentinel-password-file",
        sentinel_password_arg.as_str(),
    ];
    let cp = start(
        dir.path(),
        "tls-sentinel",
        "fixed_window",
        &redis.tls_url(),
        &args,
    )
    .await;
    let mut client = connect(cp.grpc_addr()).await;
    counts_two_calls(&mut client, "tls-sentinel").await;

    // The sentinels refuse a client without their password: no start.
    let log = refused_start(
        dir.path(),
        "no-sentinel-password",
        &redis.tls_url(),
        &args[..4],
    )
    .await;
    assert!(
        log.contains("cannot connect to the store at rediss+sentinel://"),
        "{log}"
    );
    assert!(log.contains("--store-sentinel-password-file"), "{log}");
    assert!(
        !log.contains(password) && !log.contains(sentinel_password),
        "{log}"
    );
    println!(
        "{}",
        log.lines()
            .find(|l| l.contains("cannot connect"))
            .unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_authenticates_clients_takes_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::generate(&dir.path().join("certs")).unwrap();
    let password = "s3cret-store-password";
    let redis = RedisServer::start_mtls(dir.path(), &certs, password)
        .await
        .unwrap();
    let password_file = dir.path().join("store-password");
    std::fs::write(&password_file, password).unwrap();
    let file = |name| certs.path(name).display().to_string();
    let (ca, cert, key) = (
        file(certs::CA),
        file(certs::CLIENT_CERT),
        file(certs::CLIENT_KEY),
    );
    let password_arg = password_file.display().to_string();
    let with_cert = [
        "--store-tls-ca",
        ca.as_str(),
        "--store-tls-cert",
        cert.as_str(),
        "--store-tls-key",
        key.as_str(),
        "--store-password-file",
        password_arg.as_str(),
    ];
    let control_plane = start(dir.path(), "mtls", "fixed_window", &redis.url(), &with_cert).await;
    let mut client = connect(control_plane.grpc_addr()).await;
    let answer = ask(&mut client, "mtls").await;
    assert_eq!(error_header(&answer), None, "counted in Redis: {answer:?}");
    assert_eq!(answer.overall_code, 1, "{answer:?}");

    // Without a client certificate the server closes the handshake: no start.
    let log = refused_start(
        dir.path(),
        "no-cert",
        &redis.url(),
        &[
            "--store-tls-ca",
            ca.as_str(),
            "--store-password-file",
            password_arg.as_str(),
        ],
    )
    .await;
    assert!(log.contains("cannot connect to the store"), "{log}");
    assert!(!log.contains(password), "{log}");
}

/// Redis's count of `EVALSHA` calls (each ShouldRateLimit that reached it).
async fn evalsha_calls(redis: &RedisServer) -> u64 {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_fixed_window_is_answered_from_the_local_cache() {
    // Five a minute per tenant: the window cannot end during the test
    // unless it starts in the minute's last seconds (then wait).
    const PER_MINUTE: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let into_minute = unix_ms() % 60_000;
    if into_minute > 50_000 {
        tokio::time::sleep(Duration::from_millis(60_100 - into_minute)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let options = ControlPlaneOptions::new("limits: []\n", dir.path())
        .args(["--quota-local-cache-bytes".to_owned(), "65536".to_owned()]);
    let control_plane = quotas::control_plane(
        dir.path(),
        options,
        PER_MINUTE,
        Some("fixed_window"),
        Store::Redis(&redis.url()),
    )
    .await
    .unwrap();
    let mut client = connect(control_plane.grpc_addr()).await;
    let calls =
        |answers: &[RateLimitResponse]| answers.iter().map(|a| a.overall_code).collect::<Vec<_>>();

    let before = evalsha_calls(&redis).await;
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(ask(&mut client, "acme").await);
    }
    assert_eq!(calls(&answers), [OK, OK, OK, OK, OK, OVER_LIMIT]);
    assert_eq!(
        evalsha_calls(&redis).await - before,
        6,
        "each went to Redis"
    );

    // The window is full: the next calls are answered here, over limit,
    // with the time left, without waiting for Redis; their hits are
    // written behind (never swallowed: a charge made after the fact, or a
    // later refund, needs the true count).
    for _ in 0..20 {
        let answer = ask(&mut client, "acme").await;
        assert_eq!(answer.overall_code, OVER_LIMIT, "{answer:?}");
        assert_eq!(error_header(&answer), None);
        let status = &answer.statuses[0];
        assert_eq!(status.limit_remaining, 0);
        let reset = status.duration_until_reset.as_ref().unwrap();
        assert!(reset.seconds <= 60 && (reset.seconds > 0 || reset.nanos > 0));
    }
    let admin = control_plane.admin();
    sluice_integration_tests::wait::until(
        "the 26 hits of the window in Redis",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            let used = admin.quota_used("api", &[("tenant", "acme")]).await?;
            Ok((used == 26).then_some(()))
        },
    )
    .await
    .unwrap();
    let before = evalsha_calls(&redis).await;
    // Another tenant's counter is not full: it goes to Redis.
    assert_eq!(ask(&mut client, "other").await.overall_code, OK);
    assert_eq!(evalsha_calls(&redis).await, before + 1);
    let metrics = control_plane.admin().metrics().await.unwrap();
    assert_eq!(
        sluice_integration_tests::control_plane::sample(
            &metrics,
            "sluice_quota_local_cache_hits_total"
        ),
        20.0
    );
}
