//! One replica cut off from Redis while the other keeps it: the cut-off
//! replica stops leading and stops deciding, its proxies keep their last
//! directives (with heartbeats, so no proxy falls back), the other replica
//! takes the lease under a higher fence, and the fleet keeps its limit
//! during the partition and after it heals. The partition is a TCP proxy
//! between the replica and Redis that closes every connection
//! ([`FaultProxy`](sluice_integration_tests::fault_proxy::FaultProxy)).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::control_plane::sample;
use sluice_integration_tests::load::{LoadPlan, LoadRun, StreamSpec, Window, rate, within};
use sluice_integration_tests::replicas::{ReplicaSet, ReplicaSetOptions, leading, wait_for_leader};

const LIMITS: &str = r#"
limits:
  - bucket: "acme"
    limit_rps: 150
"#;
const LIMIT_RPS: f64 = 150.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_redis_stops_deciding_and_its_proxies_keep_the_limit() {
    // r0 reaches Redis through the fault proxy, starts alone, leads and
    // holds both Envoys' streams; r1 starts after.
    let mut options = ReplicaSetOptions::new(LIMITS, 2, 2);
    options.replicas_at_start = 1;
    options.partitionable = Some(0);
    options.filter = json!({"decision": "credit", "allowance": null});
    let mut set = ReplicaSet::start(options).await.unwrap();
    let load = LoadRun::start(LoadPlan::new(
        vec![
            StreamSpec::new("A/acme", &set.url(0).unwrap(), "acme", 400.0),
            StreamSpec::new("B/acme", &set.url(1).unwrap(), "acme", 200.0),
        ],
        Duration::from_secs(25),
    ))
    .unwrap();
    let old_fence = set
        .start_the_rest_once_r0_leads_every_stream("acme")
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_secs(6).saturating_sub(load.elapsed())).await;
    set.fault.as_ref().unwrap().cut();
    let cut_at = load.elapsed();
    let took_over = wait_for_leader(&[&set.replicas[1]], Duration::from_secs(5)).await;
    let took_over_at = load.elapsed();
    // Hold the partition 5 s, then look at r0 and its proxies.
    tokio::time::sleep((cut_at + Duration::from_secs(5)).saturating_sub(load.elapsed())).await;
    let r0_leads = leading(set.replicas[0].admin()).await.unwrap();
    let r0_metrics = set.replicas[0].admin().metrics().await.unwrap();
    let r0_proxies = set.replicas[0].admin().proxies().await.unwrap();
    set.fault.as_ref().unwrap().heal();
    let healed_at = load.elapsed();

    // After healing: r0 is settled again after a share lifetime (1 s);
    // measure 4 s from 2 s after the heal.
    let after = Window {
        from: healed_at + Duration::from_secs(2),
        to: healed_at + Duration::from_secs(6),
    };
    tokio::time::sleep(after.to.saturating_sub(load.elapsed())).await;
    let leaders = [
        leading(set.replicas[0].admin()).await.unwrap(),
        leading(set.replicas[1].admin()).await.unwrap(),
    ];
    load.stop();
    let result = load.finish().await.unwrap();
    let before = Window {
        from: cut_at.saturating_sub(Duration::from_secs(2)),
        to: cut_at,
    };
    let partition = Window {
        from: cut_at,
        to: healed_at,
    };
    let healing = Window {
        from: healed_at,
        to: after.from,
    };
    let whole = Window {
        from: Duration::ZERO,
        to: after.to,
    };
    let admitted = |window: Window| rate(result.tenant_counts(window, "acme").ok, window);
    let summary = format!(
        "cut at {cut_at:?}, r1 leads {took_over:?} at {took_over_at:?}, healed at \
         {healed_at:?}, leaders after {leaders:?}\nbefore: {}partition: {}healing: {}after: {}\n{}",
        result.summary(before),
        result.summary(partition),
        result.summary(healing),
        result.summary(after),
        result.timeline(Duration::from_millis(500))
    );
    println!("{summary}");
    let all = result.tenant_counts(whole, "acme");
    let holds = within(admitted(partition), LIMIT_RPS, 0.10)
        && within(admitted(after), LIMIT_RPS, 0.02)
        && took_over.is_ok()
        && all.errors == 0;
    if !holds {
        set.print_logs();
    }

    // r0 stopped leading and counted the failures; r1 took over above it.
    assert_eq!(r0_leads, None, "a cut-off replica must not lead\n{summary}");
    assert!(
        sample(&r0_metrics, r#"sluice_store_failures_total{op="share"}"#) > 0.0,
        "{summary}"
    );
    let (_, new_fence) = took_over.unwrap();
    assert!(new_fence > old_fence, "fence {new_fence} after {old_fence}");
    // r0's proxies stayed connected to it and fresh: heartbeats went on.
    assert_eq!(r0_proxies.connected, 2, "{r0_proxies:?}");
    for proxy in &r0_proxies.proxies {
        let age = proxy.directive_age_ms.unwrap_or(u64::MAX);
        assert!(
            age < 2_000,
            "{} holds directives {age} ms old during the partition\n{summary}",
            proxy.proxy_id
        );
    }
    // Exactly one leader after the heal.
    assert_eq!(
        leaders.iter().filter(|l| l.is_some()).count(),
        1,
        "{leaders:?}"
    );
    assert_eq!(all.errors, 0, "no failed requests\n{summary}");
    assert_eq!(all.server_errors, 0, "no 5xx\n{summary}");
    assert!(
        within(admitted(before), LIMIT_RPS, 0.05),
        "before the cut {:.1} rps\n{summary}",
        admitted(before)
    );
    assert!(
        within(admitted(partition), LIMIT_RPS, 0.10),
        "during the partition {:.1} rps, limit {LIMIT_RPS}\n{summary}",
        admitted(partition)
    );
    assert!(
        within(admitted(after), LIMIT_RPS, 0.02),
        "after the heal {:.1} rps, limit {LIMIT_RPS}\n{summary}",
        admitted(after)
    );
}
