//! envoyproxy/ratelimit's answers on the wire, replayed against `sluice
//! serve` over gRPC. The flows are those of its integration tests
//! (`test/integration/integration_test.go`: `testBasicBaseConfig`,
//! `testConfigReload`, `testShareThreshold`), of the scripts it runs
//! through Envoy (`integration-test/scripts/*.sh`) and of its service tests
//! (`test/service/ratelimit_test.go`), each case naming the one it
//! mirrors; the configurations are written here, in its format. Every
//! store runs them: in memory, Redis, Redis Sentinel and Redis Cluster
//! (the callers in `quotas_ratelimit.rs`), and each Redis store in the
//! variants those integration tests run (with a local cache, with
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, with both).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::google::protobuf::UInt64Value;
use envoy_types::pb::google::protobuf::value::Kind;
use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions, sample};
use sluice_integration_tests::quotas::{
    self, OK, OVER_LIMIT, RlsClient, Store, descriptor, request,
};
use sluice_integration_tests::wait;

const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;
const DAY: i32 = 4;

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A value no earlier run used (counters in a shared store outlive a run).
fn fresh(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Waits, if needed, so that at least `needed` of the current minute is
/// left (the flows that count a minute quota stay in one window).
async fn room_in_minute(needed: Duration) {
    let left = 60_000 - unix_ms() % 60_000;
    let needed = u64::try_from(needed.as_millis()).unwrap();
    if left < needed {
        tokio::time::sleep(Duration::from_millis(left + 50)).await;
    }
}

/// A status as compared: code, limit (requests per unit, unit), remaining.
type Shape = (i32, Option<(u32, i32)>, u32);

/// A status with a limit, as envoyproxy/ratelimit writes one (the reset
/// checked separately).
fn limited(code: i32, requests_per_unit: u32, unit: i32, remaining: u32) -> Shape {
    (code, Some((requests_per_unit, unit)), remaining)
}

fn shape(status: &DescriptorStatus) -> Shape {
    (
        status.code,
        status
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit)),
        status.limit_remaining,
    )
}

fn shapes(response: &RateLimitResponse) -> Vec<Shape> {
    response.statuses.iter().map(shape).collect()
}

/// envoyproxy/ratelimit's `CalculateReset`: the seconds left in the
/// unit's window now (whole seconds), within the second the call took.
fn assert_reset(status: &DescriptorStatus, window_s: u64, context: &str) {
    let reset = status
        .duration_until_reset
        .unwrap_or_else(|| panic!("{context}: no reset in {status:?}"));
    assert_eq!(reset.nanos, 0, "{context}: whole seconds: {status:?}");
    let now_s = unix_ms() / 1_000;
    let expected = window_s - now_s % window_s;
    let got = u64::try_from(reset.seconds).unwrap();
    assert!(
        got == expected || got == expected + 1 || (expected == window_s && got == 1),
        "{context}: reset {got} s, expected {expected} s: {status:?}"
    );
}

/// A variant of the integration tests' runs: its name (part of every
/// domain, so that runs on one store do not share counters) and its
/// `sluice serve` options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Variant {
    /// Part of the domains.
    pub name: &'static str,
    /// `LOCAL_CACHE_SIZE_IN_BYTES=1000`: `--quota-local-cache-bytes 1000`.
    pub local_cache: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`.
    pub stop_increment: bool,
}

impl Variant {
    fn args(self) -> Vec<String> {
        let mut args = Vec::new();
        if self.local_cache {
            args.extend(["--quota-local-cache-bytes".to_owned(), "1000".to_owned()]);
        }
        if self.stop_increment {
            args.push("--quota-stop-increment-when-over-limit".to_owned());
        }
        args
    }
}

/// The variants `TestBasicConfig` runs on Redis (without a second Redis
/// for per-second limits, which Sluice does not have).
pub(crate) const REDIS_VARIANTS: [Variant; 4] = [
    Variant {
        name: "plain",
        local_cache: false,
        stop_increment: false,
    },
    Variant {
        name: "cache",
        local_cache: true,
        stop_increment: false,
    },
    Variant {
        name: "stop",
        local_cache: false,
        stop_increment: true,
    },
    Variant {
        name: "cache-stop",
        local_cache: true,
        stop_increment: true,
    },
];

/// In memory there is no local cache (nothing to save a round trip to).
pub(crate) const MEMORY_VARIANTS: [Variant; 2] = [
    Variant {
        name: "plain",
        local_cache: false,
        stop_increment: false,
    },
    Variant {
        name: "stop",
        local_cache: false,
        stop_increment: true,
    },
];

/// The quota files of a variant's run (the shapes of the integration
/// tests' runtime configuration, written here).
fn files(variant: &str) -> Vec<(String, String)> {
    vec![
        (
            "basic.yaml".to_owned(),
            format!(
                "domain: basic-{variant}\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: second\n      requests_per_unit: 50\n  - key: one_per_minute\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
            ),
        ),
        (
            "another.yaml".to_owned(),
            format!(
                "domain: another-{variant}\ndescriptors:\n  - key: key2\n    rate_limit: {{unit: minute, requests_per_unit: 20}}\n  - key: key3\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n  - key: key4\n    rate_limit: {{unit: day, requests_per_unit: 20}}\n"
            ),
        ),
        (
            "costs.yaml".to_owned(),
            format!(
                "domain: costs-{variant}\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: hour, requests_per_unit: 100}}\n"
            ),
        ),
        (
            "share.yml".to_owned(),
            format!(
                "domain: share-{variant}\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n  - key: files_no_share\n    value: files_no_share/*\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n"
            ),
        ),
    ]
}

/// The runs of `variants` against the store at `store`, each on a control
/// plane of its own; the service's behaviours once, then the statistics'
/// names.
pub(crate) async fn replay(dir: &std::path::Path, store: Store<'_>, variants: &[Variant]) {
    for variant in variants {
        let run = dir.join(variant.name);
        std::fs::create_dir_all(&run).unwrap();
        let files = files(variant.name);
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(name, yaml)| (name.as_str(), yaml.as_str()))
            .collect();
        let options = ControlPlaneOptions::new("limits: []\n", &run)
            .args(variant.args())
            .args(
                [
                    "--reload-poll-ms",
                    "100",
                    // Counting, not the store's latency on a shared machine,
                    // is what these answers check.
                    "--store-timeout-ms",
                    "2000",
                ]
                .map(str::to_owned),
            );
        let (control_plane, quota_dir) =
            quotas::control_plane_with_files(&run, options, &borrowed, store)
                .await
                .unwrap();
        let mut client = RlsClient::connect(control_plane.grpc_addr()).await.unwrap();
        basic_config(&control_plane, &mut client, *variant).await;
        share_threshold(&mut client, variant.name).await;
        costs(&control_plane, &mut client, variant.name).await;
        if variant.name == "plain" {
            config_reload(&control_plane, &mut client, &quota_dir).await;
        }
    }
    service(dir, store).await;
}

/// A descriptor of `tenant` with its own hits, given back when `refund`.
fn costed(tenant: &str, hits: u64, refund: bool) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        is_negative_hits: refund,
        ..descriptor(&[("tenant", tenant)])
    }
}

/// Not envoyproxy/ratelimit's (it has no refunds, and its local cache and
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` lose charges made after the
/// fact): Envoy AI Gateway's calls, a check of no hits before a request
/// and its cost charged when the stream ends, counted in full on a quota
/// already spent (also when the local cache answers it: it is written
/// behind), and refunds (`is_negative_hits`) that give hits back, never
/// below zero, and are never answered from the cache.
async fn costs(control_plane: &ControlPlane, client: &mut RlsClient, variant: &str) {
    let domain = format!("costs-{variant}");
    let tenant = fresh("tenant");
    let tenant = tenant.as_str();
    room_in_hour(Duration::from_secs(20)).await;
    let mut call = async |hits: u64, refund: bool| {
        let answer = client
            .call(request(&domain, vec![costed(tenant, hits, refund)]))
            .await
            .unwrap();
        (answer.overall_code, answer.statuses[0].limit_remaining)
    };
    let context = |what: &str| format!("{variant}: {what}");
    assert_eq!(call(0, false).await, (OK, 100), "{}", context("a check"));
    assert_eq!(call(60, false).await, (OK, 40), "{}", context("a charge"));
    assert_eq!(
        call(70, false).await,
        (OVER_LIMIT, 0),
        "{}",
        context("over")
    );
    assert_eq!(
        call(0, false).await,
        (OVER_LIMIT, 0),
        "{}",
        context("spent")
    );
    // With the local cache this one is answered from it, and written
    // behind.
    assert_eq!(
        call(15, false).await,
        (OVER_LIMIT, 0),
        "{}",
        context("again")
    );
    let admin = control_plane.admin();
    let used = wait::until(
        &context("every charge in the store"),
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            let used = admin.quota_used(&domain, &[("tenant", tenant)]).await?;
            Ok((used == 145).then_some(used))
        },
    )
    .await
    .unwrap();
    assert_eq!(used, 145);
    assert_eq!(call(100, true).await, (OK, 55), "{}", context("a refund"));
    assert_eq!(call(0, false).await, (OK, 55), "{}", context("room again"));
    assert_eq!(call(1_000, true).await, (OK, 100), "{}", context("to zero"));
    assert_eq!(
        admin
            .quota_used(&domain, &[("tenant", tenant)])
            .await
            .unwrap(),
        0,
        "{}",
        context("nothing used")
    );
}

/// Waits, if needed, so that at least `needed` of the current hour is
/// left.
async fn room_in_hour(needed: Duration) {
    let left = 3_600_000 - unix_ms() % 3_600_000;
    let needed = u64::try_from(needed.as_millis()).unwrap();
    if left < needed {
        tokio::time::sleep(Duration::from_millis(left + 50)).await;
    }
}

/// `testBasicBaseConfig`: an unknown domain, a first hit, a minute quota
/// run over, two descriptors at once (one over its hour quota), and the
/// reset counting down; with their statistics.
async fn basic_config(control_plane: &ControlPlane, client: &mut RlsClient, variant: Variant) {
    let v = variant.name;
    let context = |what: &str| format!("{v}: {what}");
    // An unknown domain: OK, no limit, nothing remaining.
    let unknown = client.ask("foo", &[&[("hello", "world")]]).await.unwrap();
    assert_eq!(unknown.overall_code, OK, "{}", context("unknown domain"));
    assert_eq!(
        unknown.statuses,
        [DescriptorStatus {
            code: OK,
            ..DescriptorStatus::default()
        }]
    );
    // The first hit of 50 a second.
    let basic = format!("basic-{v}");
    let first = client.ask(&basic, &[&[("key1", "foo")]]).await.unwrap();
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        shapes(&first),
        [limited(OK, 50, SECOND, 49)],
        "{}",
        context("first hit")
    );
    assert_reset(&first.statuses[0], 1, &context("first hit"));

    // 25 hits on a fresh value of a 20-a-minute quota: 20 OK counting
    // down, then over limit with nothing left.
    let another = format!("another-{v}");
    room_in_minute(Duration::from_secs(5)).await;
    let value = fresh("k2");
    for i in 0..25_u32 {
        let answer = client
            .ask(&another, &[&[("key2", value.as_str())]])
            .await
            .unwrap();
        let (code, remaining) = if i >= 20 {
            (OVER_LIMIT, 0)
        } else {
            (OK, 19 - i)
        };
        assert_eq!(
            answer.overall_code,
            code,
            "{}",
            context(&format!("hit {i}"))
        );
        assert_eq!(
            shapes(&answer),
            [limited(code, 20, MINUTE, remaining)],
            "{}",
            context(&format!("hit {i}"))
        );
        assert_reset(&answer.statuses[0], 60, &context(&format!("hit {i}")));
    }
    // Two keys of one domain at once, fresh values: key3 (10 an hour)
    // goes over at the eleventh; with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
    // key2 stops counting then.
    let value = fresh("pair");
    for i in 0..15_u32 {
        let answer = client
            .ask(
                &another,
                &[&[("key2", value.as_str())], &[("key3", value.as_str())]],
            )
            .await
            .unwrap();
        let over = i >= 10;
        let key2_remaining = if over && variant.stop_increment {
            10
        } else {
            19 - i
        };
        let (key3_code, key3_remaining) = if over { (OVER_LIMIT, 0) } else { (OK, 9 - i) };
        assert_eq!(
            shapes(&answer),
            [
                limited(OK, 20, MINUTE, key2_remaining),
                limited(key3_code, 10, HOUR, key3_remaining),
            ],
            "{}",
            context(&format!("pair {i}"))
        );
        assert_eq!(answer.overall_code, if over { OVER_LIMIT } else { OK });
        assert_reset(&answer.statuses[1], 3_600, &context(&format!("pair {i}")));
    }
    // The reset counts down the unit's window: a day's.
    let day = client
        .ask(&another, &[&[("key4", "durTest")]])
        .await
        .unwrap();
    assert_eq!(shapes(&day)[0].1, Some((20, DAY)));
    assert_reset(&day.statuses[0], 86_400, &context("day"));

    // The statistics: ratelimit.service.rate_limit.<domain>.<key>.<stat>.
    let metrics = control_plane.admin().metrics().await.unwrap();
    let stat = |key: &str, stat: &str| {
        sample(
            &metrics,
            &format!(r#"sluice_quota_{stat}_total{{domain="{another}",key="{key}"}}"#),
        )
    };
    assert_eq!(
        sample(
            &metrics,
            &format!(r#"sluice_quota_total_hits_total{{domain="{basic}",key="key1"}}"#)
        ),
        1.0
    );
    assert_eq!(stat("key2", "total_hits"), 40.0, "{}", context("key2 hits"));
    assert_eq!(stat("key2", "over_limit"), 5.0, "{}", context("key2 over"));
    assert_eq!(stat("key3", "total_hits"), 15.0, "{}", context("key3 hits"));
    assert_eq!(stat("key3", "over_limit"), 5.0, "{}", context("key3 over"));
    // With a local cache, every over-limit hit after the first one found
    // over is answered from it.
    let cached = if variant.local_cache { 4.0 } else { 0.0 };
    assert_eq!(
        stat("key2", "over_limit_with_local_cache"),
        cached,
        "{}",
        context("key2 cached")
    );
    assert_eq!(
        stat("key3", "over_limit_with_local_cache"),
        cached,
        "{}",
        context("key3 cached")
    );
    // Within and near: 20 + 10 within for key2 in the first run (near from
    // 16), the pair's 10 (or 11) within.
    assert!(
        stat("key2", "within_limit") >= 30.0,
        "{}",
        context("key2 within")
    );
    assert!(
        stat("key2", "near_limit") >= 4.0,
        "{}",
        context("key2 near")
    );
}

/// `testShareThreshold`: values matching a `share_threshold` wildcard
/// share one counter; without it, each value has its own.
async fn share_threshold(client: &mut RlsClient, variant: &str) {
    let domain = format!("share-{variant}");
    for i in 0..10 {
        let answer = client
            .ask(&domain, &[&[("files", "files/a.pdf")]])
            .await
            .unwrap();
        assert_eq!(shapes(&answer), [limited(OK, 10, HOUR, 9 - i)], "{variant}");
    }
    let shared = client
        .ask(&domain, &[&[("files", "files/b.csv")]])
        .await
        .unwrap();
    assert_eq!(shared.overall_code, OVER_LIMIT, "{variant}: {shared:?}");
    assert_eq!(shapes(&shared), [limited(OVER_LIMIT, 10, HOUR, 0)]);
    for _ in 0..10 {
        let value = fresh("files_no_share/");
        let answer = client
            .ask(&domain, &[&[("files_no_share", value.as_str())]])
            .await
            .unwrap();
        assert_eq!(shapes(&answer), [limited(OK, 10, HOUR, 9)], "{variant}");
    }
}

/// `testConfigReload`: a file added to the configuration directory is
/// served within a poll, and its removal is too; each load counted in
/// `config_load_success`.
async fn config_reload(
    control_plane: &ControlPlane,
    client: &mut RlsClient,
    quota_dir: &std::path::Path,
) {
    let loads = |metrics: &str| sample(metrics, "sluice_quota_config_load_success_total");
    let before = loads(&control_plane.admin().metrics().await.unwrap());
    let unknown = client.ask("reload", &[&[("block", "foo")]]).await.unwrap();
    assert_eq!(
        unknown.statuses,
        [DescriptorStatus {
            code: OK,
            ..DescriptorStatus::default()
        }]
    );
    let file = quota_dir.join("reload.yaml");
    std::fs::write(
        &file,
        "domain: reload\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 50}\n  - key: block\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
    )
    .unwrap();
    let mut probe = client.clone();
    let served = wait::until(
        "the added file to be served",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let mut probe = probe.clone();
            async move {
                let answer = probe
                    .ask("reload", &[&[("block", "foo")]])
                    .await
                    .map_err(|status| anyhow::anyhow!("{status}"))?;
                Ok((answer.overall_code == OVER_LIMIT).then_some(answer))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(shapes(&served), [limited(OVER_LIMIT, 0, SECOND, 0)]);
    let key1 = probe.ask("reload", &[&[("key1", "foo")]]).await.unwrap();
    assert_eq!(shapes(&key1), [limited(OK, 50, SECOND, 49)]);
    let after = loads(&control_plane.admin().metrics().await.unwrap());
    assert!(after > before, "a load counted: {before} → {after}");
    // Removing the file is a reload too: the domain is gone.
    std::fs::remove_file(&file).unwrap();
    wait::until(
        "the removed file's domain to be gone",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let mut probe = probe.clone();
            async move {
                let answer = probe
                    .ask("reload", &[&[("block", "foo")]])
                    .await
                    .map_err(|status| anyhow::anyhow!("{status}"))?;
                Ok((answer.overall_code == OK).then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

/// The configuration of envoyproxy/ratelimit's example and service tests'
/// shapes (`examples/ratelimit/config/example.yaml`: replaces, shadow mode,
/// quota mode with metadata, a detailed metric, unlimited descriptors).
const SERVICE: &str = r#"
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
"#;

/// The service's behaviours, with the response headers and dynamic
/// metadata on (`LIMIT_RESPONSE_HEADERS_ENABLED`,
/// `RESPONSE_DYNAMIC_METADATA`).
async fn service(dir: &std::path::Path, store: Store<'_>) {
    let run = dir.join("service");
    std::fs::create_dir_all(&run).unwrap();
    let options = ControlPlaneOptions::new("limits: []\n", &run).args(
        [
            "--quota-response-headers",
            "--quota-response-dynamic-metadata",
            "--store-timeout-ms",
            "2000",
        ]
        .map(str::to_owned),
    );
    // Every test starts its store empty; the minute-quota flows start with
    // room in the minute.
    let (control_plane, _) =
        quotas::control_plane_with_files(&run, options, &[("example.yaml", SERVICE)], store)
            .await
            .unwrap();
    let mut client = RlsClient::connect(control_plane.grpc_addr()).await.unwrap();
    room_in_minute(Duration::from_secs(8)).await;

    // TestEmptyDomain, TestEmptyDescriptors: gRPC errors, word for word.
    let err = client.ask("", &[&[("hello", "world")]]).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::Unknown, "rate limit domain must not be empty")
    );
    let err = client.ask("rl", &[]).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            tonic::Code::Unknown,
            "rate limit descriptor list must not be empty"
        )
    );

    // TestUnlimited: a limit, no limit, unlimited.
    let fresh_foo = fresh("foo");
    let answer = client
        .ask(
            "rl",
            &[
                &[("foo", fresh_foo.as_str())],
                &[("hello", "world")],
                &[("qux", "x")],
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        shapes(&answer),
        [
            limited(OK, 2, MINUTE, 1),
            (OK, None, 0),
            (OK, None, u32::MAX),
        ]
    );
    assert_eq!(answer.statuses[2].duration_until_reset, None);

    // trigger-ratelimit.sh through /twoheader ([foo, bar] and [foo, baz]):
    // [foo, baz=not-so-shady] (3 a minute) refuses the fourth.
    let pelle = fresh("pelle");
    let two = |third: &'static str| {
        let pelle = pelle.clone();
        move || {
            request(
                "rl",
                vec![
                    descriptor(&[("foo", pelle.as_str()), ("bar", "x")]),
                    descriptor(&[("foo", pelle.as_str()), ("baz", third)]),
                ],
            )
        }
    };
    let not_so_shady = two("not-so-shady");
    for _ in 0..3 {
        let answer = client.call(not_so_shady()).await.unwrap();
        assert_eq!(answer.overall_code, OK, "{answer:?}");
    }
    let refused = client.call(not_so_shady()).await.unwrap();
    assert_eq!(refused.overall_code, OVER_LIMIT, "{refused:?}");
    // TestServiceWithDefaultRatelimitHeaders: the over-limit descriptor's
    // quota, nothing remaining and the seconds to its reset.
    let headers: Vec<(&str, &str)> = refused
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    let reset = refused.statuses[1]
        .duration_until_reset
        .unwrap()
        .seconds
        .to_string();
    assert_eq!(
        headers,
        [
            ("RateLimit-Limit", "3"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", reset.as_str()),
        ]
    );

    // trigger-shadow-mode-key.sh, TestRuleShadowMode: over its 3 a minute,
    // the shadow-mode descriptor still answers OK (nothing remaining).
    let pelle = fresh("pelle");
    for i in 0..5_u32 {
        let answer = client
            .call(request(
                "rl",
                vec![descriptor(&[("foo", pelle.as_str()), ("baz", "shady")])],
            ))
            .await
            .unwrap();
        assert_eq!(answer.overall_code, OK, "shadow hit {i}: {answer:?}");
        assert_eq!(
            shapes(&answer),
            [limited(OK, 3, MINUTE, 2_u32.saturating_sub(i))]
        );
    }

    // replaces.sh, through /twoheader, /fourheader and /fiveheader. `foo`
    // values are this run's own; the others are the script's.
    let (my_foo, foo_2, foo_3) = (fresh("my_foo"), fresh("foo_2"), fresh("foo_3"));
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let route = |headers: Headers<'_>, path: &str| -> Vec<Vec<(String, String)>> {
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let pair = |a: &str, b: &str| -> Option<Vec<(String, String)>> {
            Some(vec![(a.to_owned(), get(a)?), (b.to_owned(), get(b)?)])
        };
        let mut descriptors = Vec::new();
        match path {
            "twoheader" => {
                descriptors.extend(pair("foo", "bar"));
                descriptors.extend(pair("foo", "baz"));
            }
            "fourheader" | "fiveheader" => {
                descriptors.extend(pair("foo", "bar"));
                descriptors.extend(pair("source_cluster", "destination_cluster"));
                if path == "fiveheader"
                    && let Some(category) = get("category")
                {
                    descriptors.push(vec![("category".to_owned(), category)]);
                }
            }
            _ => unreachable!(),
        }
        descriptors
    };
    let mut step = 0;
    let mut expect = async |headers: Headers<'_>, path: &str, code: i32| {
        step += 1;
        let descriptors = route(headers, path);
        let answer = client
            .call(request(
                "rl",
                descriptors
                    .iter()
                    .map(|d| {
                        let pairs: Vec<(&str, &str)> =
                            d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                        descriptor(&pairs)
                    })
                    .collect(),
            ))
            .await
            .unwrap();
        assert_eq!(
            answer.overall_code, code,
            "replaces.sh step {step} ({path} {headers:?}): {answer:?}"
        );
    };
    let bk = "bkthomps";
    expect(&[("foo", bk), ("bar", "banned")], "twoheader", OVER_LIMIT).await;
    expect(
        &[
            ("foo", bk),
            ("bar", "banned"),
            ("source_cluster", "proxy"),
            ("destination_cluster", "mock"),
        ],
        "fourheader",
        OVER_LIMIT,
    )
    .await;
    for code in [OK, OK, OVER_LIMIT] {
        expect(
            &[
                ("foo", bk),
                ("bar", "banned"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "override"),
            ],
            "fourheader",
            code,
        )
        .await;
    }
    let my = my_foo.as_str();
    for code in [OK, OK, OVER_LIMIT] {
        expect(
            &[
                ("foo", my),
                ("bar", bk),
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ],
            "fourheader",
            code,
        )
        .await;
    }
    for code in [OK, OVER_LIMIT] {
        expect(
            &[
                ("foo", my),
                ("bar", bk),
                ("source_cluster", "proxy"),
                ("destination_cluster", "not_bkthomps"),
            ],
            "fourheader",
            code,
        )
        .await;
    }
    expect(
        &[
            ("foo", my),
            ("bar", bk),
            ("source_cluster", "proxy"),
            ("destination_cluster", "bkthomps"),
        ],
        "fourheader",
        OVER_LIMIT,
    )
    .await;
    for code in [OK, OK, OK, OK, OVER_LIMIT] {
        expect(
            &[
                ("foo", my),
                ("bar", bk),
                ("source_cluster", "proxy"),
                ("destination_cluster", "fake"),
                ("category", "account"),
            ],
            "fiveheader",
            code,
        )
        .await;
    }
    for code in [OK, OVER_LIMIT] {
        expect(&[("foo", foo_2.as_str()), ("bar", bk)], "twoheader", code).await;
    }
    for code in [OK, OK, OVER_LIMIT] {
        expect(
            &[
                ("foo", foo_3.as_str()),
                ("bar", "bar_3"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "fake"),
            ],
            "fourheader",
            code,
        )
        .await;
    }
    expect(
        &[
            ("foo", my),
            ("bar", bk),
            ("source_cluster", "proxy"),
            ("destination_cluster", "fake"),
            ("category", "account"),
        ],
        "fiveheader",
        OVER_LIMIT,
    )
    .await;

    // quota.sh, TestServiceQuotaModeOnlySomeOverTheLimit,
    // TestMetadataReturnedForPassedDescriptors: two quota-mode
    // descriptors (1 and 2 a minute) refuse only when both are over; the
    // dynamic metadata holds the passed ones' `metadata` (the first one's
    // value where both have one).
    let quota = || {
        request(
            "rl",
            vec![
                descriptor(&[("service", "service_1")]),
                descriptor(&[("service", "service_2")]),
            ],
        )
    };
    let passed_service = |answer: &RateLimitResponse| -> Option<String> {
        let metadata = answer.dynamic_metadata.as_ref()?;
        let Some(Kind::StructValue(passed)) = metadata.fields.get("metadata")?.kind.as_ref() else {
            return None;
        };
        let Some(Kind::StructValue(service)) =
            passed.fields.get("service_with_quota")?.kind.as_ref()
        else {
            return None;
        };
        match service.fields.get("name")?.kind.as_ref()? {
            Kind::StringValue(name) => Some(name.clone()),
            _ => None,
        }
    };
    let first = client.call(quota()).await.unwrap();
    assert_eq!(
        shapes(&first),
        [limited(OK, 1, MINUTE, 0), limited(OK, 2, MINUTE, 1)],
        "{first:?}"
    );
    assert_eq!(passed_service(&first).as_deref(), Some("service_1"));
    let domain = first
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get("domain"))
        .and_then(|v| v.kind.clone());
    assert_eq!(domain, Some(Kind::StringValue("rl".to_owned())));
    let second = client.call(quota()).await.unwrap();
    assert_eq!(second.overall_code, OK, "one quota left: {second:?}");
    assert_eq!(
        shapes(&second),
        [limited(OVER_LIMIT, 1, MINUTE, 0), limited(OK, 2, MINUTE, 0)]
    );
    assert_eq!(passed_service(&second).as_deref(), Some("service_2"));
    let third = client.call(quota()).await.unwrap();
    assert_eq!(
        third.overall_code, OVER_LIMIT,
        "both quotas spent: {third:?}"
    );
    assert_eq!(passed_service(&third), None);

    // token-quota.sh: a check without hits (`hits_addend: 0`) counts
    // nothing; TestConfigLimitOverride: a limit in the request counts
    // under it.
    let token = fresh("token");
    let mut check = request("rl", vec![descriptor(&[("foo", token.as_str())])]);
    if let Some(first) = check.descriptors.first_mut() {
        first.hits_addend = Some(UInt64Value { value: 0 });
    }
    for _ in 0..3 {
        let answer = client.call(check.clone()).await.unwrap();
        assert_eq!(shapes(&answer), [limited(OK, 2, MINUTE, 2)], "{answer:?}");
    }
    let mut overridden = request("rl", vec![descriptor(&[("foo", token.as_str())])]);
    if let Some(first) = overridden.descriptors.first_mut() {
        first.limit = Some(RateLimitOverride {
            requests_per_unit: 42,
            unit: HOUR,
        });
    }
    let answer = client.call(overridden).await.unwrap();
    assert_eq!(shapes(&answer), [limited(OK, 42, HOUR, 41)]);

    // value-included-in-stats-key-when-unspecified.sh: a detailed metric
    // names the value; the third hit of 2 a minute is over.
    let unspecified = fresh("unspecified_value");
    for code in [OK, OK, OVER_LIMIT] {
        let answer = client
            .ask("rl", &[&[("unspec", unspecified.as_str())]])
            .await
            .unwrap();
        assert_eq!(answer.overall_code, code);
    }
    let metrics = control_plane.admin().metrics().await.unwrap();
    let over = sample(
        &metrics,
        &format!(r#"sluice_quota_over_limit_total{{domain="rl",key="unspec_{unspecified}"}}"#),
    );
    assert_eq!(over, 1.0, "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            r#"sluice_quota_should_rate_limit_error_total{err_type="service_error"}"#
        ),
        2.0
    );
}
