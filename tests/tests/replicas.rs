//! Control-plane replicas on one real Redis.
//!
//! - The lease and its fence, the shares and the table, driven through the
//!   replica API against a real `redis-server`: one leader at a time, a
//!   leader whose lease went to another cannot write, a flushed store
//!   hands out no fence below one in use, a store of another layout is
//!   refused; shares carry the upstream signals of the adaptive buckets,
//!   and a vanished share's signals are not counted again.
//! - Real Envoys, real replicas: the leader, holding every proxy's stream,
//!   is SIGKILLed under load at 4× the fleet limit; another replica takes
//!   the lease, the proxies land on the survivors, and the fleet holds its
//!   limit throughout and within ±2 % once they are back.
//! - Redis SIGKILLed under the same kind of load for three times the
//!   replicas' store grace (past which they let their proxies go): no
//!   request harmed, the limit held, admin writes 503 with nothing changed;
//!   Redis back empty: rebuilt without a step.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_control_plane::fleet::health::UpstreamHealth;
use sluice_control_plane::fleet::{BucketLoad, BucketTraffic, FleetLoad};
use sluice_control_plane::replicas::{Replica, ReplicaError, ReplicaOptions, Upstream};
use sluice_control_plane::store::{DEFAULT_TIMEOUT, Keys, Store, StoreOptions};
use sluice_core::histogram::LatencyHistogram;
use sluice_integration_tests::control_plane::AdminClient;
use sluice_integration_tests::fake_proxy::FakeProxy;
use sluice_integration_tests::fault_proxy::FaultProxy;
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::redis::RedisServer;
use sluice_integration_tests::replicas::{ReplicaSet, ReplicaSetOptions, wait_for_leader};
use sluice_integration_tests::wait;
use sluice_proto::v1::{BucketCount, Directive, ModePolicy, UpstreamSignal};

fn options(id: &str) -> ReplicaOptions {
    ReplicaOptions {
        id: id.to_owned(),
        control_interval: Duration::from_millis(200),
        store_grace: Duration::from_secs(10),
    }
}

fn ids(proxies: &[&str]) -> Vec<String> {
    proxies.iter().map(|&p| p.to_owned()).collect()
}

async fn connect(redis: &RedisServer) -> Store {
    let options = StoreOptions::from_args(&redis.url(), None, DEFAULT_TIMEOUT).unwrap();
    Store::connect(&options).await.unwrap()
}

fn directive(bucket: &str, drop_ratio: f64) -> Directive {
    Directive {
        bucket: bucket.to_owned(),
        drop_ratio,
        limit_rps: Some(100.0),
        ..Directive::default()
    }
}

fn load(bucket: &str, offered_rps: f64) -> FleetLoad {
    FleetLoad::new(vec![BucketTraffic::single(
        bucket,
        BucketLoad {
            offered_rps,
            admitted_rps: offered_rps,
            proxies_reporting: 1,
            stale_share: 0.0,
            requests_rps: 0.0,
        },
    )])
}

/// A real `redis-server` in a temp dir (kept while the test runs) and a
/// store on it.
async fn redis_store() -> (tempfile::TempDir, RedisServer, Store) {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let store = connect(&redis).await;
    (dir, redis, store)
}

async fn redis_cmd(store: &Store, args: &[&str]) {
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    let mut connection = store.connection();
    command
        .query_async::<redis::Value>(&mut connection)
        .await
        .unwrap();
}

#[tokio::test]
async fn one_leader_a_fence_and_shares_through_a_real_redis() {
    let (_dir, _redis, store) = redis_store().await;
    let keys = Keys::default();
    let mut a = Replica::join(store.clone(), options("a")).await.unwrap();
    let mut b = Replica::join(store.clone(), options("b")).await.unwrap();

    // Shares add up over the replicas.
    let _ = a
        .share(load("acme", 100.0), &[], Upstream::new())
        .await
        .unwrap();
    let shared = b
        .share(load("acme", 50.0), &[], Upstream::new())
        .await
        .unwrap();
    assert!(
        !shared.complete,
        "a replica that just joined decides on nothing"
    );
    // A replica adopts tables only once it has shared for a whole share
    // lifetime (1 s here): before, a table may not have counted it.
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let _ = a
        .share(load("acme", 100.0), &[], Upstream::new())
        .await
        .unwrap();
    let shared = b
        .share(load("acme", 50.0), &[], Upstream::new())
        .await
        .unwrap();
    assert!(shared.complete);
    assert_eq!(shared.replicas, 2);
    let acme = shared.total.get("acme").unwrap();
    assert_eq!(acme.load.offered_rps, 150.0);
    assert_eq!(acme.load.proxies_reporting, 2);

    // One leader; the other follows its table.
    assert_eq!(a.lead().await.unwrap(), Some(1));
    assert_eq!(b.lead().await.unwrap(), None);
    assert!(
        a.publish(1, &[directive("acme", 0.5)], &[], ModePolicy::default())
            .await
            .unwrap()
    );
    assert!(b.follow().await.unwrap());
    assert_eq!(b.table().fence, 1);
    assert_eq!(
        b.table().directives().next().map(|d| d.drop_ratio),
        Some(0.5)
    );

    // `a` is paused past its lease: the lease expires and `b` takes it
    // under a new fence. When `a` wakes up and writes under its old fence,
    // the store refuses it.
    redis_cmd(&store, &["DEL", &keys.leader]).await;
    assert_eq!(b.lead().await.unwrap(), Some(2));
    assert!(
        !a.publish(1, &[directive("acme", 0.9)], &[], ModePolicy::default())
            .await
            .unwrap(),
        "a fenced-off leader must not write"
    );
    assert_eq!(a.fence(), None);
    assert!(
        b.publish(2, &[directive("acme", 0.3)], &[], ModePolicy::default())
            .await
            .unwrap()
    );
    assert!(a.follow().await.unwrap());
    assert_eq!(a.table().fence, 2);
    assert_eq!(
        a.table().directives().next().map(|d| d.drop_ratio),
        Some(0.3)
    );

    // A flushed store: the next lease gets a fence above any in use, the
    // table is written again although it did not change, and the format
    // key comes back with the next share.
    redis_cmd(&store, &["FLUSHALL"]).await;
    assert!(!a.follow().await.unwrap());
    let fence = b.lead().await.unwrap().unwrap();
    assert!(fence > 2, "fence {fence} after a flush");
    assert_eq!(a.lead().await.unwrap(), None);
    assert!(
        b.publish(fence, &[], &[], ModePolicy::default())
            .await
            .unwrap()
    );
    assert!(a.follow().await.unwrap());
    assert_eq!(a.table().fence, fence);
    assert_eq!(a.table().len(), 1, "the table survived the flush");
    let _ = b
        .share(load("acme", 1.0), &[], Upstream::new())
        .await
        .unwrap();

    // A store written by another layout is refused, not misread.
    redis_cmd(&store, &["SET", &keys.format, "2"]).await;
    let err = Replica::join(store.clone(), options("c"))
        .await
        .unwrap_err();
    assert!(matches!(err, ReplicaError::Format { .. }), "{err}");
    assert!(err.to_string().contains("format 2"), "{err}");
    let err = a
        .share(load("acme", 1.0), &[], Upstream::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("format 2"), "{err}");
}

/// A replica's exchanges are bounded by half a control interval (at
/// least 100 ms), not by `--store-timeout-ms` (a request's bound, 50 ms by
/// default): a store 70 ms away is slow for a request but fine for a
/// replica; one 300 ms away is not.
#[tokio::test]
async fn a_replica_waits_for_a_slow_store_up_to_its_own_bound() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let slow = FaultProxy::start(redis.addr()).await.unwrap();
    let url = format!("redis://{}/0", slow.addr());
    let options_50ms = StoreOptions::from_args(&url, None, DEFAULT_TIMEOUT).unwrap();
    let store = Store::connect(&options_50ms).await.unwrap();
    let mut replica = Replica::join(store, options("a")).await.unwrap();
    // Once, at full speed: the server learns the lease script (the first
    // call of a script takes a second round trip).
    assert_eq!(replica.lead().await.unwrap(), Some(1));
    slow.delay(Duration::from_millis(70));
    let shared = replica
        .share(load("acme", 10.0), &[], Upstream::new())
        .await
        .unwrap();
    assert_eq!(shared.replicas, 1);
    assert_eq!(replica.lead().await.unwrap(), Some(1));
    slow.delay(Duration::from_millis(300));
    let err = replica
        .share(load("acme", 10.0), &[], Upstream::new())
        .await
        .unwrap_err();
    // The replica's own bound, from its connection or its own timer.
    let timed_out = match &err {
        ReplicaError::Timeout(_) => true,
        ReplicaError::Store(err) => err.is_timeout(),
        ReplicaError::Format { .. } => false,
    };
    assert!(timed_out, "{err}");
}

/// A replica whose share vanishes (cut off from the store, or dead) may
/// still have proxies enforcing its last table: the others keep counting
/// that share until its proxies show up in a live share.
#[tokio::test]
async fn a_vanished_share_counts_until_its_proxies_are_served_elsewhere() {
    let (_dir, _redis, store) = redis_store().await;
    let keys = Keys::default();
    let mut a = Replica::join(store.clone(), options("a")).await.unwrap();
    let mut b = Replica::join(store.clone(), options("b")).await.unwrap();
    let _ = a
        .share(load("acme", 100.0), &ids(&["envoy-a"]), Upstream::new())
        .await
        .unwrap();
    let shared = b
        .share(load("acme", 50.0), &ids(&["envoy-b"]), Upstream::new())
        .await
        .unwrap();
    assert_eq!((shared.replicas, shared.orphans), (2, 0));

    // `a`'s share expires (as it does one share lifetime after `a` last
    // reached the store): `b` still counts it, and its view stays whole.
    redis_cmd(&store, &["DEL", &keys.load("a")]).await;
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let shared = b
        .share(load("acme", 50.0), &ids(&["envoy-b"]), Upstream::new())
        .await
        .unwrap();
    assert_eq!((shared.replicas, shared.orphans), (1, 1));
    assert!(shared.complete, "an orphaned share keeps the view whole");
    assert_eq!(shared.total.get("acme").unwrap().load.offered_rps, 150.0);

    // `a`'s proxy moves to `b`: counted once more for this interval at
    // most, then `a`'s last share is dropped.
    let both = ids(&["envoy-a", "envoy-b"]);
    let shared = b
        .share(load("acme", 150.0), &both, Upstream::new())
        .await
        .unwrap();
    assert_eq!((shared.replicas, shared.orphans), (1, 0));
    assert_eq!(shared.total.get("acme").unwrap().load.offered_rps, 150.0);
    let shared = b
        .share(load("acme", 150.0), &both, Upstream::new())
        .await
        .unwrap();
    assert_eq!((shared.replicas, shared.orphans), (1, 0));
    assert!(shared.complete);
}

fn signals(bucket: &str, responses: u64, errors: u64, latency_us: u64) -> Upstream {
    let mut latency = LatencyHistogram::default();
    for _ in 0..responses {
        latency.record(latency_us);
    }
    let health = UpstreamHealth {
        responses,
        errors,
        latency,
    };
    Upstream::from([(bucket.to_owned(), health)])
}

#[tokio::test]
async fn the_leader_adapts_on_every_replicas_upstream_signals() {
    let (_dir, _redis, store) = redis_store().await;
    let keys = Keys::default();
    let mut a = Replica::join(store.clone(), options("a")).await.unwrap();
    let mut b = Replica::join(store.clone(), options("b")).await.unwrap();
    // `a`'s proxies see a failing, slow upstream; `b`'s a healthy one.
    let _ = a
        .share(
            load("acme", 100.0),
            &ids(&["envoy-a"]),
            signals("acme", 100, 60, 400_000),
        )
        .await
        .unwrap();
    let shared = b
        .share(
            load("acme", 100.0),
            &ids(&["envoy-b"]),
            signals("acme", 100, 0, 2_000),
        )
        .await
        .unwrap();
    let acme = &shared.upstream["acme"];
    assert_eq!((acme.responses, acme.errors), (200, 60));
    assert_eq!(acme.error_ratio(), Some(0.3));
    // Half the responses took 400 ms: the fleet p99 is `a`'s.
    let p99 = acme.latency_quantile(0.99).unwrap();
    assert!(p99 >= Duration::from_millis(400), "{p99:?}");

    // `a`'s share vanishes: its load still counts, its signals do not
    // (they were this interval's news once).
    redis_cmd(&store, &["DEL", &keys.load("a")]).await;
    let shared = b
        .share(
            load("acme", 100.0),
            &ids(&["envoy-b"]),
            signals("acme", 100, 0, 2_000),
        )
        .await
        .unwrap();
    assert_eq!(shared.orphans, 1);
    assert_eq!(shared.total.get("acme").unwrap().load.offered_rps, 200.0);
    let acme = &shared.upstream["acme"];
    assert_eq!((acme.responses, acme.errors), (100, 0));
}

const ADAPTIVE_LIMITS: &str = r#"
limits:
  - bucket: "api"
    limit_rps: 1000
adaptive:
  - bucket: "api"
    signal: errors
    max_error_ratio: 0.1
    min_rps: 40
    max_rps: 1000
"#;

/// One report window's signals for bucket `api`: `responses`, `errors` of
/// them 5xx, each answered in 2 ms.
fn api_signal(responses: u64, errors: u64) -> UpstreamSignal {
    let mut latency = LatencyHistogram::default();
    for _ in 0..responses {
        latency.record(2_000);
    }
    UpstreamSignal {
        bucket: "api".to_owned(),
        responses,
        errors,
        latency: latency.to_wire(),
    }
}

/// Real replicas: a proxy on r0 sees half its requests fail, a proxy on r1
/// sees none. Each replica alone would call the upstream failing (0.5) or
/// healthy (0); both see the fleet's ratio, in between, and lower the
/// limit alike, so whichever leads (now or after a failover) adapts on the
/// whole fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_adapts_on_the_whole_fleets_upstream_signals() {
    let set = ReplicaSet::start(ReplicaSetOptions::new(ADAPTIVE_LIMITS, 2, 0))
        .await
        .unwrap();
    let counts = vec![BucketCount {
        bucket: "api".to_owned(),
        offered: 10,
        admitted: 10,
        ..BucketCount::default()
    }];
    let report_every = Duration::from_millis(100);
    let mut failing = FakeProxy::connect(set.grpc_addrs()[0], "envoy-failing", None)
        .await
        .unwrap();
    failing.report_every_with_upstream(report_every, counts.clone(), vec![api_signal(20, 10)]);
    let mut healthy = FakeProxy::connect(set.grpc_addrs()[1], "envoy-healthy", None)
        .await
        .unwrap();
    healthy.report_every_with_upstream(report_every, counts, vec![api_signal(20, 0)]);

    // Both replicas lowered the limit on a ratio neither proxy saw alone.
    let seen = wait::until(
        "both replicas lowering api on the fleet's error ratio",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let mut views = Vec::new();
            for replica in &set.replicas {
                let reply = replica.admin().adaptive().await?;
                let api = reply["buckets"]
                    .as_array()
                    .and_then(|buckets| buckets.iter().find(|b| b["bucket"] == "api"))
                    .cloned()
                    .unwrap_or_default();
                views.push(api);
            }
            let lowered = views.iter().all(|api| {
                let ratio = api["error_ratio"].as_f64().unwrap_or(-1.0);
                let limit = api["limit_rps"].as_f64().unwrap_or(1000.0);
                (0.1..0.45).contains(&ratio) && limit < 1000.0
            });
            Ok(lowered.then_some(views))
        },
    )
    .await;
    if seen.is_err() {
        set.print_logs();
    }
    let seen = seen.unwrap();
    println!("{seen:#?}");
    for api in &seen {
        assert!(
            api["reason"].as_str().unwrap().contains("error ratio"),
            "{api}"
        );
    }
}

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 150
"#;
const LIMIT_RPS: f64 = 150.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_the_fleet_holds_its_limit() {
    a_killed_leader_is_replaced_and_the_fleet_holds_its_limit_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module, which dials the replicas
/// itself (`control_plane_uri` lists all three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_a_killed_leader_is_replaced_and_the_fleet_holds_its_limit() {
    a_killed_leader_is_replaced_and_the_fleet_holds_its_limit_on(DataPlane::Native).await;
}

async fn a_killed_leader_is_replaced_and_the_fleet_holds_its_limit_on(data_plane: DataPlane) {
    // Only r0 runs when the Envoys start, so every stream is on r0 and r0
    // leads: killing it takes the leader and every proxy's stream at once.
    let mut options = ReplicaSetOptions::new(LIMITS, 3, 3);
    options.data_plane = data_plane;
    options.replicas_at_start = 1;
    // The filter keeps applying its last ratio while it reconnects; the
    // restart test explains why the allowance is off here.
    options.filter = json!({"decision": "credit", "allowance": null});
    let mut set = ReplicaSet::start(options).await.unwrap();
    let interval = set.control_interval();
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &set.url(0).unwrap(), "acme", 300.0),
            StreamSpec::new("B/acme", &set.url(1).unwrap(), "acme", 200.0),
            StreamSpec::new("C/acme", &set.url(2).unwrap(), "acme", 100.0),
        ],
        Duration::from_secs(30),
    ))
    .unwrap();
    let old_fence = set
        .start_the_rest_once_r0_leads_every_stream("acme")
        .await
        .unwrap();

    // Converge (and let Envoy's health checks see r1 and r2), then kill
    // the leader.
    tokio::time::sleep(Duration::from_secs(7).saturating_sub(load.elapsed())).await;
    set.replicas[0].kill().unwrap();
    let killed_at = load.elapsed();
    let survivors = [&set.replicas[1], &set.replicas[2]];
    // Both watched at once: each time is when it happened, not when the
    // other wait ended.
    let ((new_leader, new_leader_at), (back_on, reconnected_at)) = tokio::join!(
        async {
            let leader = wait_for_leader(&survivors, Duration::from_secs(5)).await;
            (leader, load.elapsed())
        },
        async {
            let back = connected(&[survivors[0].admin(), survivors[1].admin()], 3).await;
            (back, load.elapsed())
        },
    );

    let back = Window {
        from: reconnected_at + interval * 2,
        to: reconnected_at + interval * 2 + Duration::from_secs(4),
    };
    tokio::time::sleep(back.to.saturating_sub(load.elapsed())).await;
    load.stop();
    let result = load.finish().await.unwrap();
    let before = Window {
        from: killed_at.saturating_sub(Duration::from_secs(2)),
        to: killed_at,
    };
    let during = Window {
        from: killed_at,
        to: reconnected_at + interval * 2,
    };
    let whole = Window {
        from: Duration::ZERO,
        to: back.to,
    };
    let admitted = |window: Window| rate(result.tenant_counts(window, "acme").ok, window);
    let (admitted_before, admitted_during, admitted_back) =
        (admitted(before), admitted(during), admitted(back));
    let summary = format!(
        "killed at {killed_at:?}, new leader {new_leader:?} at {new_leader_at:?}, all three \
         proxies back at {reconnected_at:?}\nbefore: {}during: {}back: {}\n{}",
        result.summary(before),
        result.summary(during),
        result.summary(back),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    let all = result.tenant_counts(whole, "acme");
    let holds = within(admitted_during, LIMIT_RPS, 0.10)
        && within(admitted_back, LIMIT_RPS, 0.02)
        && new_leader.is_ok()
        && back_on.is_ok()
        && all.errors == 0;
    if !holds {
        set.print_logs();
    }
    let (_, new_fence) = new_leader.unwrap();
    assert!(new_fence > old_fence, "fence {new_fence} after {old_fence}");
    back_on.unwrap();
    // Measured 0.16-0.32 s here (the filter's first retry waits at most
    // 250 ms); the bound is two default control intervals, loose enough
    // for a loaded machine.
    let moved = reconnected_at.saturating_sub(killed_at);
    assert!(
        moved <= Duration::from_secs(1),
        "the proxies took {moved:?} to land on another replica\n{summary}"
    );
    assert_eq!(all.server_errors, 0, "no 5xx at any time\n{summary}");
    assert_eq!(all.errors, 0, "no failed requests at any time\n{summary}");
    assert!(
        within(admitted_before, LIMIT_RPS, 0.05),
        "before the kill {admitted_before:.1} rps\n{summary}"
    );
    assert!(
        within(admitted_during, LIMIT_RPS, 0.10),
        "while the leader was down {admitted_during:.1} rps, limit {LIMIT_RPS}\n{summary}"
    );
    assert!(
        within(admitted_back, LIMIT_RPS, 0.02),
        "from two intervals after the proxies were back {admitted_back:.1} rps, limit \
         {LIMIT_RPS}\n{summary}"
    );
}

/// Waits until `proxies` streams are open on the replicas behind `admins`
/// together, each having reported since it connected.
async fn connected(admins: &[&AdminClient], proxies: usize) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let mut open = 0;
        for admin in admins {
            if let Ok(reply) = admin.proxies().await {
                open += reply
                    .proxies
                    .iter()
                    .filter(|p| p.connected && p.since_last_report_ms < 500)
                    .count();
            }
        }
        if open >= proxies {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("{open} of {proxies} proxies connected to the survivors after 8 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_harms_no_request_and_an_empty_store_is_rebuilt_without_a_step() {
    let mut options = ReplicaSetOptions::new(LIMITS, 2, 2);
    options.filter = json!({"decision": "credit", "allowance": null});
    // A 3 s grace instead of the default 10 s, and an outage of three
    // times it, as 30 s would be for the default: past the grace the
    // replicas let their proxies go, and the proxies keep their last
    // directives on their own.
    let store_grace = Duration::from_secs(3);
    options.replica_args = vec![
        "--store-grace-ms".to_owned(),
        store_grace.as_millis().to_string(),
    ];
    let outage_length = store_grace * 3;
    let mut set = ReplicaSet::start(options).await.unwrap();
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &set.url(0).unwrap(), "acme", 400.0),
            StreamSpec::new("B/acme", &set.url(1).unwrap(), "acme", 200.0),
        ],
        Duration::from_secs(50),
    ))
    .unwrap();
    let replicas: Vec<_> = set.replicas.iter().collect();
    let (_, old_fence) = wait_for_leader(&replicas, Duration::from_secs(5))
        .await
        .unwrap();

    // Converge, then take Redis away and bring it back empty. Meanwhile,
    // within the grace, an admin write answers 503 and changes nothing.
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(load.elapsed())).await;
    set.redis.kill().unwrap();
    let killed_at = load.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = reqwest::Client::new();
    let limit_url = |replica: usize| {
        format!(
            "http://{}/v1/limits/acme",
            set.replicas[replica].admin_addr()
        )
    };
    let refused = client
        .put(limit_url(1))
        .json(&json!({"limit_rps": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    for replica in 0..2 {
        let limit: serde_json::Value = client
            .get(limit_url(replica))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(limit["limit_rps"], json!(LIMIT_RPS), "replica {replica}");
    }
    tokio::time::sleep((killed_at + outage_length).saturating_sub(load.elapsed())).await;
    set.redis.restart().await.unwrap();
    let restarted_at = load.elapsed();
    let replicas: Vec<_> = set.replicas.iter().collect();
    let new_leader = wait_for_leader(&replicas, Duration::from_secs(5)).await;
    let led_at = load.elapsed();
    let after = Window {
        from: restarted_at,
        to: restarted_at + Duration::from_secs(4),
    };
    tokio::time::sleep(after.to.saturating_sub(load.elapsed())).await;
    load.stop();
    let result = load.finish().await.unwrap();
    let before = Window {
        from: killed_at.saturating_sub(Duration::from_secs(2)),
        to: killed_at,
    };
    let outage = Window {
        from: killed_at,
        to: restarted_at,
    };
    let whole = Window {
        from: Duration::ZERO,
        to: after.to,
    };
    let admitted = |window: Window| rate(result.tenant_counts(window, "acme").ok, window);
    let (admitted_before, admitted_outage, admitted_after) =
        (admitted(before), admitted(outage), admitted(after));
    let summary = format!(
        "Redis killed at {killed_at:?}, restarted empty at {restarted_at:?}, leader \
         {new_leader:?} at {led_at:?}\nbefore: {}outage: {}after: {}\n{}",
        result.summary(before),
        result.summary(outage),
        result.summary(after),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    let all = result.tenant_counts(whole, "acme");
    // No step when the store comes back empty: right after it, the fleet
    // admits what the kept directives admitted during the outage (within
    // 2 %) until the new leader has shared for a whole share lifetime, so
    // against the limit that window carries the kept directives' own error
    // (2.2 % under in one CI run): 5 %.
    let no_step = within(admitted_after, admitted_outage, 0.02);
    let holds = within(admitted_outage, LIMIT_RPS, 0.10)
        && no_step
        && within(admitted_after, LIMIT_RPS, 0.05)
        && new_leader.is_ok()
        && all.errors == 0;
    if !holds {
        set.print_logs();
    }
    let (_, new_fence) = new_leader.unwrap();
    assert!(
        new_fence > old_fence,
        "an emptied store handed out fence {new_fence} after {old_fence}"
    );
    assert_eq!(all.server_errors, 0, "no 5xx at any time\n{summary}");
    assert_eq!(all.errors, 0, "no failed requests at any time\n{summary}");
    assert!(
        within(admitted_before, LIMIT_RPS, 0.05),
        "before the outage {admitted_before:.1} rps\n{summary}"
    );
    assert!(
        within(admitted_outage, LIMIT_RPS, 0.10),
        "during the store outage {admitted_outage:.1} rps, limit {LIMIT_RPS}\n{summary}"
    );
    assert!(
        no_step,
        "after the store came back empty {admitted_after:.1} rps, \
         {admitted_outage:.1} during the outage\n{summary}"
    );
    assert!(
        within(admitted_after, LIMIT_RPS, 0.05),
        "after the store came back empty {admitted_after:.1} rps, limit {LIMIT_RPS}\n{summary}"
    );
    let metrics = set.replicas[0].admin().metrics().await.unwrap();
    assert!(
        sluice_integration_tests::control_plane::sample(
            &metrics,
            r#"sluice_store_failures_total{op="share"}"#
        ) > 0.0,
        "the outage is counted"
    );
}

#[tokio::test]
async fn serve_takes_the_store_from_the_file_and_refuses_another_layout() {
    use sluice_integration_tests::fleet::{Fleet, FleetOptions, TestDir};
    let dir = TestDir::new("sluice-it-", "redis").unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let limits = format!(
        "limits:\n  - bucket: acme\n    limit_rps: 10\nstore: \"{}\"\n",
        redis.url()
    );
    // No proxies to wait for: no start-up hold, so it leads at once.
    let mut fleet = Fleet::start(
        FleetOptions::control_plane_only(&limits)
            .control_interval_ms(100)
            .args(["--startup-grace-ms", "0"]),
    )
    .await
    .unwrap();
    let replica = &mut fleet.control_plane;
    let (_, fence) = wait_for_leader(&[replica], Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(fence, 1);
    replica.shutdown().unwrap();

    // Keys written in another layout: refused at start, naming the store.
    let store = connect(&redis).await;
    redis_cmd(&store, &["SET", &Keys::default().format, "2"]).await;
    let limits_file = dir.path().join("other.yaml");
    std::fs::write(&limits_file, &limits).unwrap();
    let output = std::process::Command::new(sluice_integration_tests::paths::sluice_bin().unwrap())
        .arg("serve")
        .arg("--config")
        .arg(&limits_file)
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&redis.url()) && stderr.contains("format 2"),
        "{stderr}"
    );
}
