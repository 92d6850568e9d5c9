//! A drop-in for envoyproxy/ratelimit, shown on every store: its answers
//! on the wire (`quotas/conformance.rs`), exact counting under 16
//! concurrent clients (`quotas/exactness.rs`), in memory, on Redis, behind
//! Redis Sentinel and on a Redis Cluster of three masters with a replica
//! each (made by `redis-cli --cluster create`), where a master is killed
//! under load; Envoy's own failure mode and headers through its
//! `ratelimit` filter (`quotas/through_envoy.rs`); and
//! `sluice check-config --quotas` (`quotas/check_config.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use sluice_integration_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_integration_tests::quotas::{self, OK, RlsClient, Store};
use sluice_integration_tests::redis::{RedisCluster, RedisSentinel, RedisServer};

#[path = "quotas/check_config.rs"]
mod check_config;
#[path = "quotas/conformance.rs"]
mod conformance;
#[path = "quotas/exactness.rs"]
mod exactness;
#[path = "quotas/through_envoy.rs"]
mod through_envoy;

/// Whole windows the exactness runs count.
const EXACT_WINDOWS: u64 = 3;

/// A control plane serving the exactness quota on a listener and two
/// threads of its own, its counters in `store`.
async fn exact_control_plane(dir: &std::path::Path, store: Store<'_>) -> ControlPlane {
    let run = dir.join("exact");
    std::fs::create_dir_all(&run).unwrap();
    let options = ControlPlaneOptions::new("limits: []\n", &run).args(
        [
            "--rls-listen",
            "127.0.0.1:0",
            "--rls-threads",
            "2",
            "--store-timeout-ms",
            "2000",
        ]
        .map(str::to_owned),
    );
    quotas::control_plane_with_files(&run, options, &[("exact.yaml", exactness::EXACT)], store)
        .await
        .unwrap()
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    let dir = tempfile::tempdir().unwrap();
    conformance::replay(dir.path(), Store::Memory, &conformance::MEMORY_VARIANTS).await;
    let control_plane = exact_control_plane(dir.path(), Store::Memory).await;
    exactness::sixteen_clients(&control_plane, "memory", EXACT_WINDOWS, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let url = redis.url();
    conformance::replay(dir.path(), Store::Redis(&url), &conformance::REDIS_VARIANTS).await;
    let control_plane = exact_control_plane(dir.path(), Store::Redis(&url)).await;
    let reader: exactness::Reader<'_> = Box::new(|key| Box::pin(redis.get(key)));
    exactness::sixteen_clients(&control_plane, "redis", EXACT_WINDOWS, Some(reader)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_sentinel() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisSentinel::start(dir.path()).await.unwrap();
    let url = redis.url();
    conformance::replay(dir.path(), Store::Redis(&url), &conformance::REDIS_VARIANTS).await;
    let control_plane = exact_control_plane(dir.path(), Store::Redis(&url)).await;
    let reader: exactness::Reader<'_> = Box::new(|key| Box::pin(redis.get(key)));
    exactness::sixteen_clients(&control_plane, "sentinel", EXACT_WINDOWS, Some(reader)).await;
}

/// A Redis Cluster of three masters, each with a replica: the answers, the
/// exact count (each window's key read on the master serving it), and a
/// master killed under load: its replica takes over, and a tenant counted
/// there is answered by the failure policy at once meanwhile (a gRPC
/// error) and counted again after, while tenants on the other masters are
/// counted throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = RedisCluster::start(dir.path(), 3, 1).await.unwrap();
    let url = cluster.url();
    conformance::replay(dir.path(), Store::Redis(&url), &conformance::REDIS_VARIANTS).await;
    {
        let control_plane = exact_control_plane(dir.path(), Store::Redis(&url)).await;
        let reader: exactness::Reader<'_> = Box::new(|key| Box::pin(cluster.get(key)));
        exactness::sixteen_clients(&control_plane, "cluster", EXACT_WINDOWS, Some(reader)).await;
        let keys = cluster.keys_per_node().await.unwrap();
        println!("keys per node after the runs: {keys:?}");
    }
    failover_under_load(dir.path(), &mut cluster).await;
}

/// Tenants counted on each master; the master of the first killed while
/// eight clients call them.
async fn failover_under_load(dir: &std::path::Path, cluster: &mut RedisCluster) {
    use sluice_control_plane::quotas::counter_for;
    use sluice_control_plane::quotas::redis_store::redis_key;

    const TIMEOUT_MS: u64 = 500;
    const PER_TENANT: &str = "domain: failover\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
    let run = dir.join("failover");
    std::fs::create_dir_all(&run).unwrap();
    // A store timeout well above what a debug build on a shared machine
    // takes, so that a slow answer is not mistaken for a failover's
    // effect; calls on the dead master must fail well before it.
    let (control_plane, _) = quotas::control_plane_with_files(
        &run,
        ControlPlaneOptions::new("limits: []\n", &run)
            .args(["--store-timeout-ms".to_owned(), TIMEOUT_MS.to_string()]),
        &[("failover.yaml", PER_TENANT)],
        Store::Redis(&cluster.url()),
    )
    .await
    .unwrap();
    // Eight tenants and the master serving each one's counter.
    let mut tenants = Vec::new();
    for n in 0..8 {
        let tenant = format!("tenant-{n}");
        let key = redis_key(
            sluice_control_plane::quotas::Algorithm::FixedWindow,
            &counter_for("failover", &[("tenant", tenant.as_str())]),
            3_600_000,
        );
        let port = cluster.master_port_of(&key).await.unwrap();
        tenants.push((tenant, key, port));
    }
    let victim = tenants[0].2;
    assert!(
        tenants.iter().any(|(_, _, port)| *port != victim),
        "the tenants spread over the masters: {tenants:?}"
    );
    let started = Instant::now();
    let run_for = Duration::from_secs(9);
    let mut tasks = Vec::new();
    for (tenant, _, port) in tenants.clone() {
        let mut client = RlsClient::connect(control_plane.grpc_addr()).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut errors = Vec::new();
            let mut pace = tokio::time::interval(Duration::from_millis(20));
            while started.elapsed() < run_for {
                pace.tick().await;
                let asked = Instant::now();
                let answer = client
                    .ask("failover", &[&[("tenant", tenant.as_str())]])
                    .await;
                let took = asked.elapsed();
                let ok = match &answer {
                    Ok(answer) => answer.overall_code == OK,
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
                        if errors.len() < 3 {
                            errors.push(format!(
                                "{:?}: {}",
                                asked.duration_since(started),
                                status.message()
                            ));
                        }
                        false
                    }
                };
                calls.push((asked.duration_since(started), ok, took));
            }
            (tenant, port, calls, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.kill_port(victim).unwrap();
    let killed = started.elapsed();
    let promoted = cluster
        .wait_for_failover(&tenants[0].1, victim)
        .await
        .unwrap();
    let took_over = started.elapsed();
    println!(
        "master {victim} killed at {killed:?}; {promoted} serves its slots from {took_over:?}"
    );
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    for (tenant, port, calls, errors) in &results {
        let failed: Vec<_> = calls.iter().filter(|(_, ok, _)| !ok).collect();
        let slowest = calls
            .iter()
            .map(|(_, _, took)| *took)
            .max()
            .unwrap_or_default();
        let slowest_failure = failed
            .iter()
            .map(|(_, _, took)| *took)
            .max()
            .unwrap_or_default();
        let last_failure = failed.last().map(|(at, _, _)| *at);
        println!(
            "{tenant} on {port}: {} calls, {} failed (last at {last_failure:?}, the slowest failure in {slowest_failure:?}), slowest call {slowest:?}; {errors:?}",
            calls.len(),
            failed.len()
        );
        // A call to the dead master is refused, not left to time out.
        assert!(
            slowest_failure < Duration::from_millis(TIMEOUT_MS),
            "{tenant}: a failed call took {slowest_failure:?}"
        );
        if *port == victim {
            assert!(!failed.is_empty(), "{tenant}: the kill was noticed");
            // Counted again within seconds of the replica taking over, and
            // to the end of the run.
            let recovered = last_failure.unwrap();
            assert!(
                recovered < took_over + Duration::from_secs(3),
                "{tenant}: failing until {recovered:?}, the replica took over at {took_over:?}"
            );
            assert!(calls.last().is_some_and(|(_, ok, _)| *ok), "{tenant}");
        } else {
            assert!(
                failed.is_empty(),
                "{tenant} on a live master: {} calls failed",
                failed.len()
            );
        }
    }
}
