//! A fleet holding a token budget: one control plane with a budget in
//! tokens per second, N Envoys whose filter charges each request its
//! tokens, the fake LLM upstream behind them, and an open-loop load of
//! streamed chat completions whose token counts are drawn from a
//! log-normal distribution. `just demo-tokens` prints it per interval;
//! `just bench-tokens` measures how closely it holds the budget.
//!
//! Each request draws its output tokens and sends them twice: as the
//! estimate the filter counts before its decision (`x-estimated-tokens`)
//! and as the count the upstream must produce (`x-output-tokens`), like a
//! client whose `max_tokens` the model uses up. With
//! [`Estimate::Constant`] the filter's estimate is a constant instead and
//! the upstream's answer is the only exact count. Either way the filter
//! charges what the upstream reported, read from the SSE stream's usage.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use hyper::header::HeaderName;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::fleet::{DataPlane, Fleet, FleetOptions};
use crate::llm_upstream::{LlmUpstream, LlmUpstreamOptions, TokenDistribution, TokenSampler};

/// The one bucket every request falls into.
pub const BUCKET: &str = "llm";
/// The request header carrying the estimate.
pub const ESTIMATE_HEADER: &str = "x-estimated-tokens";
/// The request header telling the upstream how many tokens to produce.
pub const OUTPUT_TOKENS_HEADER: &str = "x-output-tokens";

/// What the filter counts before its decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Estimate {
    /// The request's own token count (the client knows it).
    Exact,
    /// The same number for every request.
    Constant(u64),
}

/// The period a budget is written over in the limits file (the 429's
/// `ratelimit-policy` window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetPeriod {
    /// `per: second`.
    Second,
    /// `per: minute`.
    Minute,
    /// `per: hour`.
    Hour,
}

impl BudgetPeriod {
    /// Its length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
        }
    }

    /// Its name in the limits file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
        }
    }
}

/// The fleet and its budget.
#[derive(Debug, Clone)]
pub struct TokenFleetOptions {
    /// The budget, tokens per second fleet-wide.
    pub budget_per_s: f64,
    /// The period the limits file states the budget over (the amount is
    /// `budget_per_s` times its length).
    pub budget_period: BudgetPeriod,
    /// How many Envoys.
    pub envoys: usize,
    /// Tenants and their weights in the budget's fair share.
    pub tenants: Vec<(String, f64)>,
    /// The filter's estimate.
    pub estimate: Estimate,
    /// The wasm filter or the native module.
    pub data_plane: DataPlane,
    /// `--control-interval-ms` (`None`: the limits file's default).
    pub control_interval_ms: Option<u64>,
    /// Worker threads of every Envoy (`--concurrency`): each runs its own
    /// agent, with its own credits and caps per cell.
    pub workers: u32,
    /// More filter configuration keys (a JSON object), over the ones
    /// [`Self::filter`] sets.
    pub extra_filter: serde_json::Value,
    /// The limits file's `directive_ttl_ms` (`None`: the default).
    pub directive_ttl_ms: Option<u64>,
}

impl TokenFleetOptions {
    /// `envoys` Envoys of two workers holding `budget_per_s` tokens a
    /// second (written per second), exact estimates, the wasm filter, no
    /// tenants.
    pub fn new(budget_per_s: f64, envoys: usize) -> Self {
        Self {
            budget_per_s,
            budget_period: BudgetPeriod::Second,
            envoys,
            tenants: Vec::new(),
            estimate: Estimate::Exact,
            data_plane: DataPlane::Wasm,
            control_interval_ms: None,
            workers: 2,
            extra_filter: json!({}),
            directive_ttl_ms: None,
        }
    }

    /// The limits file.
    pub fn limits_yaml(&self) -> String {
        let mut yaml = format!(
            "limits:\n  - bucket: {BUCKET}\n    budget: {{amount: {}, unit: tokens, per: {}}}\n",
            self.budget_per_s * self.budget_period.seconds() as f64,
            self.budget_period.name()
        );
        if let Some(ttl_ms) = self.directive_ttl_ms {
            yaml.push_str(&format!("directive_ttl_ms: {ttl_ms}\n"));
        }
        if !self.tenants.is_empty() {
            yaml.push_str("tenants:\n");
            for (tenant, weight) in &self.tenants {
                yaml.push_str(&format!("  {tenant}: {{weight: {weight}}}\n"));
            }
        }
        yaml
    }

    /// The filter keys every Envoy gets: one bucket, the tenant from
    /// `x-tenant`, and the cost rule.
    pub fn filter(&self) -> serde_json::Value {
        let estimate = match self.estimate {
            Estimate::Exact => {
                json!({"source": "request_header", "name": ESTIMATE_HEADER, "default": 500})
            }
            Estimate::Constant(value) => json!({"source": "constant", "value": value}),
        };
        let mut filter = json!({
            "bucket_key": [{"source": "literal", "value": BUCKET}],
            "tenant": {"source": "header", "name": "x-tenant", "default": "default"},
            "cost_rules": [{
                "bucket": BUCKET,
                // Output tokens only, so the estimate can be exact.
                "cost": {"weights": {"input": 0, "output": 1}, "estimate": estimate},
                "actual": {"metadata": null, "body": {"parse": true}},
            }],
        });
        if let (Some(filter), Some(extra)) = (filter.as_object_mut(), self.extra_filter.as_object())
        {
            for (key, value) in extra {
                filter.insert(key.clone(), value.clone());
            }
        }
        filter
    }
}

/// A running token fleet. Dropping it stops every process.
#[derive(Debug)]
pub struct TokenFleet {
    /// The control plane and the Envoys.
    pub fleet: Fleet,
    /// The fake provider behind them.
    pub upstream: LlmUpstream,
    /// What it was started with.
    pub options: TokenFleetOptions,
}

impl TokenFleet {
    /// Starts the upstream, the control plane and the Envoys, and waits
    /// until every Envoy's filter is connected.
    pub async fn start(options: TokenFleetOptions) -> Result<Self> {
        let upstream = LlmUpstream::start(LlmUpstreamOptions {
            output_tokens_header: Some(HeaderName::from_static(OUTPUT_TOKENS_HEADER)),
            ..LlmUpstreamOptions::default()
        })
        .await?;
        let mut fleet_options = FleetOptions::new(&options.limits_yaml(), options.envoys)
            .with_data_plane(options.data_plane)
            .control_interval_ms(options.control_interval_ms)
            .concurrency(options.workers)
            .filter(options.filter());
        fleet_options.upstream = Some(upstream.addr());
        let fleet = Fleet::start(fleet_options).await?;
        fleet
            .wait_connected(options.envoys, Duration::from_secs(30))
            .await?;
        Ok(Self {
            fleet,
            upstream,
            options,
        })
    }
}

/// One stream of load: requests of one tenant through one Envoy.
#[derive(Debug, Clone)]
pub struct TokenStream {
    /// Index of the Envoy.
    pub envoy: usize,
    /// The tenant (`x-tenant`).
    pub tenant: String,
    /// Offered tokens per second, by time since the start: the rate in
    /// force from each instant on (the first at 0).
    pub tokens_per_s: Vec<(Duration, f64)>,
}

impl TokenStream {
    /// A constant rate.
    pub fn steady(envoy: usize, tenant: &str, tokens_per_s: f64) -> Self {
        Self {
            envoy,
            tenant: tenant.to_owned(),
            tokens_per_s: vec![(Duration::ZERO, tokens_per_s)],
        }
    }

    fn rate_at(&self, at: Duration) -> f64 {
        self.tokens_per_s
            .iter()
            .rev()
            .find(|(from, _)| *from <= at)
            .map_or(0.0, |(_, rate)| *rate)
    }
}

/// One request's end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completion {
    /// When it was sent, since the load's start.
    pub sent: Duration,
    /// When its response ended, since the load's start.
    pub ended: Duration,
    /// Index into the load's streams.
    pub stream: usize,
    /// The tokens it asked for.
    pub tokens: u64,
    /// The response status (0: no response).
    pub status: u16,
}

/// Open-loop load: each stream sends at Poisson arrivals whose mean rate
/// is its offered tokens per second over the distribution's mean tokens,
/// each request drawing its tokens.
#[derive(Debug)]
pub struct TokenLoad {
    started: Instant,
    completions: Arc<Mutex<Vec<Completion>>>,
    tasks: JoinSet<()>,
    /// The streams, as given.
    pub streams: Vec<TokenStream>,
}

impl TokenLoad {
    /// Starts sending through `fleet`'s Envoys for `duration`, each
    /// request's tokens drawn from the issue's distribution (median 500,
    /// p99 8,000).
    pub fn start(
        fleet: &TokenFleet,
        streams: Vec<TokenStream>,
        duration: Duration,
        seed: u64,
    ) -> Result<Self> {
        let urls = streams
            .iter()
            .map(|stream| {
                Ok(format!(
                    "{}/v1/chat/completions",
                    fleet.fleet.url(stream.envoy)?
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::start_on(
            &urls,
            TokenDistribution::median_500_p99_8000(),
            streams,
            duration,
            seed,
        )
    }

    /// Starts sending for `duration`: stream `i` posts to `urls[i]` (a
    /// chat completions URL), each request's tokens drawn from
    /// `distribution`.
    pub fn start_on(
        urls: &[String],
        distribution: TokenDistribution,
        streams: Vec<TokenStream>,
        duration: Duration,
        seed: u64,
    ) -> Result<Self> {
        ensure!(
            urls.len() == streams.len(),
            "{} URLs for {} streams",
            urls.len(),
            streams.len()
        );
        let mean_tokens = distribution.mean();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .context("cannot build the HTTP client")?;
        let started = Instant::now();
        let completions = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        for (index, (stream, url)) in streams.iter().zip(urls).enumerate() {
            let url = url.clone();
            let stream = stream.clone();
            let client = client.clone();
            let completions = Arc::clone(&completions);
            let seed = seed.wrapping_mul(1_000_003).wrapping_add(index as u64);
            tasks.spawn(async move {
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut sampler = TokenSampler::new(distribution, seed ^ 0x5eed);
                let mut requests = JoinSet::new();
                let mut at = Duration::ZERO;
                loop {
                    let rate = stream.rate_at(at) / mean_tokens;
                    // Exponential gaps; a stream at rate 0 looks again a
                    // little later.
                    let gap = if rate > 0.0 {
                        -(1.0 - rng.random::<f64>()).ln() / rate
                    } else {
                        0.05
                    };
                    at += Duration::from_secs_f64(gap);
                    if at >= duration {
                        break;
                    }
                    tokio::time::sleep_until(started + at).await;
                    if rate <= 0.0 {
                        continue;
                    }
                    while requests.try_join_next().is_some() {}
                    let tokens = sampler.tokens();
                    let request = completion(&client, &url, &stream.tenant, tokens, tokens);
                    let completions = Arc::clone(&completions);
                    let sent = at;
                    requests.spawn(async move {
                        let status = match request.send().await {
                            Ok(response) => {
                                let status = response.status().as_u16();
                                // Read to the end: the filter charges when
                                // the stream is over.
                                match response.bytes().await {
                                    Ok(_) => status,
                                    Err(_) => 0,
                                }
                            }
                            Err(_) => 0,
                        };
                        let ended = started.elapsed();
                        completions
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(Completion {
                                sent,
                                ended,
                                stream: index,
                                tokens,
                                status,
                            });
                    });
                }
                while requests.join_next().await.is_some() {}
            });
        }
        Ok(Self {
            started,
            completions,
            tasks,
            streams,
        })
    }

    /// Time since the load started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Every request that ended so far.
    pub fn completions(&self) -> Vec<Completion> {
        self.completions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits for every stream to finish sending and every request to end.
    pub async fn finish(mut self) -> Vec<Completion> {
        while self.tasks.join_next().await.is_some() {}
        self.completions()
    }
}

/// A streamed chat completion with its usage at the end, of `tenant`,
/// stating `estimate` tokens and asking the upstream for `output_tokens`.
pub fn completion(
    client: &reqwest::Client,
    url: &str,
    tenant: &str,
    estimate: u64,
    output_tokens: u64,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("x-tenant", tenant)
        .header(ESTIMATE_HEADER, estimate)
        .header(OUTPUT_TOKENS_HEADER, output_tokens)
        .json(&json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
}

/// One cell's budget through one Envoy, as `token_budget.rs` and
/// `token_claims.rs` hold it: 20,000 tokens a second written per minute,
/// offered 3x by the tenant `default` for 18 s, measured from 3 s (before
/// that the first directives are still settling).
pub mod one_cell {
    use std::time::Duration;

    use anyhow::Result;

    use super::{
        BudgetPeriod, Completion, TokenFleet, TokenFleetOptions, TokenLoad, TokenStream,
        admitted_tokens,
    };
    use crate::fleet::DataPlane;

    /// Tokens per second fleet-wide (1,200,000 a minute).
    pub const BUDGET_PER_S: f64 = 20_000.0;
    /// The offered load over the budget.
    pub const OFFERED: f64 = 3.0;
    /// How long the load runs.
    pub const LOAD: Duration = Duration::from_secs(18);
    /// Where the measured span starts.
    pub const MEASURE_FROM: Duration = Duration::from_secs(3);
    /// The tenant of the load.
    pub const TENANT: &str = "default";

    /// The fleet and its load, started with `extra_filter` (see
    /// [`TokenFleetOptions::extra_filter`]) and the load's `seed`; the
    /// URL of the Envoy's completions.
    pub async fn start(
        data_plane: DataPlane,
        extra_filter: serde_json::Value,
        seed: u64,
    ) -> Result<(TokenFleet, TokenLoad, String)> {
        let mut options = TokenFleetOptions::new(BUDGET_PER_S, 1);
        options.budget_period = BudgetPeriod::Minute;
        options.data_plane = data_plane;
        options.extra_filter = extra_filter;
        let fleet = TokenFleet::start(options).await?;
        let url = format!("{}/v1/chat/completions", fleet.fleet.url(0)?);
        let load = TokenLoad::start(
            &fleet,
            vec![TokenStream::steady(0, TENANT, OFFERED * BUDGET_PER_S)],
            LOAD,
            seed,
        )?;
        Ok((fleet, load, url))
    }

    /// The tokens admitted over the measured span (the load's and
    /// `more`), the budget's over it, and how far the first is from the
    /// second (relative).
    pub fn admitted_against_budget(completions: &[Completion], more: u64) -> (u64, f64, f64) {
        let admitted = admitted_tokens(completions, MEASURE_FROM, LOAD, |_| true) + more;
        let expected = BUDGET_PER_S * (LOAD - MEASURE_FROM).as_secs_f64();
        (admitted, expected, admitted as f64 / expected - 1.0)
    }
}

/// Tokens admitted (answered 200) among `completions` that ended in
/// `[from, to)`, of the streams `keep` selects.
pub fn admitted_tokens(
    completions: &[Completion],
    from: Duration,
    to: Duration,
    keep: impl Fn(usize) -> bool,
) -> u64 {
    admitted_tokens_at(completions, from..to, |c| c.ended, keep)
}

/// Tokens admitted (answered 200) of the requests sent in `[from, to)` by
/// the streams `keep` selects: counted by when they were decided rather
/// than by when their streams ended.
pub fn admitted_tokens_by_decision(
    completions: &[Completion],
    from: Duration,
    to: Duration,
    keep: impl Fn(usize) -> bool,
) -> u64 {
    admitted_tokens_at(completions, from..to, |c| c.sent, keep)
}

/// Tokens admitted whose instant `at` falls in `span`.
fn admitted_tokens_at(
    completions: &[Completion],
    span: std::ops::Range<Duration>,
    at: impl Fn(&Completion) -> Duration,
    keep: impl Fn(usize) -> bool,
) -> u64 {
    completions
        .iter()
        .filter(|c| c.status == 200 && span.contains(&at(c)) && keep(c.stream))
        .map(|c| c.tokens)
        .sum()
}

/// Tokens offered (sent) in `[from, to)` by the streams `keep` selects.
pub fn offered_tokens(
    completions: &[Completion],
    from: Duration,
    to: Duration,
    keep: impl Fn(usize) -> bool,
) -> u64 {
    completions
        .iter()
        .filter(|c| c.sent >= from && c.sent < to && keep(c.stream))
        .map(|c| c.tokens)
        .sum()
}

/// Requests of the streams `keep` selects that ended in `[from, to)` with
/// `status`.
pub fn requests_with_status(
    completions: &[Completion],
    from: Duration,
    to: Duration,
    status: u16,
    keep: impl Fn(usize) -> bool,
) -> u64 {
    completions
        .iter()
        .filter(|c| c.status == status && c.ended >= from && c.ended < to && keep(c.stream))
        .count() as u64
}

/// deploy/'s token-budget examples held through a proxy: the bucket `llm`
/// of deploy/base's limits file, 1,200,000 tokens a minute, in front of
/// the fake LLM upstream.
pub mod deployed {
    use std::time::Duration;

    use anyhow::{Context, Result, ensure};

    use hyper::header::HeaderName;

    use super::{OUTPUT_TOKENS_HEADER, TokenLoad, TokenStream, admitted_tokens, completion};
    use crate::control_plane::AdminClient;
    use crate::envoy::{Envoy, counter_total};
    use crate::llm_upstream::{LlmUpstream, LlmUpstreamOptions, TokenDistribution};
    use crate::load::within;
    use crate::wait;

    /// The budget, in tokens a second.
    pub const BUDGET_PER_S: f64 = 20_000.0;
    /// How long the load runs, and when its measure starts (the first
    /// directives settle before).
    const LOAD: Duration = Duration::from_secs(12);
    const MEASURE_FROM: Duration = Duration::from_secs(4);
    /// Tokens of every request of the load: one size, so what is admitted
    /// varies only with the decisions.
    const LOAD_TOKENS: u64 = 2_000;

    /// The fake LLM upstream, producing the output tokens each request
    /// asks for ([`OUTPUT_TOKENS_HEADER`]).
    pub async fn start_upstream() -> Result<LlmUpstream> {
        LlmUpstream::start(LlmUpstreamOptions {
            output_tokens_header: Some(HeaderName::from_static(OUTPUT_TOKENS_HEADER)),
            ..LlmUpstreamOptions::default()
        })
        .await
    }

    /// Through `envoy` (whose chat completions are at `url`): streamed
    /// completions are charged from the body exactly what `upstream`
    /// reported; two tenants offering 1.5x the budget each are held within
    /// ±30 % of it over 8 s, the control plane holds the budget in charged
    /// tokens, and a 429 says the unit and the window. Returns a summary.
    pub async fn holds_the_budget(
        url: &str,
        envoy: &Envoy,
        upstream: &LlmUpstream,
        admin: &AdminClient,
    ) -> Result<String> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("cannot build the HTTP client")?;
        let sizes = [40, 400, 4_000];
        for tokens in sizes {
            let response = completion(&http, url, "gold", tokens, tokens)
                .send()
                .await?;
            ensure!(
                response.status() == 200,
                "a completion of {tokens} tokens: {} {:?}",
                response.status(),
                response.headers()
            );
            response.bytes().await?;
        }
        let stats = wait::until(
            "every stream charged from its body",
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async {
                let stats = envoy.stats("sluice.source=").await?;
                let charges = counter_total(&stats, "sluice.source=body.charges");
                Ok((charges >= sizes.len() as u64).then_some(stats))
            },
        )
        .await?;
        let charged = (
            counter_total(&stats, "sluice.source=body.cost_charged"),
            counter_total(&stats, "sluice.source=estimate.charges"),
        );
        let reported = upstream.tenant("gold").usage.total();
        ensure!(
            charged == (reported, 0),
            "charged {charged:?} (from the body, estimates), the upstream reported {reported}\n{stats}"
        );

        let load = TokenLoad::start_on(
            &[url.to_owned(), url.to_owned()],
            TokenDistribution::new(LOAD_TOKENS as f64, LOAD_TOKENS as f64)?,
            vec![
                TokenStream::steady(0, "gold", 1.5 * BUDGET_PER_S),
                TokenStream::steady(0, "silver", 1.5 * BUDGET_PER_S),
            ],
            LOAD,
            7,
        )?;
        tokio::time::sleep(MEASURE_FROM).await;
        let mut policy = None;
        let mut probe_admitted = 0;
        for _ in 0..50 {
            let response = completion(&http, url, "gold", LOAD_TOKENS, LOAD_TOKENS)
                .send()
                .await?;
            if response.status() == 429 {
                policy = response
                    .headers()
                    .get("ratelimit-policy")
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                break;
            }
            response.bytes().await?;
            probe_admitted += LOAD_TOKENS;
        }
        let buckets = admin.buckets().await?;
        let completions = load.finish().await;
        let admitted = admitted_tokens(&completions, MEASURE_FROM, LOAD, |_| true) + probe_admitted;
        let expected = BUDGET_PER_S * (LOAD - MEASURE_FROM).as_secs_f64();
        let llm = buckets.buckets.iter().find(|b| b.bucket == "llm");
        let summary = format!(
            "admitted {admitted} tokens from {MEASURE_FROM:?} to {LOAD:?}, the budget's \
             {expected:.0}; a 429's ratelimit-policy: {policy:?}; the control plane: {llm:?}"
        );
        let policy = policy.with_context(|| format!("no 429 at 3x the budget\n{summary}"))?;
        ensure!(
            policy.contains(r#"qu="tokens""#) && policy.contains("w=60"),
            "{summary}"
        );
        // Held in what the streams were charged: their estimates' output
        // tokens plus the prompts' few.
        let factor = llm
            .and_then(|b| b.cost.as_ref())
            .and_then(|cost| cost.charge_factor);
        ensure!(
            factor.is_some_and(|factor| (1.0..1.2).contains(&factor)),
            "charge factor {factor:?}\n{summary}"
        );
        ensure!(
            within(admitted as f64, expected, 0.30),
            "admitted {admitted} tokens, the budget's {expected:.0}\n{summary}"
        );
        Ok(summary)
    }
}
