//! One replica's share of the fleet load as it travels through the store,
//! and the fleet total as the sum of the live replicas' shares.
//!
//! A replica publishes the rates its own proxies reported in its last
//! control interval (the [`FleetLoad`] its fleet tick produced). Every
//! proxy holds one stream to one replica, so summing the replicas' shares
//! counts each proxy once; a proxy that moved between two replicas may
//! count twice for at most one share's lifetime, which errs on the side of
//! dropping.
//!
//! The encoding is JSON with a format number: readable with `redis-cli`,
//! and a share written by a Sluice with another layout is refused, not
//! misread.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::histogram::LatencyHistogram;

use crate::fleet::health::{MAX_HEALTH_BUCKETS, UpstreamHealth, merge_health};
use crate::fleet::{
    BucketCost, BucketLoad, BucketTraffic, CellCharges, CellLoad, FleetLoad, PartCharges, ProxyCap,
};
use sluice_core::Priority;

/// Layout of a published share; bumped when it changes meaning.
pub(crate) const FORMAT: u32 = 1;

/// Why a published share cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShareError {
    /// Not JSON of the expected shape.
    #[error("unreadable load share: {0}")]
    Json(#[from] serde_json::Error),
    /// Written by a Sluice with another layout.
    #[error("load share in format {found}, this build reads format {FORMAT}")]
    Format {
        /// The format it names.
        found: u32,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct WireShare {
    format: u32,
    buckets: Vec<WireBucket>,
    /// The proxies whose streams this replica holds. Added after format 1
    /// was first published, hence optional: a share without it reads as
    /// naming no proxy.
    #[serde(default)]
    proxies: Vec<String>,
    /// The upstream signals of its proxies for the adaptive buckets
    /// (added later too: a share without it carries none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    upstream: Vec<WireUpstream>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireUpstream {
    bucket: String,
    responses: u64,
    errors: u64,
    /// The latency histogram's counts, trailing empty buckets cut.
    latency: Vec<u32>,
}

/// A share as read from the store: the load and who it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Share {
    /// The rates per bucket and cell.
    pub(crate) buckets: Vec<BucketTraffic>,
    /// The proxies whose streams the replica held, sorted.
    pub(crate) proxies: Vec<String>,
    /// Its proxies' upstream signals of the last interval, per adaptive
    /// bucket.
    pub(crate) upstream: Upstream,
}

/// Upstream signals per bucket over one interval.
pub type Upstream = HashMap<String, UpstreamHealth>;

#[derive(Debug, Serialize, Deserialize)]
struct WireBucket {
    bucket: String,
    proxies: u32,
    cells: Vec<WireCell>,
    /// Cost and request rates of a bucket whose proxies count cost (added
    /// later: a share without it carries none). When `steered`, the cells'
    /// rates are cost per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost: Option<BucketCost>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireCell {
    tenant: String,
    priority: i32,
    offered: f64,
    admitted: f64,
    shadow_dropped: f64,
    proxies: u32,
    stale_share: f64,
    /// Requests per second behind a cost rate (added later: absent in
    /// request buckets' cells and older shares).
    #[serde(default, skip_serializing_if = "is_zero")]
    requests: f64,
    /// A budget cell's charged cost per second, and the estimated cost
    /// settled with it (added later: absent in request buckets' cells and
    /// older shares, which leave them unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    charged: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled: Option<f64>,
    /// The same over the long run of the replica's proxies (added later:
    /// a share without them counts its window for its long run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    charged_long_run: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled_long_run: Option<f64>,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// The share a replica publishes: its proxies' rates per cell, which
/// proxies it serves (so the others can tell when those proxies have
/// moved), and their upstream signals.
///
/// `upstream` is what the adaptive limits need of this replica's proxies'
/// signals (the caller keeps only adaptive buckets: a latency histogram per
/// bucket is too much to publish for every bucket).
pub(crate) fn encode(load: &FleetLoad, proxies: &[String], upstream: &Upstream) -> Vec<u8> {
    let share = WireShare {
        format: FORMAT,
        proxies: proxies.to_vec(),
        upstream: upstream
            .iter()
            .take(MAX_HEALTH_BUCKETS)
            .map(|(bucket, health)| WireUpstream {
                bucket: bucket.clone(),
                responses: health.responses,
                errors: health.errors,
                latency: health.latency.to_wire(),
            })
            .collect(),
        buckets: load
            .buckets
            .iter()
            .map(|bucket| WireBucket {
                bucket: bucket.bucket.as_ref().to_owned(),
                proxies: bucket.load.proxies_reporting,
                cost: bucket.cost,
                cells: bucket
                    .cells
                    .iter()
                    .map(|cell| WireCell {
                        tenant: cell.tenant.as_ref().to_owned(),
                        priority: cell.priority.to_wire() as i32,
                        offered: cell.load.offered_rps,
                        admitted: cell.load.admitted_rps,
                        shadow_dropped: cell.shadow_dropped_rps,
                        proxies: cell.load.proxies_reporting,
                        stale_share: cell.load.stale_share,
                        requests: cell.load.requests_rps,
                        charged: cell.charges.map(|c| c.window.charged_per_s),
                        settled: cell.charges.map(|c| c.window.settled_per_s),
                        charged_long_run: cell.charges.map(|c| c.long_run.charged_per_s),
                        settled_long_run: cell.charges.map(|c| c.long_run.settled_per_s),
                    })
                    .collect(),
            })
            .collect(),
    };
    // Serialising plain structs of strings and finite numbers cannot fail;
    // an empty share (counted as no load) is the safe answer if it did.
    serde_json::to_vec(&share).unwrap_or_default()
}

/// Reads a share another replica published.
pub(crate) fn decode(bytes: &[u8]) -> Result<Share, ShareError> {
    let share: WireShare = serde_json::from_slice(bytes)?;
    if share.format != FORMAT {
        return Err(ShareError::Format {
            found: share.format,
        });
    }
    let mut proxies = share.proxies;
    proxies.sort_unstable();
    proxies.dedup();
    let buckets = share
        .buckets
        .into_iter()
        .map(|bucket| {
            let cells = bucket
                .cells
                .into_iter()
                .map(|cell| CellLoad {
                    tenant: Arc::from(cell.tenant),
                    priority: Priority::from_wire(cell.priority),
                    load: BucketLoad {
                        offered_rps: finite(cell.offered),
                        admitted_rps: finite(cell.admitted),
                        proxies_reporting: cell.proxies,
                        stale_share: finite(cell.stale_share).clamp(0.0, 1.0),
                        requests_rps: finite(cell.requests),
                    },
                    shadow_dropped_rps: finite(cell.shadow_dropped),
                    charges: cell.charged.zip(cell.settled).map(|window| {
                        let read = |(charged, settled): (f64, f64)| CellCharges {
                            charged_per_s: finite(charged),
                            settled_per_s: finite(settled),
                        };
                        match cell.charged_long_run.zip(cell.settled_long_run) {
                            Some(long_run) => PartCharges {
                                window: read(window),
                                long_run: read(long_run),
                            },
                            None => PartCharges::window_only(read(window)),
                        }
                    }),
                })
                .collect();
            let mut traffic = BucketTraffic::from_cells(&bucket.bucket, cells);
            traffic.load.proxies_reporting = bucket.proxies;
            traffic.cost = bucket.cost.map(|cost| cost.cleaned(finite));
            traffic
        })
        .collect();
    let mut upstream = Upstream::new();
    merge_health(
        &mut upstream,
        share.upstream.into_iter().map(|wire| {
            let mut latency = LatencyHistogram::default();
            latency.merge_wire(&wire.latency);
            let health = UpstreamHealth {
                responses: wire.responses,
                errors: wire.errors.min(wire.responses),
                latency,
            };
            (wire.bucket, health)
        }),
    );
    Ok(Share {
        buckets,
        proxies,
        upstream,
    })
}

/// A rate read from the store: never negative, never NaN or infinite.
fn finite(value: f64) -> f64 {
    if value.is_finite() {
        value.max(0.0)
    } else {
        0.0
    }
}

/// A budget cell's charges in each share that holds the cell, by bucket,
/// tenant and priority: kept apart until every share is in, then weighed
/// against each other.
type ChargeParts = HashMap<(Arc<str>, Arc<str>, Priority), Vec<Option<PartCharges>>>;

/// The fleet total: this replica's own tick (its stats are kept: they
/// count what this replica's streams did) plus the other live replicas'
/// shares, summed per bucket and per cell. A budget cell's charges are
/// weighed rather than summed ([`PartCharges::weighed`]), each share as
/// one part: no replica's share weighs more than the median one's, and
/// each counts within the band of the shares' long runs, as each proxy
/// does within its replica's share. A proxy that reports charges far from
/// the others' is held to that band whether or not its replica serves
/// anyone else.
pub(crate) fn merge(own: FleetLoad, others: Vec<Vec<BucketTraffic>>) -> FleetLoad {
    if others.iter().all(Vec::is_empty) {
        return own;
    }
    let FleetLoad { buckets, stats } = own;
    let mut charge_parts = ChargeParts::new();
    let mut merged: BTreeMap<Arc<str>, BucketTraffic> = buckets
        .into_iter()
        .map(|bucket| (Arc::clone(&bucket.bucket), bucket))
        .collect();
    for bucket in others.into_iter().flatten() {
        match merged.get_mut(&bucket.bucket) {
            // Cost rates and request rates do not add: while a change of
            // the bucket's limit between a rate and a budget reaches the
            // replicas (an interval), a share in the other unit is left out.
            Some(into) if steered(into) != steered(&bucket) => {}
            Some(into) => add_bucket(into, bucket, &mut charge_parts),
            None => {
                merged.insert(Arc::clone(&bucket.bucket), bucket);
            }
        }
    }
    for ((bucket, tenant, priority), parts) in charge_parts {
        let cell = merged.get_mut(&bucket).and_then(|traffic| {
            let at = traffic
                .cells
                .binary_search_by(|c| (&c.tenant, c.priority).cmp(&(&tenant, priority)))
                .ok()?;
            traffic.cells.get_mut(at)
        });
        if let Some(cell) = cell {
            // Unknown in any part, unknown in the sum: a cell's charges
            // from some replicas only would read as estimates running high.
            cell.charges = parts
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .map(|parts| PartCharges::weighed(parts.into_iter()));
        }
    }
    let mut load = FleetLoad::new(merged.into_values().collect());
    load.stats = stats;
    load
}

/// Whether a bucket's rates are cost rates.
fn steered(traffic: &BucketTraffic) -> bool {
    traffic.cost.is_some_and(|cost| cost.steered)
}

fn add_bucket(into: &mut BucketTraffic, from: BucketTraffic, charge_parts: &mut ChargeParts) {
    into.load = add_load(into.load, from.load);
    into.shadow_dropped_rps += from.shadow_dropped_rps;
    into.cost = match (into.cost, from.cost) {
        (Some(mut a), Some(b)) => {
            a.add(&b);
            Some(a)
        }
        (a, b) => a.or(b),
    };
    for cell in from.cells {
        let at = into
            .cells
            .binary_search_by(|c| (&c.tenant, c.priority).cmp(&(&cell.tenant, cell.priority)));
        match at {
            Ok(at) => {
                if let Some(existing) = into.cells.get_mut(at) {
                    existing.load = add_load(existing.load, cell.load);
                    existing.shadow_dropped_rps += cell.shadow_dropped_rps;
                    let key = (
                        Arc::clone(&into.bucket),
                        Arc::clone(&cell.tenant),
                        cell.priority,
                    );
                    match charge_parts.get_mut(&key) {
                        Some(parts) => parts.push(cell.charges),
                        // Cells without charges in two shares have none in
                        // the sum whatever the others hold: nothing kept.
                        None if existing.charges.is_none() && cell.charges.is_none() => {}
                        None => {
                            charge_parts.insert(key, vec![existing.charges, cell.charges]);
                        }
                    }
                }
            }
            Err(at) => into.cells.insert(at, cell),
        }
    }
    into.proxy_cap = match (into.proxy_cap.take(), from.proxy_cap) {
        (Some(mut a), Some(b)) => {
            a.cap_rps = a.cap_rps.max(b.cap_rps);
            a.capped.extend(b.capped);
            a.capped.sort_by(|x, y| x.proxy_id.cmp(&y.proxy_id));
            Some(a)
        }
        (a, b) => a.or(b).map(|cap: ProxyCap| cap),
    };
}

/// Marks every rate of `buckets` as carried over from an earlier interval.
///
/// A vanished replica's last share is counted again every interval until
/// its proxies are served elsewhere; the tracking policy learned from those
/// rates when they were fresh, and must not correct the same error again
/// each interval (its correction would wind up against numbers that cannot
/// answer, and overshoot once the replica is back).
pub(crate) fn carried_over(mut buckets: Vec<BucketTraffic>) -> Vec<BucketTraffic> {
    for bucket in &mut buckets {
        bucket.load.stale_share = 1.0;
        for cell in &mut bucket.cells {
            cell.load.stale_share = 1.0;
        }
    }
    buckets
}

/// Rates and proxies add; the carried share is the offered-weighted mean.
fn add_load(a: BucketLoad, b: BucketLoad) -> BucketLoad {
    let offered_rps = a.offered_rps + b.offered_rps;
    let stale_share = if offered_rps > 0.0 {
        (a.stale_share * a.offered_rps + b.stale_share * b.offered_rps) / offered_rps
    } else {
        0.0
    };
    BucketLoad {
        offered_rps,
        admitted_rps: a.admitted_rps + b.admitted_rps,
        proxies_reporting: a.proxies_reporting.saturating_add(b.proxies_reporting),
        stale_share,
        requests_rps: a.requests_rps + b.requests_rps,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use proptest::prelude::*;

    fn cell(tenant: &str, priority: Priority, offered: f64, admitted: f64) -> CellLoad {
        CellLoad {
            tenant: Arc::from(tenant),
            priority,
            load: BucketLoad {
                offered_rps: offered,
                admitted_rps: admitted,
                proxies_reporting: 1,
                stale_share: 0.0,
                requests_rps: 0.0,
            },
            shadow_dropped_rps: 0.0,
            charges: None,
        }
    }

    fn bucket(name: &str, cells: Vec<CellLoad>, proxies: u32) -> BucketTraffic {
        let mut traffic = BucketTraffic::from_cells(name, cells);
        traffic.load.proxies_reporting = proxies;
        traffic
    }

    #[test]
    fn a_share_carries_its_upstream_signals() {
        let mut latency = LatencyHistogram::default();
        latency.record(2_000);
        latency.record(90_000);
        let mut upstream = Upstream::new();
        upstream.insert(
            "acme".to_owned(),
            UpstreamHealth {
                responses: 40,
                errors: 3,
                latency: latency.clone(),
            },
        );
        let read = decode(&encode(&FleetLoad::default(), &[], &upstream)).unwrap();
        assert_eq!(read.upstream, upstream);
        // None published: the key is left out, and reads back as none.
        let bytes = encode(&FleetLoad::default(), &[], &Upstream::new());
        assert!(!String::from_utf8_lossy(&bytes).contains("upstream"));
        assert!(decode(&bytes).unwrap().upstream.is_empty());
        // More errors than responses are cut to the responses.
        let forged = br#"{"format":1,"buckets":[],"upstream":[
            {"bucket":"acme","responses":2,"errors":9,"latency":[1,1]}]}"#;
        let read = decode(forged).unwrap();
        assert_eq!(read.upstream["acme"].errors, 2);
        assert_eq!(read.upstream["acme"].latency.count(), 2);
    }

    /// The drop ratio a tracking controller decides on the same total for
    /// `intervals` intervals, at the first and at the last.
    fn ratios_over(total: &FleetLoad, intervals: usize) -> (f64, f64) {
        use crate::config::limits::{LimitRule, LimitTable, Selector};
        use crate::control::controller::Controller;
        use crate::control::estimator::Tracking;
        use crate::types::LimitRps;
        let limits = LimitTable::from_rules(
            None,
            [LimitRule {
                selector: Selector::Bucket("acme".to_owned()),
                limit: LimitRps::new(150.0).unwrap().into(),
            }],
        );
        let mut controller = Controller::new(Tracking::new());
        let ratios: Vec<f64> = (0..intervals)
            .map(|_| controller.tick(total, &limits).buckets[0].drop_ratio.get())
            .collect();
        (ratios[0], ratios[intervals - 1])
    }

    #[test]
    fn a_carried_over_share_does_not_wind_up_the_correction() {
        // A vanished replica's last share: its proxies admitted 140 rps
        // against a 150 rps limit. Counted again for 25 intervals as fresh,
        // the same 7 % gap is corrected 25 times; carried over, never.
        let share = || {
            vec![bucket(
                "acme",
                vec![cell("", Priority::Unspecified, 400.0, 140.0)],
                2,
            )]
        };
        let fresh = merge(FleetLoad::default(), vec![share()]);
        let carried = merge(FleetLoad::default(), vec![carried_over(share())]);
        let acme = carried.get("acme").unwrap();
        assert_eq!(acme.load.stale_share, 1.0);
        assert!(acme.cells.iter().all(|c| c.load.stale_share == 1.0));

        let (first, last) = ratios_over(&fresh, 25);
        assert!(last < first - 0.05, "fresh: {first} then {last}");
        let (first, last) = ratios_over(&carried, 25);
        assert!(
            (last - first).abs() < 1e-9,
            "carried over: {first} then {last}"
        );
    }

    #[test]
    fn a_share_reads_back_as_it_was_written() {
        let load = FleetLoad::new(vec![
            bucket(
                "acme",
                vec![
                    cell("", Priority::Unspecified, 300.0, 120.0),
                    cell("t1", Priority::Critical, 5.5, 5.5),
                ],
                3,
            ),
            bucket("zeta", vec![cell("t2", Priority::Bulk, 1.0, 0.25)], 1),
        ]);
        let proxies = ["envoy-b".to_owned(), "envoy-a".to_owned()];
        let read = decode(&encode(&load, &proxies, &Upstream::new())).unwrap();
        assert_eq!(read.buckets, load.buckets);
        assert_eq!(read.proxies, ["envoy-a", "envoy-b"]);
    }

    #[test]
    fn a_share_carries_cost_and_shares_add_it() {
        let cost = BucketCost {
            steered: true,
            offered_per_s: 30_000.0,
            admitted_per_s: 10_000.0,
            charged_per_s: 9_000.0,
            offered_rps: 30.0,
            admitted_rps: 10.0,
            cells_without_cost: 1,
        };
        let mut llm = bucket(
            "llm",
            vec![cell("", Priority::Unspecified, 30_000.0, 10_000.0)],
            2,
        );
        llm.cost = Some(cost);
        let load = FleetLoad::new(vec![llm.clone()]);
        let read = decode(&encode(&load, &[], &Upstream::new())).unwrap();
        assert_eq!(read.buckets, load.buckets);
        // Two replicas' cost shares add; a share still in requests (a
        // replica that has not read the budget yet) is left out.
        let mut in_requests = bucket("llm", vec![cell("", Priority::Unspecified, 30.0, 10.0)], 1);
        in_requests.cost = Some(BucketCost {
            steered: false,
            ..cost
        });
        let total = merge(load.clone(), vec![read.buckets, vec![in_requests]]);
        let llm = total.get("llm").unwrap();
        assert_eq!(llm.load.offered_rps, 60_000.0);
        let summed = llm.cost.unwrap();
        assert_eq!(summed.charged_per_s, 18_000.0);
        assert_eq!(summed.offered_rps, 60.0);
        assert_eq!(summed.cells_without_cost, 2);
        // A cell's charges add where every share has them; a share written
        // before cells carried them leaves the sum unknown.
        let mut charged = llm.clone();
        let charges = CellCharges {
            charged_per_s: 9_000.0,
            settled_per_s: 10_000.0,
        };
        charged.cells[0].charges = Some(PartCharges::window_only(charges));
        let with = FleetLoad::new(vec![charged.clone()]);
        let read = decode(&encode(&with, &[], &Upstream::new())).unwrap();
        assert_eq!(read.buckets, with.buckets);
        let both = merge(with.clone(), vec![read.buckets]);
        assert_eq!(
            both.get("llm").unwrap().cells[0].charges,
            Some(PartCharges::window_only(charges.add(charges)))
        );
        let older = merge(with, vec![vec![llm.clone()]]);
        assert_eq!(older.get("llm").unwrap().cells[0].charges, None);
        // Bad numbers from the store read as none.
        let bad = br#"{"format":1,"buckets":[{"bucket":"llm","proxies":1,"cells":[],"cost":{"steered":true,"offered_per_s":-5.0,"charged_per_s":-1e300}}]}"#;
        let read = decode(bad).unwrap();
        let cost = read.buckets[0].cost.unwrap();
        assert_eq!((cost.offered_per_s, cost.charged_per_s), (0.0, 0.0));
    }

    /// A share of one budget cell whose proxies' window settled 10,000
    /// estimated tokens a second, charged at `ratio` in the window and
    /// over a long run of `settled`.
    fn charged_share(ratio: f64, settled: f64) -> Vec<BucketTraffic> {
        let mut llm = bucket(
            "llm",
            vec![cell("", Priority::Unspecified, 30_000.0, 10_000.0)],
            1,
        );
        llm.cells[0].charges = Some(PartCharges {
            window: CellCharges {
                charged_per_s: 10_000.0 * ratio,
                settled_per_s: 10_000.0,
            },
            long_run: CellCharges {
                charged_per_s: settled * ratio,
                settled_per_s: settled,
            },
        });
        llm.cost = Some(BucketCost {
            steered: true,
            ..BucketCost::default()
        });
        // Through the store, as the other replicas read it.
        let load = FleetLoad::new(vec![llm]);
        decode(&encode(&load, &[], &Upstream::new()))
            .unwrap()
            .buckets
    }

    /// The charges of the merged cell, charged over settled in its window.
    fn merged_ratio(own: f64, others: &[(f64, f64)]) -> f64 {
        let own = FleetLoad::new(charged_share(own, 1e5));
        let others = others
            .iter()
            .map(|&(ratio, settled)| charged_share(ratio, settled))
            .collect();
        let merged = merge(own, others);
        merged.get("llm").unwrap().cells[0]
            .charges
            .unwrap()
            .window
            .ratio()
            .unwrap()
    }

    #[test]
    fn a_proxy_alone_on_its_replica_is_held_to_the_others_band() {
        // A proxy that charges 8x its estimates (the most its own replica
        // lets one proxy count) has a replica to itself: beside two honest
        // replicas it counts at twice their ratio, and no more than the
        // median replica weighs, whatever weight it claims.
        let rogue = merged_ratio(1.0, &[(1.1, 1e5), (8.0, 1e5)]);
        assert!((rogue - (1.0 + 1.1 + 2.2) / 3.0).abs() < 1e-9, "{rogue}");
        let heavy = merged_ratio(1.0, &[(1.1, 1e5), (8.0, 1e7)]);
        assert!((heavy - rogue).abs() < 1e-9, "{heavy}");
        // Summed as before, it would have taken the cell to 3.4.
        // Honest replicas whose long runs differ within the band pass as
        // reported; with two, neither can tell which one is wrong.
        let honest = merged_ratio(1.0, &[(1.3, 1e5), (1.6, 1e5)]);
        assert!((honest - 1.3).abs() < 1e-9, "{honest}");
        let pair = merged_ratio(1.0, &[(8.0, 1e5)]);
        assert!((pair - 4.5).abs() < 1e-9, "{pair}");
        // A share written before shares carried a long run counts its
        // window for it.
        let older = br#"{"format":1,"buckets":[{"bucket":"llm","proxies":1,"cells":[
            {"tenant":"","priority":0,"offered":30000.0,"admitted":10000.0,"shadow_dropped":0.0,
             "proxies":1,"stale_share":0.0,"charged":12000.0,"settled":10000.0}],
            "cost":{"steered":true}}]}"#;
        let read = decode(older).unwrap();
        let charges = read.buckets[0].cells[0].charges.unwrap();
        assert_eq!(charges.long_run, charges.window);
        assert_eq!(charges.window.ratio(), Some(1.2));
    }

    #[test]
    fn a_share_of_another_format_is_refused_not_misread() {
        let err = decode(br#"{"format":2,"buckets":[]}"#).unwrap_err();
        assert!(err.to_string().contains("format 2"), "{err}");
        assert!(decode(b"not json").is_err());
        // Written before shares named their proxies: still read.
        let older = decode(br#"{"format":1,"buckets":[]}"#).unwrap();
        assert!(older.proxies.is_empty());
    }

    #[test]
    fn bad_numbers_read_as_no_load() {
        let text = br#"{"format":1,"buckets":[{"bucket":"a","proxies":1,"cells":[
            {"tenant":"","priority":0,"offered":-5.0,"admitted":1e400,"shadow_dropped":0.0,"proxies":1,"stale_share":7.0}]}]}"#;
        // 1e400 is not a JSON number serde accepts as finite: refused whole.
        assert!(decode(text).is_err());
        let text = br#"{"format":1,"buckets":[{"bucket":"a","proxies":1,"cells":[
            {"tenant":"","priority":0,"offered":-5.0,"admitted":2.0,"shadow_dropped":0.0,"proxies":1,"stale_share":7.0}]}]}"#;
        let read = decode(text).unwrap().buckets;
        assert_eq!(read[0].cells[0].load.offered_rps, 0.0);
        assert_eq!(read[0].cells[0].load.stale_share, 1.0);
    }

    #[test]
    fn shares_add_per_bucket_and_cell_and_keep_own_stats() {
        let mut own = FleetLoad::new(vec![bucket(
            "acme",
            vec![cell("", Priority::Unspecified, 100.0, 50.0)],
            2,
        )]);
        own.stats.cells = 7;
        let other = vec![
            bucket(
                "acme",
                vec![
                    cell("", Priority::Unspecified, 60.0, 30.0),
                    cell("t", Priority::Bulk, 10.0, 10.0),
                ],
                1,
            ),
            bucket("beta", vec![cell("", Priority::Unspecified, 4.0, 4.0)], 1),
        ];
        let total = merge(own, vec![other]);
        assert_eq!(total.stats.cells, 7);
        let acme = total.get("acme").unwrap();
        assert_eq!(acme.load.offered_rps, 170.0);
        assert_eq!(acme.load.admitted_rps, 90.0);
        assert_eq!(acme.load.proxies_reporting, 3);
        assert_eq!(acme.cells.len(), 2);
        assert_eq!(acme.cells[0].load.offered_rps, 160.0);
        assert_eq!(acme.cells[0].load.proxies_reporting, 2);
        assert_eq!(total.get("beta").unwrap().load.offered_rps, 4.0);
        assert_eq!(
            total.buckets.iter().map(|b| &*b.bucket).collect::<Vec<_>>(),
            ["acme", "beta"]
        );
    }

    proptest! {
        /// However the fleet is split over replicas, the total offered and
        /// admitted rates per bucket are the sums of the parts.
        #[test]
        fn the_total_is_the_sum_of_the_shares(
            parts in prop::collection::vec(
                prop::collection::vec((0u8..4, 0u8..3, 0.0f64..1e4, 0.0f64..1.0), 0..12),
                1..5,
            )
        ) {
            let shares: Vec<Vec<BucketTraffic>> = parts
                .iter()
                .map(|cells| {
                    let mut by_bucket: BTreeMap<String, Vec<CellLoad>> = BTreeMap::new();
                    for &(b, t, offered, fraction) in cells {
                        let tenant = format!("t{t}");
                        let list = by_bucket.entry(format!("b{b}")).or_default();
                        if list.iter().any(|c| *c.tenant == tenant) {
                            continue;
                        }
                        list.push(cell(&tenant, Priority::Unspecified, offered, offered * fraction));
                    }
                    by_bucket.into_iter().map(|(name, cells)| bucket(&name, cells, 1)).collect()
                })
                .collect();
            let mut expected: BTreeMap<String, (f64, f64)> = BTreeMap::new();
            for traffic in shares.iter().flatten() {
                let entry = expected.entry(traffic.bucket.to_string()).or_default();
                entry.0 += traffic.load.offered_rps;
                entry.1 += traffic.load.admitted_rps;
            }
            let mut rest = shares.into_iter();
            let own = FleetLoad::new(rest.next().unwrap_or_default());
            let decoded: Vec<Vec<BucketTraffic>> = rest
                .map(|share| {
                    decode(&encode(&FleetLoad::new(share), &[], &Upstream::new()))
                        .unwrap()
                        .buckets
                })
                .collect();
            let total = merge(own, decoded);
            prop_assert_eq!(total.buckets.len(), expected.len());
            for (name, (offered, admitted)) in expected {
                let bucket = total.get(&name).unwrap();
                prop_assert!((bucket.load.offered_rps - offered).abs() <= 1e-6 * offered.max(1.0));
                prop_assert!((bucket.load.admitted_rps - admitted).abs() <= 1e-6 * admitted.max(1.0));
                let cells: f64 = bucket.cells.iter().map(|c| c.load.offered_rps).sum();
                prop_assert!((cells - offered).abs() <= 1e-6 * offered.max(1.0));
            }
        }
    }
}
