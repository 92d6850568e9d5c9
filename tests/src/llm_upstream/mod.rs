//! A fake LLM provider for tests, the demo and benchmarks: OpenAI's chat
//! completions, Anthropic's messages and Gemini's generateContent, each
//! streamed (SSE) or not, with token counts drawn from a seeded
//! log-normal distribution, paced chunks, mid-stream aborts and non-2xx
//! answers at configured rates; it records per tenant the usage it
//! reported, so a test can compare what a limiter charged.
//!
//! Input tokens are the request body's length / 4 (a common estimate),
//! output tokens a draw; a stream aborted midway (the connection closed
//! before the usage) and an error answer report nothing.

pub mod formats;
pub mod tokens;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::http_server;
use anyhow::{Context, Result, ensure};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use formats::{Api, Usage};
pub use tokens::{TokenDistribution, TokenSampler};

/// Content chunks a streamed response is cut into at most.
const MAX_CHUNKS: u64 = 256;
/// A request body larger than this is refused (413).
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// How the upstream answers.
#[derive(Debug, Clone)]
pub struct LlmUpstreamOptions {
    /// The output tokens' distribution.
    pub output_tokens: TokenDistribution,
    /// Seeds the draws (tokens, aborts, errors) in arrival order.
    pub seed: u64,
    /// Of the input tokens, this fraction is reported as cached.
    pub cached_ratio: f64,
    /// Output tokens per streamed chunk (at most `MAX_CHUNKS` chunks).
    pub tokens_per_chunk: u64,
    /// The pause before each content chunk of a stream (a slow model).
    pub chunk_interval: Duration,
    /// Fraction of streams cut midway: the connection closes before the
    /// usage is sent.
    pub abort_rate: f64,
    /// Fraction of requests answered `error_status` with no usage.
    pub error_rate: f64,
    /// The status of those answers.
    pub error_status: StatusCode,
    /// A request carrying this header (any value) is cut midway if
    /// streamed, whatever `abort_rate` draws: a test picks its aborts.
    pub abort_header: Option<HeaderName>,
    /// A request carrying this header with a whole number gets that many
    /// output tokens instead of a draw (capped at the distribution's
    /// maximum): a load generator that draws each request's cost itself,
    /// like a client whose `max_tokens` the model uses up, so a benchmark
    /// can hand the filter an exact estimate. The draw is still made, so
    /// the seeded sequence of everything else does not change.
    pub output_tokens_header: Option<HeaderName>,
    /// The request header naming the tenant (`anonymous` without it).
    pub tenant_header: HeaderName,
    /// If set, every answer that reports usage also carries its total
    /// tokens in this response header (no provider does; a gateway in
    /// front of one may).
    pub usage_header: Option<HeaderName>,
}

impl Default for LlmUpstreamOptions {
    fn default() -> Self {
        Self {
            // Median 500, p99 8,000: the issue's benchmark shape.
            output_tokens: TokenDistribution::median_500_p99_8000(),
            seed: 1,
            cached_ratio: 0.0,
            tokens_per_chunk: 16,
            chunk_interval: Duration::ZERO,
            abort_rate: 0.0,
            error_rate: 0.0,
            error_status: StatusCode::SERVICE_UNAVAILABLE,
            abort_header: None,
            output_tokens_header: None,
            tenant_header: HeaderName::from_static("x-tenant"),
            usage_header: None,
        }
    }
}

/// What the upstream did for one tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantRecord {
    /// Requests received.
    pub requests: u64,
    /// Of those, answered in full with their usage.
    pub reported: u64,
    /// Answered in full without usage (an OpenAI stream without
    /// `include_usage`).
    pub unreported: u64,
    /// Streams cut midway.
    pub aborted: u64,
    /// Answered with the error status (or a bad request).
    pub errors: u64,
    /// The usage reported, summed.
    pub usage: Usage,
    /// Output tokens generated but never reported (aborted streams and
    /// streams without usage): what a provider would still bill.
    pub unreported_output: u64,
}

#[derive(Debug)]
struct State {
    options: LlmUpstreamOptions,
    sampler: TokenSampler,
    next_id: u64,
    tenants: HashMap<String, TenantRecord>,
}

/// A running fake provider on a loopback port; dropping it stops it.
#[derive(Debug)]
pub struct LlmUpstream {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl LlmUpstream {
    /// Listens on a free loopback port.
    pub async fn start(options: LlmUpstreamOptions) -> Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), options).await
    }

    /// Listens on `listen` (port 0: a free one).
    pub async fn start_on(listen: SocketAddr, options: LlmUpstreamOptions) -> Result<Self> {
        for (name, rate) in [
            ("abort_rate", options.abort_rate),
            ("error_rate", options.error_rate),
            ("cached_ratio", options.cached_ratio),
        ] {
            ensure!(
                (0.0..=1.0).contains(&rate),
                "{name}: {rate} is not within [0, 1]"
            );
        }
        ensure!(
            !options.error_status.is_success(),
            "error_status: {} is a success",
            options.error_status
        );
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot bind the LLM upstream to {listen}"))?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            sampler: TokenSampler::new(options.output_tokens, options.seed),
            options,
            next_id: 0,
            tenants: HashMap::new(),
        }));
        let accept = {
            let state = Arc::clone(&state);
            tokio::spawn(http_server::serve(listener, move |request| {
                answer(Arc::clone(&state), request)
            }))
        };
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    /// Where requests go.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it did for `tenant` so far.
    pub fn tenant(&self, tenant: &str) -> TenantRecord {
        lock(&self.state)
            .tenants
            .get(tenant)
            .copied()
            .unwrap_or_default()
    }

    /// What it did for every tenant so far.
    pub fn tenants(&self) -> HashMap<String, TenantRecord> {
        lock(&self.state).tenants.clone()
    }
}

impl Drop for LlmUpstream {
    fn drop(&mut self) {
        // The accept task owns the connections: aborting it ends them.
        self.accept.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"message": message, "type": "server_error"}});
    full(status, "application/json", body.to_string())
}

/// The request as the upstream reads it.
#[derive(Debug)]
struct Asked {
    api: Api,
    stream: bool,
    include_usage: bool,
    model: String,
    input: u64,
}

fn read_request(path: &str, query: Option<&str>, body: &[u8]) -> Result<Asked, String> {
    let api = if path == "/v1/chat/completions" {
        Api::OpenAi
    } else if path == "/v1/messages" {
        Api::Anthropic
    } else if path.starts_with("/v1beta/models/")
        && (path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent"))
    {
        Api::Gemini
    } else {
        return Err(format!("no API at {path}"));
    };
    let json: serde_json::Value =
        serde_json::from_slice(body).map_err(|err| format!("the body is not JSON: {err}"))?;
    let flag = |pointer: &str| json.pointer(pointer).and_then(serde_json::Value::as_bool);
    let (stream, model) = match api {
        Api::Gemini => {
            let model = path
                .trim_start_matches("/v1beta/models/")
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned();
            // Gemini streams SSE with `alt=sse` (JSON arrays otherwise:
            // not served).
            let sse = query.is_some_and(|q| q.split('&').any(|pair| pair == "alt=sse"));
            if path.ends_with(":streamGenerateContent") && !sse {
                return Err("streamGenerateContent is served with alt=sse only".to_owned());
            }
            (sse, model)
        }
        _ => (
            flag("/stream").unwrap_or(false),
            json.get("model")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("fake-model")
                .to_owned(),
        ),
    };
    Ok(Asked {
        api,
        stream,
        include_usage: api != Api::OpenAi || flag("/stream_options/include_usage") == Some(true),
        model,
        input: u64::try_from(body.len() / 4).unwrap_or(u64::MAX).max(1),
    })
}

/// What was drawn for one request.
struct Drawn {
    id: u64,
    usage: Usage,
    error: bool,
    abort: bool,
}

async fn answer(
    state: Arc<Mutex<State>>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let options = lock(&state).options.clone();
    let tenant = parts
        .headers
        .get(&options.tenant_header)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned();
    record(&state, &tenant, |r| r.requests += 1);
    let body = match http_body_util::Limited::new(body, MAX_REQUEST_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(err) => {
            record(&state, &tenant, |r| r.errors += 1);
            return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, &err.to_string()));
        }
    };
    let asked = match read_request(parts.uri.path(), parts.uri.query(), &body) {
        Ok(asked) => asked,
        Err(message) => {
            record(&state, &tenant, |r| r.errors += 1);
            return Ok(error(StatusCode::BAD_REQUEST, &message));
        }
    };
    let drawn = {
        let mut state = lock(&state);
        let drawn_output = state.sampler.tokens();
        let output = options
            .output_tokens_header
            .as_ref()
            .and_then(|name| parts.headers.get(name))
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
            .map_or(drawn_output, |asked| asked.min(tokens::MAX_TOKENS));
        let error = state.sampler.chance(options.error_rate);
        let asked_to_abort = options
            .abort_header
            .as_ref()
            .is_some_and(|name| parts.headers.contains_key(name));
        let abort = asked.stream && (state.sampler.chance(options.abort_rate) || asked_to_abort);
        state.next_id += 1;
        let cached_input = (asked.input as f64 * options.cached_ratio).floor() as u64;
        Drawn {
            id: state.next_id,
            usage: Usage {
                input: asked.input,
                cached_input: cached_input.min(asked.input),
                output,
            },
            error,
            abort,
        }
    };
    if drawn.error {
        record(&state, &tenant, |r| r.errors += 1);
        return Ok(error(options.error_status, "the fake upstream's error"));
    }
    let usage = drawn.usage;
    let mut response = if asked.stream {
        stream(&state, &tenant, &options, &asked, &drawn)
    } else {
        record(&state, &tenant, |r| {
            r.reported += 1;
            r.usage.add(usage);
        });
        let body = formats::json_body(asked.api, drawn.id, &asked.model, usage);
        full(StatusCode::OK, "application/json", body.to_string())
    };
    let reports = !drawn.abort && asked.include_usage;
    if let (Some(name), true) = (&options.usage_header, reports) {
        response
            .headers_mut()
            .insert(name.clone(), HeaderValue::from(usage.total()));
    }
    Ok(response)
}

/// A streamed answer: its events sent as they are due; recorded when
/// their last byte is handed to the connection (or when it is cut).
fn stream(
    state: &Arc<Mutex<State>>,
    tenant: &str,
    options: &LlmUpstreamOptions,
    asked: &Asked,
    drawn: &Drawn,
) -> Response<Body> {
    let chunks = formats::chunk_sizes(drawn.usage.output, options.tokens_per_chunk, MAX_CHUNKS);
    let sse = formats::sse_body(
        asked.api,
        drawn.id,
        &asked.model,
        drawn.usage,
        &chunks,
        asked.include_usage,
    );
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    let interval = options.chunk_interval;
    let abort = drawn.abort;
    let usage = drawn.usage;
    let include_usage = asked.include_usage;
    let state = Arc::clone(state);
    let tenant = tenant.to_owned();
    // Ends with the response: a client gone makes `send` fail.
    tokio::spawn(async move {
        let frame = |event: String| Ok(Frame::data(Bytes::from(event)));
        for event in sse.head {
            if sender.send(frame(event)).await.is_err() {
                return;
            }
        }
        let cut_at = if abort {
            sse.content.len() / 2
        } else {
            usize::MAX
        };
        for (i, event) in sse.content.into_iter().enumerate() {
            if i == cut_at {
                break;
            }
            tokio::time::sleep(interval).await;
            if sender.send(frame(event)).await.is_err() {
                return;
            }
        }
        if abort {
            record(&state, &tenant, |r| {
                r.aborted += 1;
                r.unreported_output += usage.output;
            });
            let _ = sender
                .send(Err(std::io::Error::other(
                    "the fake upstream cut the stream",
                )))
                .await;
            return;
        }
        for event in sse.tail {
            if sender.send(frame(event)).await.is_err() {
                return;
            }
        }
        record(&state, &tenant, |r| {
            if include_usage {
                r.reported += 1;
                r.usage.add(usage);
            } else {
                r.unreported += 1;
                r.unreported_output += usage.output;
            }
        });
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
    let mut response = Response::new(BodyExt::boxed(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

fn record(state: &Mutex<State>, tenant: &str, update: impl FnOnce(&mut TenantRecord)) {
    let mut state = lock(state);
    let record = state.tenants.entry(tenant.to_owned()).or_default();
    update(record);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    fn options() -> LlmUpstreamOptions {
        LlmUpstreamOptions {
            output_tokens: TokenDistribution::new(40.0, 400.0).unwrap(),
            seed: 11,
            tokens_per_chunk: 4,
            ..LlmUpstreamOptions::default()
        }
    }

    async fn post(
        upstream: &LlmUpstream,
        path: &str,
        tenant: &str,
        body: serde_json::Value,
    ) -> (u16, String) {
        let response = reqwest::Client::new()
            .post(format!("{}{path}", upstream.base_url()))
            .header("x-tenant", tenant)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// The `data:` values of an SSE body.
    fn events(body: &str) -> Vec<serde_json::Value> {
        body.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_request_can_name_its_output_tokens() {
        let upstream = LlmUpstream::start(LlmUpstreamOptions {
            output_tokens_header: Some(HeaderName::from_static("x-output-tokens")),
            ..options()
        })
        .await
        .unwrap();
        let chat = serde_json::json!({"model": "m", "messages": [], "stream": false});
        let ask = |tokens: &'static str| {
            reqwest::Client::new()
                .post(format!("{}/v1/chat/completions", upstream.base_url()))
                .header("x-output-tokens", tokens)
                .json(&chat)
                .send()
        };
        let json: serde_json::Value = ask("1234").await.unwrap().json().await.unwrap();
        assert_eq!(json["usage"]["completion_tokens"], 1234);
        // Not a number: the draw, as without the header.
        let json: serde_json::Value = ask("many").await.unwrap().json().await.unwrap();
        assert!(json["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
        assert_eq!(
            upstream.tenant("anonymous").usage.output,
            1234 + json["usage"]["completion_tokens"].as_u64().unwrap()
        );
    }

    #[tokio::test]
    async fn every_api_reports_the_usage_it_records() {
        let upstream = LlmUpstream::start(options()).await.unwrap();
        let chat = serde_json::json!({"model": "m", "messages": [], "stream": false});
        let (status, body) = post(&upstream, "/v1/chat/completions", "a", chat).await;
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut total = json["usage"]["total_tokens"].as_u64().unwrap();

        let streamed = serde_json::json!({"model": "m", "stream": true,
            "stream_options": {"include_usage": true}});
        let (status, body) = post(&upstream, "/v1/chat/completions", "a", streamed).await;
        assert_eq!(status, 200);
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        let last = events(&body).pop().unwrap();
        total += last["usage"]["total_tokens"].as_u64().unwrap();

        let messages = serde_json::json!({"model": "claude", "stream": true});
        let (_, body) = post(&upstream, "/v1/messages", "a", messages).await;
        let events = events(&body);
        let input = events[0]["message"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap();
        let delta = events
            .iter()
            .rfind(|e| e["type"] == "message_delta")
            .unwrap();
        total += input + delta["usage"]["output_tokens"].as_u64().unwrap();

        let (status, body) = post(
            &upstream,
            "/v1beta/models/gemini:streamGenerateContent?alt=sse",
            "a",
            serde_json::json!({"contents": []}),
        )
        .await;
        assert_eq!(status, 200);
        let last = super::tests::events(&body).pop().unwrap();
        total += last["usageMetadata"]["totalTokenCount"].as_u64().unwrap();

        let record = upstream.tenant("a");
        assert_eq!(record.requests, 4);
        assert_eq!(record.reported, 4);
        assert_eq!(record.usage.total(), total, "{record:?}");
        assert_eq!(upstream.tenant("b"), TenantRecord::default());
    }

    /// Sluice's usage parser, fed each response as it arrives (chunk by
    /// chunk off the socket), reads exactly what the upstream recorded,
    /// for every API, streamed or not.
    #[tokio::test]
    async fn the_filters_usage_parser_reads_what_every_api_reported() {
        use sluice_agent::usage::{Format, Outcome, UsageParser};

        let upstream = LlmUpstream::start(LlmUpstreamOptions {
            cached_ratio: 0.25,
            chunk_interval: Duration::from_millis(1),
            ..options()
        })
        .await
        .unwrap();
        let http = reqwest::Client::new();
        let cases = [
            (
                "/v1/chat/completions",
                r#"{"stream":false}"#,
                Format::OpenAiJson,
            ),
            (
                "/v1/chat/completions",
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
                Format::OpenAiSse,
            ),
            ("/v1/messages", r#"{"stream":false}"#, Format::AnthropicJson),
            ("/v1/messages", r#"{"stream":true}"#, Format::AnthropicSse),
            ("/v1beta/models/g:generateContent", "{}", Format::GeminiJson),
            (
                "/v1beta/models/g:streamGenerateContent?alt=sse",
                "{}",
                Format::GeminiSse,
            ),
        ];
        for (i, (path, body, format)) in cases.into_iter().enumerate() {
            let tenant = format!("t{i}");
            let mut response = http
                .post(format!("{}{path}", upstream.base_url()))
                .header("x-tenant", &tenant)
                .body(format!("{body}{}", " ".repeat(400)))
                .send()
                .await
                .unwrap();
            let mut parser = UsageParser::new(1024);
            while let Some(chunk) = response.chunk().await.unwrap() {
                parser.feed(&chunk);
            }
            let reported = upstream.tenant(&tenant).usage;
            let Outcome::Usage(usage, read_as) = parser.outcome() else {
                panic!("{path}: {:?}", parser.outcome());
            };
            assert_eq!(read_as, format, "{path} {body}");
            assert_eq!(
                (usage.input, usage.cached_input, usage.output, usage.total),
                (
                    reported.input,
                    reported.cached_input,
                    reported.output,
                    reported.total()
                ),
                "{path} {body}"
            );
            assert!(reported.cached_input > 0);
        }
    }

    #[tokio::test]
    async fn a_stream_without_include_usage_reports_nothing() {
        let upstream = LlmUpstream::start(options()).await.unwrap();
        let streamed = serde_json::json!({"model": "m", "stream": true});
        let (status, body) = post(&upstream, "/v1/chat/completions", "a", streamed).await;
        assert_eq!(status, 200);
        assert!(events(&body).iter().all(|e| e.get("usage").is_none()));
        let record = upstream.tenant("a");
        assert_eq!((record.reported, record.unreported), (0, 1));
        assert_eq!(record.usage, Usage::default());
        assert!(record.unreported_output > 0);
    }

    #[tokio::test]
    async fn aborts_and_errors_come_at_their_rates_and_report_nothing() {
        let upstream = LlmUpstream::start(LlmUpstreamOptions {
            abort_rate: 1.0,
            ..options()
        })
        .await
        .unwrap();
        let streamed =
            serde_json::json!({"stream": true, "stream_options": {"include_usage": true}});
        let response = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", upstream.base_url()))
            .json(&streamed)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.bytes().await.is_err(), "the body is cut");
        let record = upstream.tenant("anonymous");
        assert_eq!((record.aborted, record.reported), (1, 0));
        assert_eq!(record.usage, Usage::default());

        // Aborts picked by a request header.
        let picked = LlmUpstream::start(LlmUpstreamOptions {
            abort_header: Some(HeaderName::from_static("x-abort")),
            ..options()
        })
        .await
        .unwrap();
        for abort in [false, true] {
            let mut request = reqwest::Client::new()
                .post(format!("{}/v1/messages", picked.base_url()))
                .json(&serde_json::json!({"stream": true}));
            if abort {
                request = request.header("x-abort", "1");
            }
            let body = request.send().await.unwrap().bytes().await;
            assert_eq!(body.is_err(), abort);
        }
        let record = picked.tenant("anonymous");
        assert_eq!((record.aborted, record.reported), (1, 1));

        let failing = LlmUpstream::start(LlmUpstreamOptions {
            error_rate: 1.0,
            error_status: StatusCode::TOO_MANY_REQUESTS,
            ..options()
        })
        .await
        .unwrap();
        let (status, _) = post(&failing, "/v1/messages", "a", serde_json::json!({})).await;
        assert_eq!(status, 429);
        assert_eq!(failing.tenant("a").errors, 1);
        // Bad requests: unknown path, not JSON.
        let (status, _) = post(&failing, "/v2/nothing", "a", serde_json::json!({})).await;
        assert_eq!(status, 400);
        assert_eq!(failing.tenant("a").errors, 2);
    }

    #[tokio::test]
    async fn chunks_are_paced_and_the_usage_header_is_set_when_asked() {
        let upstream = LlmUpstream::start(LlmUpstreamOptions {
            output_tokens: TokenDistribution::new(20.0, 20.0).unwrap(),
            tokens_per_chunk: 5,
            chunk_interval: Duration::from_millis(50),
            usage_header: Some(HeaderName::from_static("x-usage-total")),
            ..options()
        })
        .await
        .unwrap();
        let started = std::time::Instant::now();
        let response = reqwest::Client::new()
            .post(format!("{}/v1/messages", upstream.base_url()))
            .json(&serde_json::json!({"stream": true}))
            .send()
            .await
            .unwrap();
        let header = response.headers()["x-usage-total"]
            .to_str()
            .unwrap()
            .to_owned();
        response.bytes().await.unwrap();
        // Four chunks of 5, each after 50 ms.
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(
            header,
            upstream.tenant("anonymous").usage.total().to_string()
        );
    }

    #[tokio::test]
    async fn bad_options_are_refused_with_the_field() {
        let err = LlmUpstream::start(LlmUpstreamOptions {
            abort_rate: 1.5,
            ..options()
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("abort_rate"), "{err}");
        let err = LlmUpstream::start(LlmUpstreamOptions {
            error_status: StatusCode::OK,
            ..options()
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("error_status"), "{err}");
    }
}
