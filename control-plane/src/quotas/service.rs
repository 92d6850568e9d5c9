//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: each
//! descriptor of a request is matched to its limit, counted in the store
//! and answered, and the request is over limit when any enforced
//! descriptor is.

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

use super::Quotas;
use super::algorithm::{Decision, Quota};
use super::config::{Limit, Unit};
use super::lookup;
use super::redis_store::Count;
use crate::store::StoreConnection;

/// Most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 16;
/// Response header naming why an answer comes from the failure policy
/// (`store_timeout`, `store_unavailable`, `store_full`) rather than a count.
pub const ERROR_HEADER: &str = "x-ratelimit-error";

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
    pub fn new(quotas: Arc<Quotas>) -> Self {
        Self {
            quotas,
            connection: None,
        }
    }

    /// As [`Self::new`], over `connection` (see [`Quotas::open_connection`]).
    pub fn on_connection(quotas: Arc<Quotas>, connection: Option<StoreConnection>) -> Self {
        Self { quotas, connection }
    }
}

/// One descriptor's outcome, before it becomes a status.
#[derive(Debug)]
struct Counted {
    limit: RateLimit,
    decision: Decision,
    over: bool,
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

impl Quotas {
    /// Answers one request (on Redis, over the store's shared connection).
    pub async fn answer(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        self.answer_on(request, None).await
    }

    /// Answers one request; on Redis over `connection` when given.
    pub async fn answer_on(
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
        let config = self.config();
        let root = config.domains.get(&request.domain);
        let default_hits = request.hits_addend.max(1);
        // Limits of this request, by descriptor.
        let limits: Vec<Option<Limit>> = request
            .descriptors
            .iter()
            .map(|descriptor| match &descriptor.limit {
                Some(over) => Unit::from_wire(over.unit).map(|unit| Limit {
                    quota: Some((over.requests_per_unit, unit)),
                    shadow_mode: false,
                    name: String::new(),
                    replaces: Vec::new(),
                    detailed_metric: false,
                    full_key: format!("{}.override", request.domain),
                }),
                None => root.and_then(|root| {
                    let entries: Vec<(&str, &str)> = descriptor
                        .entries
                        .iter()
                        .map(|e| (e.key.as_str(), e.value.as_str()))
                        .collect();
                    lookup::find(root, &entries).cloned()
                }),
            })
            .collect();
        let replaced: HashSet<&str> = limits
            .iter()
            .flatten()
            .flat_map(|limit| limit.replaces.iter().map(String::as_str))
            .collect();
        let now_ms = (self.clock)();
        // First what to count, then one call to the store for all of it
        // (one round trip on Redis), then the answer.
        let mut plans: Vec<Option<(&Limit, u32, Unit, &RateLimitDescriptor)>> =
            Vec::with_capacity(limits.len());
        let mut counts = Vec::new();
        for (descriptor, limit) in request.descriptors.iter().zip(&limits) {
            let limit = limit
                .as_ref()
                .filter(|l| l.name.is_empty() || !replaced.contains(l.name.as_str()));
            let Some((limit, (requests, unit))) = limit.and_then(|l| l.quota.map(|q| (l, q)))
            else {
                // No limit, unlimited or replaced: OK without a limit.
                plans.push(None);
                continue;
            };
            let hits = descriptor
                .hits_addend
                .map_or(default_hits, |h| u32::try_from(h.value).unwrap_or(u32::MAX));
            counts.push(Count {
                counter: counter_key(&request.domain, descriptor),
                quota: Quota {
                    limit: requests,
                    window_ms: unit.window_ms(),
                    burst: requests.max(1),
                },
                hits,
            });
            plans.push(Some((limit, requests, unit, descriptor)));
        }
        let mut decisions = self
            .counters
            .decide(
                &request.domain,
                self.algorithm,
                &counts,
                now_ms,
                &self.metrics,
                connection,
            )
            .await
            .into_iter()
            .zip(&counts);
        let mut statuses = Vec::with_capacity(request.descriptors.len());
        let mut tightest: Option<Counted> = None;
        let mut over_limit = false;
        let mut error: Option<&'static str> = None;
        for plan in plans {
            // Each counted descriptor takes the next decision, in order.
            let Some(((limit, requests, unit, descriptor), (decision, count))) =
                plan.and_then(|plan| decisions.next().map(|next| (plan, next)))
            else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let decision = match decision {
                Ok(decision) => decision,
                Err(err) => {
                    self.metrics.error(&limit.full_key, err.reason());
                    tracing::debug!(%err, counter = count.counter, "quota store");
                    error = Some(err.reason());
                    // The configured failure answer: OK (fail open) unless
                    // told to fail closed.
                    let code = if self.fail_closed {
                        Code::OverLimit
                    } else {
                        Code::Ok
                    };
                    over_limit |= self.fail_closed;
                    statuses.push(DescriptorStatus {
                        code: code as i32,
                        ..DescriptorStatus::default()
                    });
                    continue;
                }
            };
            let hits = count.hits;
            let over = !decision.admitted;
            let metric_key = if limit.detailed_metric {
                let entries = descriptor.entries.iter();
                Cow::Owned(self.metrics.detailed_key(
                    &limit.full_key,
                    &request.domain,
                    entries.map(|e| (e.key.as_str(), e.value.as_str())),
                ))
            } else {
                Cow::Borrowed(limit.full_key.as_str())
            };
            self.metrics.hit(&metric_key, hits);
            if over {
                self.metrics.over_limit(&metric_key, limit.shadow_mode);
            } else if decision.used as f64 >= self.near_limit_ratio.get() * f64::from(requests) {
                self.metrics.near_limit(&metric_key);
            }
            let enforced_over = over && !limit.shadow_mode;
            over_limit |= enforced_over;
            let current = RateLimit {
                name: limit.name.clone(),
                requests_per_unit: requests,
                unit: unit.to_wire(),
            };
            statuses.push(DescriptorStatus {
                code: if enforced_over {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                current_limit: Some(current.clone()),
                limit_remaining: decision.remaining,
                duration_until_reset: Some(duration(decision.reset_ms)),
                ..DescriptorStatus::default()
            });
            let counted = Counted {
                limit: current,
                decision,
                over: enforced_over,
            };
            // The headers describe the tightest limit: over limit first,
            // then the fewest hits left.
            let rank = |c: &Counted| (c.over, std::cmp::Reverse(c.decision.remaining));
            if tightest.as_ref().is_none_or(|t| rank(&counted) > rank(t)) {
                tightest = Some(counted);
            }
        }
        let mut response_headers_to_add = tightest.map(|t| headers(&t)).unwrap_or_default();
        if let Some(reason) = error {
            // Tells the client (and, forwarded, the caller) that this answer
            // is the failure policy's, not a count.
            response_headers_to_add.push(HeaderValue {
                key: ERROR_HEADER.to_owned(),
                value: reason.to_owned(),
                ..HeaderValue::default()
            });
        }
        Ok(RateLimitResponse {
            overall_code: if over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        })
    }
}

/// The counter of a descriptor: domain and every entry, length-prefixed so
/// no two descriptors share a key whatever their bytes.
pub(super) fn counter_key(domain: &str, descriptor: &RateLimitDescriptor) -> String {
    let mut key = String::with_capacity(
        domain.len()
            + descriptor
                .entries
                .iter()
                .map(|e| e.key.len() + e.value.len() + 8)
                .sum::<usize>(),
    );
    key.push_str(&domain.len().to_string());
    key.push(':');
    key.push_str(domain);
    for entry in &descriptor.entries {
        for part in [&entry.key, &entry.value] {
            key.push_str(&part.len().to_string());
            key.push(':');
            key.push_str(part);
        }
    }
    key
}

fn duration(ms: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1_000) * 1_000_000).unwrap_or(0),
    }
}

/// `x-ratelimit-limit`, `-remaining` and `-reset` of the tightest limit,
/// as envoyproxy/ratelimit sends them.
fn headers(counted: &Counted) -> Vec<HeaderValue> {
    let window_s = Unit::from_wire(counted.limit.unit).map_or(1, |u| u.window_ms() / 1_000);
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header(
            "x-ratelimit-limit",
            format!(
                "{}, {};w={window_s}",
                counted.limit.requests_per_unit, counted.limit.requests_per_unit
            ),
        ),
        header(
            "x-ratelimit-remaining",
            counted.decision.remaining.to_string(),
        ),
        header(
            "x-ratelimit-reset",
            counted.decision.reset_ms.div_ceil(1_000).to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use std::sync::atomic::{AtomicU64, Ordering};

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };

    use super::*;
    use crate::quotas::{Algorithm, QuotaConfig, QuotaSettings};

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
"#;

    fn quotas(now: &Arc<AtomicU64>) -> Quotas {
        let config = QuotaConfig::from_files(&[("q.yaml".to_owned(), CONFIG.to_owned())]).unwrap();
        let clock = Arc::clone(now);
        Quotas::new(
            config,
            None,
            QuotaSettings {
                algorithm: Algorithm::FixedWindow,
                ..QuotaSettings::default()
            },
            Arc::new(move || clock.load(Ordering::Relaxed)),
            crate::metrics::Metrics::new(1).quotas(),
        )
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

    fn ask(
        quotas: &Quotas,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> RateLimitResponse {
        block_on(quotas.answer(&RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend: 0,
        }))
        .unwrap()
    }

    /// The in-memory store never waits: a current-thread runtime suffices.
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn near_limit_starts_at_the_configured_ratio() {
        let near = |ratio: f64| {
            let metrics = crate::metrics::Metrics::new(1);
            let config =
                QuotaConfig::from_files(&[("q.yaml".to_owned(), CONFIG.to_owned())]).unwrap();
            let quotas = Quotas::new(
                config,
                None,
                QuotaSettings {
                    algorithm: Algorithm::FixedWindow,
                    near_limit_ratio: super::super::NearLimitRatio::new(ratio).unwrap(),
                    ..QuotaSettings::default()
                },
                Arc::new(|| 10_000),
                metrics.quotas(),
            );
            // One hit of the two `free` allows per second.
            ask(&quotas, "api", vec![descriptor(&[("plan", "free")])]);
            let text = metrics.encode().unwrap();
            text.lines()
                .find(|line| line.starts_with("sluice_quota_near_limit_total{"))
                .map(str::to_owned)
        };
        // Half the quota used: near from 0.5, not at the default 0.8.
        assert!(near(0.5).is_some_and(|line| line.ends_with(" 1")));
        assert_eq!(near(0.8), None);
        assert!(super::super::NearLimitRatio::new(1.0).is_err());
        assert!(super::super::NearLimitRatio::new(0.0).is_err());
        assert!(super::super::NearLimitRatio::new(f64::NAN).is_err());
    }

    #[test]
    fn counts_exactly_and_answers_the_contract() {
        let now = Arc::new(AtomicU64::new(10_250));
        let quotas = quotas(&now);
        let free = || vec![descriptor(&[("plan", "free")])];
        assert_eq!(ask(&quotas, "api", free()).overall_code, Code::Ok as i32);
        let second = ask(&quotas, "api", free());
        assert_eq!(second.overall_code, Code::Ok as i32);
        assert_eq!(second.statuses[0].limit_remaining, 0);
        let third = ask(&quotas, "api", free());
        assert_eq!(third.overall_code, Code::OverLimit as i32);
        let status = &third.statuses[0];
        assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 2);
        assert_eq!(status.duration_until_reset.unwrap().nanos, 750_000_000);
        let headers: Vec<(String, String)> = third
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        assert!(headers.contains(&("x-ratelimit-limit".to_owned(), "2, 2;w=1".to_owned())));
        assert!(headers.contains(&("x-ratelimit-reset".to_owned(), "1".to_owned())));
        now.store(11_000, Ordering::Relaxed);
        assert_eq!(ask(&quotas, "api", free()).overall_code, Code::Ok as i32);
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
        // Shadow: over the limit but OK.
        for _ in 0..3 {
            assert_eq!(
                ask(&quotas, "api", vec![descriptor(&[("beta", "x")])]).overall_code,
                Code::Ok as i32
            );
        }
        assert_eq!(
            ask(&quotas, "api", vec![descriptor(&[("open", "x")])]).overall_code,
            Code::Ok as i32
        );
        // An unknown domain has no limits (envoyproxy/ratelimit answers OK).
        assert_eq!(
            ask(&quotas, "nope", vec![descriptor(&[("plan", "free")])]).overall_code,
            Code::Ok as i32
        );
        // A limit in the request overrides the configuration.
        let mut overridden = descriptor(&[("any", "thing")]);
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: Unit::Minute.to_wire(),
        });
        assert_eq!(
            ask(&quotas, "api", vec![overridden.clone()]).overall_code,
            Code::Ok as i32
        );
        assert_eq!(
            ask(&quotas, "api", vec![overridden]).overall_code,
            Code::OverLimit as i32
        );
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
        let metrics = crate::metrics::Metrics::new(1);
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
        assert!(
            text.contains(r#"sluice_quota_hits_total{key="api.user_bob"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sluice_quota_hits_total{key="api.user_ann"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sluice_quota_hits_total{key="api.team"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"key="api.user"}"#), "{text}");
    }
}
