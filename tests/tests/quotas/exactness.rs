//! Exactness under concurrency: 16 clients, each on a connection of its
//! own, call one fixed-window quota of 200 a second about ten times as
//! often as it allows for a few seconds. Every whole window admits exactly
//! 200, counted from the clients (each OK's remaining count, 199 down to
//! 0, appears exactly once per window) and, on Redis, from the store (the
//! window's key holds every hit it counted, refused ones included: more
//! than 200, and as many as the clients sent in that window; over the run,
//! exactly as many as they sent).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_control_plane::quotas::counter_for;
use sluice_control_plane::quotas::redis_store::fixed_window_key;
use sluice_integration_tests::control_plane::{ControlPlane, sample};
use sluice_integration_tests::quotas::{OK, OVER_LIMIT, RlsClient};

/// The quota file of this test.
pub(crate) const EXACT: &str = "domain: exact\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 200}\n";
const LIMIT: u64 = 200;
const CLIENTS: usize = 16;
/// Each client's pace: 16 × 125 a second, ten times the quota.
const EVERY: Duration = Duration::from_millis(8);
const WINDOW_MS: u64 = 1_000;

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Reads a window's count from the store: `GET` of a key, on whichever
/// node serves it.
pub(crate) type Reader<'a> =
    Box<dyn Fn(String) -> Pin<Box<dyn Future<Output = anyhow::Result<Option<String>>> + 'a>> + 'a>;

/// One answered call.
#[derive(Debug, Clone, Copy)]
struct Call {
    sent_ms: u64,
    answered_ms: u64,
    ok: bool,
    remaining: u32,
}

/// Runs the clients for `seconds` whole windows (plus the partial ones
/// around them) against the rate limit service at `control_plane`; with a
/// `reader`, reads each window's count from the store while its key lives.
pub(crate) async fn sixteen_clients(
    control_plane: &ControlPlane,
    value: &str,
    seconds: u64,
    reader: Option<Reader<'_>>,
) {
    let addr = control_plane.rls_addr();
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(RlsClient::connect(addr).await.unwrap());
    }
    // Start just after a window begins.
    let into = unix_ms() % WINDOW_MS;
    tokio::time::sleep(Duration::from_millis((WINDOW_MS + 20 - into) % WINDOW_MS)).await;
    let started_ms = unix_ms();
    let until_ms = started_ms + seconds * WINDOW_MS + WINDOW_MS / 2;
    let mut tasks = Vec::with_capacity(CLIENTS);
    for (index, mut client) in clients.into_iter().enumerate() {
        let value = value.to_owned();
        tasks.push(tokio::spawn(async move {
            // Spread the clients over the pace.
            tokio::time::sleep(EVERY * u32::try_from(index).unwrap() / CLIENTS as u32).await;
            let mut pace = tokio::time::interval(EVERY);
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut calls = Vec::new();
            while unix_ms() < until_ms {
                pace.tick().await;
                let sent_ms = unix_ms();
                let answer = client
                    .ask("exact", &[&[("client", value.as_str())]])
                    .await
                    .unwrap_or_else(|status| panic!("call failed: {status}"));
                let answered_ms = unix_ms();
                let status = answer.statuses.first().cloned().unwrap_or_default();
                assert!(
                    answer.overall_code == OK || answer.overall_code == OVER_LIMIT,
                    "{answer:?}"
                );
                calls.push(Call {
                    sent_ms,
                    answered_ms,
                    ok: answer.overall_code == OK,
                    remaining: status.limit_remaining,
                });
            }
            calls
        }));
    }
    // Each window's count, read from the store a quarter of a window after
    // it ends (its key lives one window past its end).
    let mut from_store: BTreeMap<u64, u64> = BTreeMap::new();
    if let Some(reader) = &reader {
        let counter = counter_for("exact", &[("client", value)]);
        let mut start = started_ms - started_ms % WINDOW_MS;
        while start <= until_ms + 100 {
            let read_at = start + WINDOW_MS + WINDOW_MS / 4;
            let now = unix_ms();
            if read_at > now {
                tokio::time::sleep(Duration::from_millis(read_at - now)).await;
            }
            let key = fixed_window_key(&counter, WINDOW_MS, start);
            let count = reader(key.clone())
                .await
                .unwrap_or_else(|err| panic!("cannot read {key}: {err:#}"))
                .map_or(0, |count| count.parse::<u64>().unwrap());
            from_store.insert(start, count);
            start += WINDOW_MS;
        }
    }
    let mut calls: Vec<Call> = Vec::new();
    for task in tasks {
        calls.extend(task.await.unwrap());
    }
    let window_of = |ms: u64| ms - ms % WINDOW_MS;
    // Whole windows: entirely within the run.
    let first_whole = window_of(started_ms) + WINDOW_MS;
    let last_whole = window_of(until_ms) - WINDOW_MS;
    // OKs per window: those sent and answered in one window are that
    // window's; one that straddles a boundary goes to the side whose
    // remaining counts lack its value.
    let mut oks: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut straddling = Vec::new();
    let mut sent: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for call in &calls {
        let (from, to) = (window_of(call.sent_ms), window_of(call.answered_ms));
        let entry = sent.entry(from).or_default();
        if from == to {
            entry.0 += 1;
            if call.ok {
                oks.entry(from).or_default().push(call.remaining);
            }
        } else {
            entry.1 += 1;
            if call.ok {
                straddling.push(*call);
            }
        }
    }
    for call in straddling {
        let later = window_of(call.answered_ms);
        let earlier = window_of(call.sent_ms);
        let side = if oks.get(&later).is_some_and(|r| r.contains(&call.remaining)) {
            earlier
        } else {
            later
        };
        oks.entry(side).or_default().push(call.remaining);
    }
    let summary = format!(
        "{} calls, {} OK; per window (start: OK, from the store): {:?}",
        calls.len(),
        calls.iter().filter(|c| c.ok).count(),
        oks.iter()
            .map(|(start, r)| (start % 100_000, r.len(), from_store.get(start).copied()))
            .collect::<Vec<_>>()
    );
    println!("{summary}");
    assert!(
        last_whole >= first_whole + WINDOW_MS,
        "fewer than two whole windows: {summary}"
    );
    let expected: BTreeSet<u32> = (0..u32::try_from(LIMIT).unwrap()).collect();
    let mut start = first_whole;
    while start <= last_whole {
        let remaining = oks.get(&start).cloned().unwrap_or_default();
        let distinct: BTreeSet<u32> = remaining.iter().copied().collect();
        assert_eq!(
            remaining.len() as u64,
            LIMIT,
            "window {start}: {} OK\n{summary}",
            remaining.len()
        );
        assert_eq!(
            distinct, expected,
            "window {start}: each remaining count once\n{summary}"
        );
        if reader.is_some() {
            let counted = from_store.get(&start).copied().unwrap_or_default();
            let (within, across) = sent.get(&start).copied().unwrap_or_default();
            let (_, into) = sent.get(&(start - WINDOW_MS)).copied().unwrap_or_default();
            assert!(
                counted > LIMIT,
                "window {start}: the store counted {counted} (more than {LIMIT} offered)\n{summary}"
            );
            // The calls sent in the window, give or take those in flight
            // at its boundaries.
            assert!(
                within <= counted && counted <= within + across + into,
                "window {start}: the store counted {counted}, the clients sent {within} (+{across} +{into} across a boundary)\n{summary}"
            );
        }
        start += WINDOW_MS;
    }
    if reader.is_some() {
        let total: u64 = from_store.values().sum();
        assert_eq!(
            total,
            calls.len() as u64,
            "the store counted every call the clients made\n{summary}"
        );
    } else {
        // In memory, the service's own statistics agree.
        let metrics = control_plane.admin().metrics().await.unwrap();
        let stat = |name: &str| {
            sample(
                &metrics,
                &format!(r#"sluice_quota_{name}_total{{domain="exact",key="client"}}"#),
            )
        };
        assert_eq!(stat("total_hits"), calls.len() as f64, "{summary}");
        assert_eq!(
            stat("within_limit"),
            calls.iter().filter(|c| c.ok).count() as f64,
            "{summary}"
        );
    }
}
