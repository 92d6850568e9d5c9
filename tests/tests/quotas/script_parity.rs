//! The Lua script that counts quotas in Redis decides exactly what
//! `algorithm.rs` decides, on the same instants: random arrivals, several
//! hits at once, taken, charged (counted even when refused) and refunded
//! (`is_negative_hits`), clock jumps forwards and backwards, several
//! counters per call.

use sluice_control_plane::quotas::RedisCounters;
use sluice_control_plane::quotas::algorithm::{Algorithm, Direction, Quota, State};
use sluice_control_plane::quotas::redis_store::Count;
use sluice_control_plane::store::{Store, StoreOptions};
use sluice_integration_tests::redis::RedisServer;

/// A small deterministic generator: the same sequence on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_script_decides_as_the_rust_algorithms() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path()).await.unwrap();
    let options =
        StoreOptions::from_args(&redis.url(), None, std::time::Duration::from_secs(2)).unwrap();
    let counters = RedisCounters::new(Store::connect(&options).await.unwrap())
        .await
        .unwrap();
    let quotas = [
        Quota {
            limit: 7,
            window_ms: 1_000,
            burst: 7,
        },
        Quota {
            limit: 3,
            window_ms: 60_000,
            burst: 2,
        },
        Quota {
            limit: 0,
            window_ms: 1_000,
            burst: 1,
        },
    ];
    let mut random = Lcg(11);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ] {
        let mut states = [State::default(); 3];
        let (mut admitted, mut refused) = (0, 0);
        // A realistic epoch: the script's numbers are doubles.
        let mut now: u64 = 1_790_000_000_000;
        for step in 0..400 {
            now = match random.below(10) {
                0 => now.saturating_sub(random.below(3_000)),
                1 => now + random.below(130_000),
                _ => now + random.below(120),
            };
            let counts: Vec<Count> = quotas
                .iter()
                .enumerate()
                .map(|(i, quota)| Count {
                    counter: format!("parity-{i}"),
                    quota: *quota,
                    hits: u32::try_from(random.below(3)).unwrap() + u32::from(i == 0),
                    direction: match random.below(8) {
                        0 => Direction::Refund,
                        1 | 2 => Direction::Charge,
                        _ => Direction::Take,
                    },
                })
                .collect();
            let expected: Vec<_> = counts
                .iter()
                .zip(states.iter_mut())
                .map(|(count, state)| {
                    algorithm.apply(state, count.quota, now, count.hits, count.direction)
                })
                .collect();
            let got = counters
                .decide_at(algorithm, &counts, false, Some(now))
                .await
                .unwrap();
            assert_eq!(got, expected, "{algorithm:?}, step {step}, now {now}");
            for decision in &got {
                if decision.admitted {
                    admitted += 1;
                } else {
                    refused += 1;
                }
            }
        }
        // The sequence exercised both answers.
        assert!(
            admitted > 100 && refused > 100,
            "{algorithm:?}: {admitted}/{refused}"
        );
    }
}
