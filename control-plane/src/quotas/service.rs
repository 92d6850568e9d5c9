//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, answered
//! as envoyproxy/ratelimit answers it (`src/service/ratelimit.go`,
//! `src/limiter/base_limiter.go`): each descriptor of a request is matched
//! to its limit, counted in the store and answered; the request is over
//! limit when a descriptor is (one in quota mode only when every quota-mode
//! descriptor is). An empty domain or descriptor list, and by default a
//! store that cannot count, fail the call with a gRPC error, so that the
//! `ratelimit` filter's `failure_mode_deny` decides.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::{Request, Response, Status};

use super::algorithm::{Algorithm, Direction, Quota};
use super::engine::{Decided, Quotas};
use super::lookup::{self, MAX_ENTRIES, MetricKey};
use super::metadata;
use super::redis_store::Count;
use super::settings::StoreFailure;
use crate::config::quota_file::{Limit, Unit};
use crate::metrics::quotas::{CallError, Outcome};
use crate::store::StoreConnection;

/// Most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// Response header naming why an answer comes from the failure policy
/// (`store_timeout`, `store_unavailable`, `store_full`) rather than a count
/// (with `--quota-store-failure allow` or `deny` only).
pub(crate) const ERROR_HEADER: &str = "x-ratelimit-error";

/// The service, over a shared [`Quotas`].
#[derive(Debug, Clone)]
pub struct RateLimitGrpc {
    quotas: Arc<Quotas>,
    /// The store connection of the runtime serving it, if it has one.
    connection: Option<StoreConnection>,
}

impl RateLimitGrpc {
    /// A service answering from `quotas`, over the store's shared
    /// connection.
    pub(crate) fn new(quotas: Arc<Quotas>) -> Self {
        Self {
            quotas,
            connection: None,
        }
    }

    /// As [`Self::new`], over `connection` (see [`Quotas::open_connection`]).
    pub(crate) fn on_connection(quotas: Arc<Quotas>, connection: Option<StoreConnection>) -> Self {
        Self { quotas, connection }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        self.quotas
            .answer_on(&request, self.connection.as_ref())
            .await
            .map(Response::new)
    }
}

/// The limit a descriptor hits, and how it is counted and named.
struct Found<'a> {
    limit: Cow<'a, Limit>,
    metric_key: Cow<'a, str>,
    shared: Option<Vec<Option<&'a str>>>,
}

/// What a descriptor's status comes from.
enum Plan<'a> {
    /// No limit applies (none matches, the domain is unknown, or the
    /// limit is replaced): OK without a limit.
    Free,
    /// An `unlimited` limit: OK with nothing counted.
    Unlimited,
    /// Counted: the limit and its count's index.
    Counted(&'a Found<'a>, usize),
}

impl Quotas {
    /// Answers one request (on Redis, over the store's shared connection).
    #[cfg(test)]
    pub(crate) async fn answer(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        self.answer_on(request, None).await
    }

    /// Answers one request; on Redis over `connection` when given.
    pub(crate) async fn answer_on(
        &self,
        request: &RateLimitRequest,
        connection: Option<&StoreConnection>,
    ) -> Result<RateLimitResponse, Status> {
        if request.descriptors.len() > MAX_DESCRIPTORS {
            self.metrics.refused("too_many_descriptors");
            return Err(Status::invalid_argument(format!(
                "{} descriptors; at most {MAX_DESCRIPTORS}",
                request.descriptors.len()
            )));
        }
        if request
            .descriptors
            .iter()
            .any(|d| d.entries.len() > MAX_ENTRIES)
        {
            self.metrics.refused("too_many_entries");
            return Err(Status::invalid_argument(format!(
                "a descriptor has more than {MAX_ENTRIES} entries"
            )));
        }
        // envoyproxy/ratelimit's answers, word for word (a gRPC error:
        // Envoy's failure mode decides).
        if request.domain.is_empty() {
            self.metrics.call_error(CallError::Service);
            return Err(Status::unknown("rate limit domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            self.metrics.call_error(CallError::Service);
            return Err(Status::unknown(
                "rate limit descriptor list must not be empty",
            ));
        }
        let settings = &self.settings;
        let config = self.config();
        let domain = request.domain.as_str();
        let root = config.domains.get(domain);
        let mut found: Vec<Option<Found<'_>>> = Vec::with_capacity(request.descriptors.len());
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let Some(root) = root else {
                self.metrics.domain_not_found(domain);
                found.push(None);
                continue;
            };
            if let Some(over) = &descriptor.limit {
                let Some(unit) = Unit::from_wire(over.unit) else {
                    self.metrics.refused("bad_override");
                    return Err(Status::invalid_argument(format!(
                        "descriptor {index}: a limit override needs a unit (SECOND to YEAR), not {}",
                        over.unit
                    )));
                };
                let configured = format!("{domain}.override");
                let per_value = lookup::descriptor_key(
                    domain,
                    descriptor
                        .entries
                        .iter()
                        .map(|e| (e.key.as_str(), e.value.as_str())),
                );
                let metric_key = self.metrics.bounded_key(&configured, &per_value);
                found.push(Some(Found {
                    limit: Cow::Owned(Limit {
                        quota: Some((over.requests_per_unit, unit)),
                        full_key: configured,
                        ..Limit::default()
                    }),
                    metric_key: Cow::Owned(metric_key),
                    shared: None,
                }));
                continue;
            }
            let entries: Vec<(&str, &str)> = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            found.push(lookup::find(root, domain, &entries).map(|m| Found {
                limit: Cow::Borrowed(m.limit),
                metric_key: match m.metric_key {
                    MetricKey::Configured(key) => Cow::Borrowed(key),
                    MetricKey::PerValue(key) => {
                        Cow::Owned(self.metrics.bounded_key(&m.limit.full_key, &key))
                    }
                },
                shared: m.shared,
            }));
        }
        // A limit replaced by another in the same request does not count
        // (an unlimited limit still replaces; an unlimited one is never
        // replaced).
        let replaced: HashSet<&str> = found
            .iter()
            .flatten()
            .flat_map(|f| f.limit.replaces.iter().map(String::as_str))
            .collect();
        // A request's hits_addend of 0 is its default, 1 (the field is
        // not optional); a descriptor's own is, and may be 0: a check that
        // counts nothing.
        let default_hits = u64::from(request.hits_addend.max(1));
        let charge = if settings.count_refused_hits {
            Direction::Charge
        } else {
            Direction::Take
        };
        let mut plans = Vec::with_capacity(found.len());
        let mut counts = Vec::new();
        let mut hits_of = Vec::new();
        for (descriptor, found) in request.descriptors.iter().zip(&found) {
            let plan = match found {
                None => Plan::Free,
                Some(f) if f.limit.quota.is_none() => Plan::Unlimited,
                Some(f) if !f.limit.name.is_empty() && replaced.contains(f.limit.name.as_str()) => {
                    Plan::Free
                }
                Some(f) => {
                    let (requests, unit) = f.limit.quota.unwrap_or((0, Unit::Second));
                    let hits = descriptor.hits_addend.map_or(default_hits, |h| h.value);
                    let hits = u32::try_from(hits).unwrap_or(u32::MAX);
                    // Envoy's `is_negative_hits` (1.38+): a refund.
                    let direction = if descriptor.is_negative_hits {
                        Direction::Refund
                    } else {
                        charge
                    };
                    counts.push(Count {
                        counter: counter_key(domain, descriptor, f.shared.as_deref()),
                        quota: Quota {
                            limit: requests,
                            window_ms: unit.window_ms(),
                            burst: requests.max(1),
                        },
                        hits,
                        direction,
                    });
                    hits_of.push(u64::from(hits));
                    Plan::Counted(f, counts.len() - 1)
                }
            };
            plans.push(plan);
        }
        let now_ms = (self.clock)();
        let decisions = self
            .counters
            .decide(settings, &counts, now_ms, connection)
            .await;
        if settings.store_failure == StoreFailure::Error
            && let Some(err) = decisions.iter().find_map(|d| d.as_ref().err())
        {
            for plan in &plans {
                if let Plan::Counted(f, index) = plan
                    && let Some(Err(err)) = decisions.get(*index)
                {
                    let hits = hits_of.get(*index).copied().unwrap_or(0);
                    self.metrics
                        .store_error(domain, &f.metric_key, hits, err.reason());
                }
            }
            self.metrics.call_error(CallError::Store);
            tracing::debug!(%err, domain, "quota store");
            return Err(Status::unavailable(format!("quota store: {err}")));
        }
        let near_ratio = settings.near_limit_ratio.get() as f32;
        let mut statuses = Vec::with_capacity(plans.len());
        let mut error: Option<&'static str> = None;
        let mut failed_rate_limit = 0_usize;
        let mut failed_quota = 0_usize;
        let mut total_quota = 0_usize;
        let mut passed = Vec::new();
        // The descriptor the headers describe: the fewest remaining, or the
        // last one over limit (envoyproxy/ratelimit's choice).
        let mut headers_from: Option<usize> = None;
        let mut min_remaining = u32::MAX;
        for (index, plan) in plans.iter().enumerate() {
            let (status, quota_mode) = match plan {
                Plan::Unlimited => {
                    statuses.push(DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..DescriptorStatus::default()
                    });
                    continue;
                }
                Plan::Free => (
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        ..DescriptorStatus::default()
                    },
                    false,
                ),
                Plan::Counted(f, count_index) => {
                    let limit = &f.limit;
                    let hits = hits_of.get(*count_index).copied().unwrap_or(0);
                    let (requests, unit) = limit.quota.unwrap_or((0, Unit::Second));
                    let direction = counts
                        .get(*count_index)
                        .map_or(Direction::Take, |count| count.direction);
                    let status = match decisions.get(*count_index) {
                        Some(Ok(decided)) => {
                            let (decision, cached) = match decided {
                                Decided::Counted(d) => (*d, false),
                                Decided::Cached(d) => (*d, true),
                            };
                            let over = !decision.admitted;
                            if cached {
                                self.metrics.over_limit_from_cache(
                                    domain,
                                    &f.metric_key,
                                    hits,
                                    limit.shadow_mode,
                                );
                            } else if direction == Direction::Refund {
                                // Hits given back are no hits: envoyproxy/
                                // ratelimit's statistics have no place for
                                // them.
                            } else {
                                // The fixed window's count includes these
                                // hits, and so does a charge's; the others'
                                // "used" does when they were admitted.
                                let after = if over
                                    && settings.algorithm != Algorithm::FixedWindow
                                    && direction == Direction::Take
                                {
                                    decision.used.saturating_add(hits)
                                } else {
                                    decision.used
                                };
                                self.metrics.counted(
                                    domain,
                                    &f.metric_key,
                                    Outcome {
                                        hits,
                                        before: after.saturating_sub(hits),
                                        after,
                                        limit: u64::from(requests),
                                        near: (requests as f32 * near_ratio).floor() as u64,
                                        over,
                                        shadow: limit.shadow_mode,
                                    },
                                );
                            }
                            let enforced = over && !limit.shadow_mode;
                            DescriptorStatus {
                                code: if enforced { Code::OverLimit } else { Code::Ok } as i32,
                                current_limit: Some(RateLimit {
                                    name: limit.name.clone(),
                                    requests_per_unit: requests,
                                    unit: unit.to_wire(),
                                }),
                                limit_remaining: if over { 0 } else { decision.remaining },
                                duration_until_reset: Some(whole_seconds(decision.reset_ms)),
                                ..DescriptorStatus::default()
                            }
                        }
                        Some(Err(err)) => {
                            self.metrics
                                .store_error(domain, &f.metric_key, hits, err.reason());
                            tracing::debug!(%err, domain, "quota store");
                            error = Some(err.reason());
                            let code = if settings.store_failure == StoreFailure::Deny {
                                Code::OverLimit
                            } else {
                                Code::Ok
                            };
                            DescriptorStatus {
                                code: code as i32,
                                ..DescriptorStatus::default()
                            }
                        }
                        None => DescriptorStatus {
                            code: Code::Ok as i32,
                            ..DescriptorStatus::default()
                        },
                    };
                    (status, limit.quota_mode)
                }
            };
            let quota_mode = quota_mode || settings.global_quota_mode;
            if status.current_limit.is_some() && status.limit_remaining < min_remaining {
                headers_from = Some(index);
                min_remaining = status.limit_remaining;
            }
            if status.code == Code::OverLimit as i32 {
                if quota_mode {
                    failed_quota += 1;
                } else {
                    failed_rate_limit += 1;
                    headers_from = Some(index);
                    min_remaining = 0;
                }
            } else {
                passed.push(index);
            }
            if quota_mode {
                total_quota += 1;
            }
            statuses.push(status);
        }
        let mut over_limit =
            failed_rate_limit > 0 || (total_quota > 0 && total_quota == failed_quota);
        let mut response_headers_to_add = Vec::new();
        if let Some(names) = &settings.response_headers
            && let Some(status) = headers_from.and_then(|index| statuses.get(index))
            && let Some(limit) = &status.current_limit
        {
            let header = |key: &str, value: String| HeaderValue {
                key: key.to_owned(),
                value,
                ..HeaderValue::default()
            };
            let reset = status.duration_until_reset.map_or(0, |d| d.seconds);
            response_headers_to_add = vec![
                header(&names.limit, limit.requests_per_unit.to_string()),
                header(&names.remaining, status.limit_remaining.to_string()),
                header(&names.reset, reset.to_string()),
            ];
        }
        if let Some(reason) = error {
            // Tells the client (and, forwarded, the caller) that this answer
            // is the failure policy's, not a count.
            response_headers_to_add.push(HeaderValue {
                key: ERROR_HEADER.to_owned(),
                value: reason.to_owned(),
                ..HeaderValue::default()
            });
        }
        if over_limit && settings.global_shadow_mode {
            over_limit = false;
            self.metrics.global_shadow_mode();
        }
        let dynamic_metadata = settings.dynamic_metadata.then(|| {
            let passed_metadata = passed.iter().filter_map(|index| match plans.get(*index) {
                Some(Plan::Counted(f, _)) => f.limit.metadata.as_ref(),
                _ => None,
            });
            metadata::response(request, passed_metadata)
        });
        Ok(RateLimitResponse {
            overall_code: if over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            statuses,
            response_headers_to_add,
            dynamic_metadata,
            ..RateLimitResponse::default()
        })
    }
}

/// The counter of a descriptor: domain and every entry, length-prefixed so
/// no two descriptors share a key whatever their bytes; an entry matched
/// by a `share_threshold` wildcard counts under the pattern instead of its
/// value.
pub(super) fn counter_key(
    domain: &str,
    descriptor: &RateLimitDescriptor,
    shared: Option<&[Option<&str>]>,
) -> String {
    let mut key = String::with_capacity(
        domain.len()
            + descriptor
                .entries
                .iter()
                .map(|e| e.key.len() + e.value.len() + 8)
                .sum::<usize>(),
    );
    let mut push = |part: &str| {
        key.push_str(&part.len().to_string());
        key.push(':');
        key.push_str(part);
    };
    push(domain);
    for (index, entry) in descriptor.entries.iter().enumerate() {
        push(&entry.key);
        let value = shared
            .and_then(|shared| shared.get(index).copied().flatten())
            .map_or(entry.value.as_str(), |pattern| pattern);
        push(value);
    }
    key
}

/// The counter of a descriptor given as `(key, value)` entries (what
/// [`super::redis_store::fixed_window_key`] and the store key it by), for
/// reading a count in the store from outside.
pub fn counter_for(domain: &str, entries: &[(&str, &str)]) -> String {
    let descriptor = RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| {
                envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                }
            })
            .collect(),
        ..RateLimitDescriptor::default()
    };
    counter_key(domain, &descriptor, None)
}

/// Milliseconds as envoyproxy/ratelimit's whole seconds (rounded up: a
/// reset 0.3 s away is 1 s away).
fn whole_seconds(ms: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ms.div_ceil(1_000)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use std::sync::atomic::{AtomicU64, Ordering};

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };

    use super::*;
    use crate::quotas::settings::{NearLimitRatio, QuotaSettings, ResponseHeaders, StoreFailure};
    use crate::quotas::{Algorithm, QuotaConfig};

    const CONFIG: &str = r#"
domain: api
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: second, requests_per_unit: 2, name: free}
  - key: plan
    value: vip
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: free}]}
  - key: beta
    rate_limit: {unit: second, requests_per_unit: 1}
    shadow_mode: true
  - key: open
    rate_limit: {unlimited: true}
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

    fn quotas_with(
        settings: QuotaSettings,
        now: &Arc<AtomicU64>,
    ) -> (Quotas, crate::metrics::ControlPlaneMetrics) {
        let config = QuotaConfig::from_files(&[("q.yaml".to_owned(), CONFIG.to_owned())]).unwrap();
        let clock = Arc::clone(now);
        let metrics = crate::metrics::ControlPlaneMetrics::new(1);
        let quotas = Quotas::new(
            config,
            None,
            settings,
            Arc::new(move || clock.load(Ordering::Relaxed)),
            metrics.quotas(),
        );
        (quotas, metrics)
    }

    fn quotas(now: &Arc<AtomicU64>) -> Quotas {
        quotas_with(QuotaSettings::default(), now).0
    }

    fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    fn try_ask(
        quotas: &Quotas,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> Result<RateLimitResponse, Status> {
        block_on(quotas.answer(&RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend: 0,
        }))
    }

    fn ask(
        quotas: &Quotas,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> RateLimitResponse {
        try_ask(quotas, domain, descriptors).unwrap()
    }

    /// The in-memory store never waits: a current-thread runtime suffices.
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    fn series(metrics: &crate::metrics::ControlPlaneMetrics, prefix: &str) -> Option<String> {
        metrics
            .encode()
            .unwrap()
            .lines()
            .find(|line| line.starts_with(prefix))
            .map(str::to_owned)
    }

    #[test]
    fn near_limit_starts_at_the_configured_ratio() {
        let near = |ratio: f64| {
            let now = Arc::new(AtomicU64::new(10_000));
            let (quotas, metrics) = quotas_with(
                QuotaSettings {
                    near_limit_ratio: NearLimitRatio::new(ratio).unwrap(),
                    ..QuotaSettings::default()
                },
                &now,
            );
            // Six hits of the ten a minute allows.
            for _ in 0..6 {
                ask(&quotas, "api", vec![descriptor(&[("ten", "x")])]);
            }
            series(
                &metrics,
                r#"sluice_quota_near_limit_total{domain="api",key="ten"}"#,
            )
        };
        // Near from the sixth hit at 0.5 (past 5), none at 0.8 (past 8).
        assert!(
            near(0.5).is_some_and(|line| line.ends_with(" 1")),
            "{:?}",
            near(0.5)
        );
        assert_eq!(near(0.8), None);
        assert!(NearLimitRatio::new(1.0).is_err());
        assert!(NearLimitRatio::new(0.0).is_err());
        assert!(NearLimitRatio::new(f64::NAN).is_err());
    }

    /// The fixed window by default, reset in whole seconds, no headers
    /// unless asked for, then in envoyproxy/ratelimit's format
    /// (`TestServiceWithCustomRatelimitHeaders`).
    #[test]
    fn counts_exactly_and_answers_the_contract() {
        let now = Arc::new(AtomicU64::new(10_250));
        let quotas = quotas(&now);
        assert_eq!(quotas.settings().algorithm, Algorithm::FixedWindow);
        let free = || vec![descriptor(&[("plan", "free")])];
        let first = ask(&quotas, "api", free());
        assert_eq!(first.overall_code, Code::Ok as i32);
        assert!(
            first.response_headers_to_add.is_empty(),
            "no headers unless asked"
        );
        let second = ask(&quotas, "api", free());
        assert_eq!(second.overall_code, Code::Ok as i32);
        assert_eq!(second.statuses[0].limit_remaining, 0);
        let third = ask(&quotas, "api", free());
        assert_eq!(third.overall_code, Code::OverLimit as i32);
        let status = &third.statuses[0];
        assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 2);
        assert_eq!(status.current_limit.as_ref().unwrap().name, "free");
        assert_eq!(
            status.duration_until_reset,
            Some(ProtoDuration {
                seconds: 1,
                nanos: 0
            })
        );
        now.store(11_000, Ordering::Relaxed);
        assert_eq!(ask(&quotas, "api", free()).overall_code, Code::Ok as i32);

        let (quotas, _) = quotas_with(
            QuotaSettings {
                response_headers: Some(ResponseHeaders {
                    limit: "A-Ratelimit-Limit".to_owned(),
                    ..ResponseHeaders::default()
                }),
                ..QuotaSettings::default()
            },
            &Arc::new(AtomicU64::new(62_000)),
        );
        // Over on `free` (2/s) and 9 left of `ten` (10/min): the headers
        // name the one over its limit.
        ask(&quotas, "api", free());
        ask(&quotas, "api", free());
        let answer = ask(
            &quotas,
            "api",
            vec![descriptor(&[("plan", "free")]), descriptor(&[("ten", "x")])],
        );
        let headers: Vec<(String, String)> = answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        assert_eq!(
            headers,
            [
                ("A-Ratelimit-Limit".to_owned(), "2".to_owned()),
                ("RateLimit-Remaining".to_owned(), "0".to_owned()),
                ("RateLimit-Reset".to_owned(), "1".to_owned()),
            ]
        );
        // Within both: the one with the fewest left (`ten`, 58 s to go).
        let answer = ask(&quotas, "api", vec![descriptor(&[("ten", "x")])]);
        let values: Vec<&str> = answer
            .response_headers_to_add
            .iter()
            .map(|h| h.value.as_str())
            .collect();
        assert_eq!(values, ["10", "8", "58"]);
    }

    #[test]
    fn replaces_shadow_unlimited_unknown_and_overrides() {
        let now = Arc::new(AtomicU64::new(0));
        let quotas = quotas(&now);
        // vip replaces free in the same request: only vip counts.
        let both = || {
            vec![
                descriptor(&[("plan", "free")]),
                descriptor(&[("plan", "vip")]),
            ]
        };
        let first = ask(&quotas, "api", both());
        assert_eq!(first.statuses[0].current_limit, None);
        assert_eq!(
            ask(&quotas, "api", both()).overall_code,
            Code::OverLimit as i32
        );
        // Shadow: over the limit but OK, with nothing left.
        for n in 0..3 {
            let answer = ask(&quotas, "api", vec![descriptor(&[("beta", "x")])]);
            assert_eq!(answer.overall_code, Code::Ok as i32);
            assert_eq!(answer.statuses[0].code, Code::Ok as i32);
            assert_eq!(answer.statuses[0].limit_remaining, 0, "hit {n}");
        }
        // Unlimited: OK, everything left, no limit (TestUnlimited).
        let open = ask(&quotas, "api", vec![descriptor(&[("open", "x")])]);
        assert_eq!(
            open.statuses[0],
            DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            }
        );
        // An unknown domain has no limits, not even an override's
        // (TestConfigLimitOverride).
        let mut overridden = descriptor(&[("any", "thing")]);
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: Unit::Minute.to_wire(),
        });
        let unknown = ask(&quotas, "nope", vec![overridden.clone()]);
        assert_eq!(unknown.overall_code, Code::Ok as i32);
        assert_eq!(unknown.statuses[0].current_limit, None);
        // In a known domain an override replaces the configuration.
        assert_eq!(
            ask(&quotas, "api", vec![overridden.clone()]).overall_code,
            Code::Ok as i32
        );
        assert_eq!(
            ask(&quotas, "api", vec![overridden.clone()]).overall_code,
            Code::OverLimit as i32
        );
        // An override without a unit is refused, not ignored.
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 0,
        });
        let err = try_ask(&quotas, "api", vec![overridden]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    /// `TestEmptyDomain`, `TestEmptyDescriptors`: errors, word for word.
    #[test]
    fn an_empty_domain_or_descriptor_list_is_an_error() {
        let now = Arc::new(AtomicU64::new(0));
        let (quotas, metrics) = quotas_with(QuotaSettings::default(), &now);
        let err = try_ask(&quotas, "", vec![descriptor(&[("plan", "free")])]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unknown);
        assert_eq!(err.message(), "rate limit domain must not be empty");
        let err = try_ask(&quotas, "api", vec![]).unwrap_err();
        assert_eq!(
            err.message(),
            "rate limit descriptor list must not be empty"
        );
        assert!(
            series(
                &metrics,
                r#"sluice_quota_should_rate_limit_error_total{err_type="service_error"} 2"#
            )
            .is_some()
        );
    }

    /// A store that cannot count: a gRPC error by default, the other
    /// answers when chosen.
    #[test]
    fn a_store_failure_is_an_error_unless_told_otherwise() {
        let answer = |store_failure| {
            let now = Arc::new(AtomicU64::new(0));
            let (quotas, metrics) = quotas_with(
                QuotaSettings {
                    store_failure,
                    // Room for no counter at all.
                    store_bytes: 16,
                    ..QuotaSettings::default()
                },
                &now,
            );
            // A descriptor without a limit first: the failed one is the
            // second.
            let answer = try_ask(
                &quotas,
                "api",
                vec![descriptor(&[("nothing", "x")]), descriptor(&[("ten", "x")])],
            );
            (answer, metrics)
        };
        let (err, metrics) = answer(StoreFailure::Error);
        let err = err.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
        for line in [
            r#"sluice_quota_should_rate_limit_error_total{err_type="redis_error"} 1"#,
            r#"sluice_quota_total_hits_total{domain="api",key="ten"} 1"#,
            r#"sluice_quota_store_errors_total{reason="store_full"} 1"#,
        ] {
            assert!(series(&metrics, line).is_some(), "{line}");
        }
        for (store_failure, code) in [
            (StoreFailure::Allow, Code::Ok),
            (StoreFailure::Deny, Code::OverLimit),
        ] {
            let answer = answer(store_failure).0.unwrap();
            assert_eq!(answer.overall_code, code as i32);
            assert_eq!(answer.statuses[1].code, code as i32);
            assert_eq!(answer.response_headers_to_add[0].key, ERROR_HEADER);
            assert_eq!(answer.response_headers_to_add[0].value, "store_full");
        }
    }

    #[test]
    fn hits_addend_and_oversized_requests() {
        let now = Arc::new(AtomicU64::new(0));
        let quotas = quotas(&now);
        let heavy = block_on(quotas.answer(&RateLimitRequest {
            domain: "api".to_owned(),
            descriptors: vec![descriptor(&[("plan", "free")])],
            hits_addend: 3,
        }))
        .unwrap();
        assert_eq!(heavy.overall_code, Code::OverLimit as i32);
        // Over limit: nothing left, reset in the future.
        assert_eq!(heavy.statuses[0].limit_remaining, 0);
        assert_eq!(heavy.statuses[0].duration_until_reset.unwrap().seconds, 1);
        let many = RateLimitRequest {
            domain: "api".to_owned(),
            descriptors: vec![descriptor(&[("plan", "free")]); MAX_DESCRIPTORS + 1],
            hits_addend: 0,
        };
        assert_eq!(
            block_on(quotas.answer(&many)).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    /// A descriptor with its own hits (Envoy's per-descriptor
    /// `hits_addend`), given back when `refund` (`is_negative_hits`).
    fn costed(pairs: &[(&str, &str)], hits: u64, refund: bool) -> RateLimitDescriptor {
        RateLimitDescriptor {
            hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits }),
            is_negative_hits: refund,
            ..descriptor(pairs)
        }
    }

    /// `(code, remaining)` of each descriptor of one answer.
    fn answered(quotas: &Quotas, descriptors: Vec<RateLimitDescriptor>) -> Vec<(i32, u32)> {
        ask(quotas, "api", descriptors)
            .statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect()
    }

    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;

    /// Envoy AI Gateway's two calls: a check that counts nothing (a
    /// descriptor's `hits_addend` of 0; a request's 0 is its default of
    /// 1), then the charge when the stream ends, counted in full even
    /// past the limit, and a refund (`is_negative_hits`) that gives hits
    /// back and is never refused.
    #[test]
    fn checks_charges_and_refunds() {
        let now = Arc::new(AtomicU64::new(0));
        let (quotas, metrics) = quotas_with(QuotaSettings::default(), &now);
        let ten = [("ten", "t")];
        // A request's hits_addend 0 counts one hit.
        assert_eq!(answered(&quotas, vec![descriptor(&ten)]), [(OK, 9)]);
        // A check counts nothing.
        assert_eq!(answered(&quotas, vec![costed(&ten, 0, false)]), [(OK, 9)]);
        // The stream used 25: over the limit, counted all the same.
        assert_eq!(
            answered(&quotas, vec![costed(&ten, 25, false)]),
            [(OVER, 0)]
        );
        assert_eq!(answered(&quotas, vec![costed(&ten, 0, false)]), [(OVER, 0)]);
        // A refund of 20 (26 - 20 = 6 used): OK, and the check passes again.
        assert_eq!(answered(&quotas, vec![costed(&ten, 20, true)]), [(OK, 4)]);
        assert_eq!(answered(&quotas, vec![costed(&ten, 0, false)]), [(OK, 4)]);
        // A refund of more than was counted stops at zero.
        assert_eq!(
            answered(&quotas, vec![costed(&ten, 1_000, true)]),
            [(OK, 10)]
        );
        // A refund is no hit in the statistics: 1 + 0 + 25 + 0 + 0.
        assert!(
            series(
                &metrics,
                r#"sluice_quota_total_hits_total{domain="api",key="ten"} 26"#
            )
            .is_some(),
            "{:?}",
            series(&metrics, "sluice_quota_total_hits_total")
        );
    }

    /// The sliding window and GCRA drop a take they refuse; with
    /// `count_refused_hits` a charge on a spent quota counts all the same,
    /// and a refund gives it back.
    #[test]
    fn refused_hits_count_when_asked_on_every_algorithm() {
        for algorithm in [Algorithm::SlidingWindow, Algorithm::Gcra] {
            for count_refused_hits in [false, true] {
                let now = Arc::new(AtomicU64::new(0));
                let (quotas, _) = quotas_with(
                    QuotaSettings {
                        algorithm,
                        count_refused_hits,
                        ..QuotaSettings::default()
                    },
                    &now,
                );
                let ten = [("ten", "t")];
                assert_eq!(answered(&quotas, vec![costed(&ten, 8, false)])[0].0, OK);
                assert_eq!(answered(&quotas, vec![costed(&ten, 30, false)])[0].0, OVER);
                // 8 + 30 counted, or only 8: a check sees the difference.
                let check = answered(&quotas, vec![costed(&ten, 0, false)])[0];
                if count_refused_hits {
                    assert_eq!(check, (OVER, 0), "{algorithm:?}");
                    // The 30 given back: 8 counted again.
                    assert_eq!(answered(&quotas, vec![costed(&ten, 30, true)]), [(OK, 2)]);
                } else {
                    assert_eq!(check, (OK, 2), "{algorithm:?}");
                }
            }
        }
    }

    /// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, a charge that takes
    /// one descriptor over is not counted in the others (the documented
    /// cost), but a refund is always given.
    #[test]
    fn stop_increment_never_withholds_a_refund() {
        let now = Arc::new(AtomicU64::new(0));
        let (quotas, _) = quotas_with(
            QuotaSettings {
                stop_increment_when_over_limit: true,
                ..QuotaSettings::default()
            },
            &now,
        );
        let (ten, plan) = ([("ten", "t")], [("plan", "free")]);
        // `plan` allows 2 a second: a charge of 5 takes it over, so `ten`
        // does not count it.
        let charged = answered(
            &quotas,
            vec![costed(&ten, 5, false), costed(&plan, 5, false)],
        );
        assert_eq!(charged, [(OK, 10), (OVER, 0)]);
        assert_eq!(answered(&quotas, vec![costed(&ten, 4, false)]), [(OK, 6)]);
        // A refund beside a descriptor going over is still given.
        let mixed = answered(
            &quotas,
            vec![costed(&ten, 3, true), costed(&plan, 1, false)],
        );
        assert_eq!(mixed, [(OK, 9), (OVER, 0)]);
    }

    #[test]
    fn a_detailed_metric_counts_per_value_and_others_per_key_path() {
        const DETAILED: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
    detailed_metric: true
  - key: team
    rate_limit: {unit: second, requests_per_unit: 10}
"#;
        let config =
            QuotaConfig::from_files(&[("d.yaml".to_owned(), DETAILED.to_owned())]).unwrap();
        let metrics = crate::metrics::ControlPlaneMetrics::new(1);
        let quotas = Quotas::new(
            config,
            None,
            QuotaSettings::default(),
            Arc::new(|| 0),
            metrics.quotas(),
        );
        for (key, value) in [
            ("user", "bob"),
            ("user", "bob"),
            ("user", "ann"),
            ("team", "red"),
        ] {
            ask(&quotas, "api", vec![descriptor(&[(key, value)])]);
        }
        let text = metrics.encode().unwrap();
        for line in [
            r#"sluice_quota_total_hits_total{domain="api",key="user_bob"} 2"#,
            r#"sluice_quota_total_hits_total{domain="api",key="user_ann"} 1"#,
            r#"sluice_quota_total_hits_total{domain="api",key="team"} 1"#,
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert!(!text.contains(r#"key="user"}"#), "{text}");
    }
}
